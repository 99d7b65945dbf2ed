"""PyTorch's own distributed test suite (torch.testing._internal.distributed.
distributed_test, the DistributedTest base that torch's backends run) against
the backend named by BACKEND: "braid" registered as a plugin, as out-of-tree
backends run it, or "gloo" for the comparison. Run by run_torch_suites.sh."""

import os
import tempfile

os.environ.setdefault("BACKEND", "braid")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="braid-suite-"))

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

BACKEND = os.environ["BACKEND"]
if os.environ.get("BRAID_SUITE_AS_GLOO") == "1":
    # braid under gloo's name: the tests the suite gates on the name "gloo"
    # run on braid's implementation (a comparison, not a way to use braid)
    import braid_torch  # noqa: F401
    import torch.distributed as dist

    assert BACKEND == "gloo", "BRAID_SUITE_AS_GLOO=1 needs BACKEND=gloo"
    # (as a custom backend: torch treats a GLOO-typed backend as ProcessGroupGloo)
    dist.Backend.register_backend("gloo", braid_torch._create_backend, devices=["cpu"])
elif BACKEND == "braid":
    import braid_torch  # noqa: F401  (registers "braid")

    # What braid implements, declared the way the suite asks a backend to
    # (the sets name gloo, nccl, ucc for the same features).
    DistTestCases.backend_feature["plugin"].add("braid")
    DistTestCases.backend_feature["ddp"].add("braid")
    DistTestCases.backend_feature["subgroup"].add("braid")

import torch.testing._internal.distributed.distributed_test as distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if BACKEND == "braid":
    # braid records profiler events ("braid:all_reduce", ...) as these do
    distributed_test.PROFILING_SUPPORTED_BACKENDS.append("braid")
    distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS.append("braid")
elif os.environ.get("BRAID_SUITE_AS_GLOO") == "1":
    # braid's events are named braid:..., not gloo:...: the braid run checks
    # them; here only the results are
    distributed_test.PROFILING_SUPPORTED_BACKENDS.remove("gloo")
    distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS.remove("gloo")


class TestDistBackendWithFork(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # fork, not spawn (BRAID_SUITE_START=spawn): the same tests, without
        # importing torch again in every rank of every test
        if os.environ.get("BRAID_SUITE_START", "fork") == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)



if __name__ == "__main__":
    run_tests()
