"""torch.distributed backend "braid": collectives on CPU tensors over Braid.

``import braid_torch`` registers the backend, so that
``torch.distributed.init_process_group("braid")`` (or ``"cpu:braid,cuda:nccl"``)
works under torchrun, mp.spawn or Slurm. Ranks meet through torch's Store:
rank 0 makes the Braid unique id and the others read it there.
"""

import torch
import torch.distributed as dist

from . import _C  # noqa: E402  (needs torch's c10d types loaded first)

__all__ = ["BraidBackend", "all_reduce_", "braid_version", "status", "recorder"]

BraidBackend = _C.BraidBackend


def braid_version() -> int:
    """ncclGetVersion of the Braid this package was built against."""
    return _C.version()


def all_reduce_(tensor, op="sum", group=None):
    """all_reduce of a CPU tensor in place, done when it returns, with no
    Work: what CPU inference stacks call per layer (DeepSpeed's
    inference_all_reduce). `op` is "sum", "avg", "product", "min" or "max";
    `group` a process group whose CPU backend is braid (the default group
    when None). In issue order with the group's other ops. A torch op,
    torch.ops.braid.all_reduce_(tensor, op, group_name)."""
    g = group if group is not None else dist.group.WORLD
    return _all_reduce_op(tensor, op, g.group_name)


# looked up once: torch.ops' attribute chain costs about 0.15 us a call
_all_reduce_op = torch.ops.braid.all_reduce_


def _backend(group):
    g = group if group is not None else dist.group.WORLD
    b = g._get_backend(torch.device("cpu"))
    if not isinstance(b, BraidBackend):
        raise ValueError("braid: the group's CPU backend is not braid")
    return b


def status(group=None, format="text"):
    """What the group's job is doing, as the braid-status command tells it:
    every rank's flight recorder gathered over the group's own channels,
    the verdict first ("rank 5 has not called all_reduce #1042; ..."), then
    a table of the ranks. `format` is "text", "json" (every rank's recorder
    and the verdict, JSON lines) or "prometheus". Takes about half a second;
    callable while other threads wait in the group's calls."""
    return _backend(group).status(format)


def recorder(group=None):
    """This rank's flight recorder for the group as JSON lines: its last
    calls with their sizes, times and links (what it writes to
    BRAID_TRACE_DIR when it fails)."""
    return _backend(group).recorder()


def _library_loop(tensor, iters, group=None):
    """For perf/ scripts: `iters` sum all-reduces of a CPU tensor in place
    on the group's comm, back to back with no torch or Python between them:
    the library's own seconds per call, measured in this process at the
    same moment as the torch calls it is compared with."""
    return _backend(group)._library_loop(tensor, iters)


def _create_backend(store, group_rank, group_size, timeout):
    return _C.create_backend(store, group_rank, group_size, timeout)


if "braid" not in dist.Backend.backend_list:
    dist.Backend.register_backend("braid", _create_backend, devices=["cpu"])

# Braid records every call of a group itself (recorder(), status(), and the
# trace it writes when a call fails), as gloo does: torch attaches its own
# flight-recorder hook only to groups whose backends do not, and that hook
# took a third of a small all_reduce's time (a Python stack captured per
# op). The set is torch's answer to "does this backend record itself"
# (torch 2.15; absent before, when no hook was attached).
_self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
if isinstance(_self_recording, set):
    _self_recording.add("braid")
