"""torch.distributed backend "braid": collectives on CPU tensors over Braid.

``import braid_torch`` registers the backend, so that
``torch.distributed.init_process_group("braid")`` (or ``"cpu:braid,cuda:nccl"``)
works under torchrun, mp.spawn or Slurm. Ranks meet through torch's Store:
rank 0 makes the Braid unique id and the others read it there.
"""

import torch
import torch.distributed as dist

from . import _C  # noqa: E402  (needs torch's c10d types loaded first)

__all__ = ["BraidBackend", "braid_version"]

BraidBackend = _C.BraidBackend


def braid_version() -> int:
    """ncclGetVersion of the Braid this package was built against."""
    return _C.version()


def _create_backend(store, group_rank, group_size, timeout):
    return _C.create_backend(store, group_rank, group_size, timeout)


if "braid" not in dist.Backend.backend_list:
    dist.Backend.register_backend("braid", _create_backend, devices=["cpu"])
