"""Builds braid_torch: the C++ extension against the torch installed in the
environment it is installed into and Braid's static library, from BRAID_HOME
(an install prefix: include/, lib/) or else the repository's own build
(../../build/lib):

    pip install ./bindings/torch
    pip install --no-build-isolation ./bindings/torch   # setuptools, wheel there
"""

import os
import sys
import sysconfig

try:
    import torch
except ImportError:
    # pip's isolated build hides the target environment's packages, and the
    # extension must be built against that environment's torch (its ABI),
    # never a fresh download: look there, behind the build's own packages.
    sys.path.append(sysconfig.get_paths()["purelib"])
    try:
        import torch
    except ImportError:
        raise SystemExit(
            f"braid_torch: no torch in {sysconfig.get_paths()['purelib']}: install torch "
            "(2.4 or later) into this environment first"
        )
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.normpath(os.path.join(here, "..", ".."))
home = os.environ.get("BRAID_HOME")
if home:
    include, lib = os.path.join(home, "include"), os.path.join(home, "lib")
else:
    include, lib = os.path.join(repo, "include"), os.path.join(repo, "build", "lib")
archive = os.path.join(lib, "libbraid.a")
if not os.path.exists(archive):
    raise SystemExit(
        f"braid_torch: {archive} not found: build Braid first (make lib) or set BRAID_HOME "
        "to an install prefix (make install PREFIX=...)"
    )

major, minor = (int(x) for x in torch.__version__.split(".")[:2])
if (major, minor) < (2, 4):
    raise SystemExit(f"braid_torch needs torch 2.4 or later, found {torch.__version__}")
print(f"braid_torch: building against torch {torch.__version__} ({os.path.dirname(torch.__file__)})")

setup(
    name="braid_torch",
    version="0.1.0",
    description="torch.distributed backend 'braid': CPU collectives over Braid",
    packages=["braid_torch"],
    ext_modules=[
        CppExtension(
            name="braid_torch._C",
            sources=[
                "csrc/module.cpp",
                "csrc/braid_backend.cpp",
                "csrc/braid_collectives.cpp",
                "csrc/braid_tables.cpp",
                "csrc/braid_work.cpp",
                "csrc/braid_queue.cpp",
                "csrc/braid_gloo_ops.cpp",
            ],
            include_dirs=[include],
            define_macros=[("BRAID_TORCH_MINOR", str(minor if major == 2 else 99))],
            # Braid linked in whole and kept private: its nccl* symbols never
            # interpose on the NCCL that torch's own libraries load.
            extra_objects=[archive],
            depends=[archive],  # relink when Braid changed
            extra_link_args=["-Wl,--exclude-libs,ALL", "-pthread"],
            extra_compile_args=["-O2"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
