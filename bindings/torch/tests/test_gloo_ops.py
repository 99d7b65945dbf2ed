"""The two ops gloo has beyond NCCL's, on braid: all_reduce of sparse COO
tensors (SUM) and monitored_barrier (rank 0 names the ranks that did not
come; the others learn it at once instead of waiting out the group's
timeout). Where one rank's part fails, every rank's call fails."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import world


def _sparse_input(rank):
    """Rank r's entries: some shared with every rank, some its own, a dense
    trailing dimension; rank 1 has none at all."""
    if rank == 1:
        return torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long),
                                       torch.empty(0, 3), (5, 4, 3))
    idx = torch.tensor([[0, 4, rank % 5, 2], [1, 3, rank % 4, 2]])
    val = torch.arange(12, dtype=torch.float32).reshape(4, 3) * (rank + 1) + 0.1 * rank
    return torch.sparse_coo_tensor(idx, val, (5, 4, 3))


def _sparse(rank, n):
    t = _sparse_input(rank)
    dist.all_reduce(t)
    refused = None
    try:
        dist.all_reduce(_sparse_input(rank), op=dist.ReduceOp.MAX)
    except (RuntimeError, ValueError) as e:
        refused = str(e)
    empty = torch.sparse_coo_tensor(torch.empty(1, 0, dtype=torch.long), torch.empty(0), (7,))
    dist.all_reduce(empty)
    return t.to_dense(), refused, empty._nnz()


def test_sparse_all_reduce_sums_every_rank_entries():
    n = 3
    want = sum(_sparse_input(r).to_dense() for r in range(n))
    res = world.run(_sparse, n)
    for dense, refused, empty_nnz in res:
        assert torch.allclose(dense, want), (dense - want).abs().max()
        assert torch.equal(dense, res[0][0]), "ranks differ"
        assert refused is not None and "sparse" in refused and "SUM" in refused, refused
        assert empty_nnz == 0


def _bad_sparse(rank, n, case):
    """One rank's input is bad (case "range": an index past its size;
    "shape": another shape than the others'): every rank must raise the
    same error, naming that rank; none may return a sum."""
    if case == "range":
        idx = torch.tensor([[0, 9 if rank == 1 else 2]])
        shape = (5,)
    else:
        idx = torch.tensor([[7 if rank == 0 else 1]])
        shape = (10 if rank == 0 else 5,)
    t = torch.sparse_coo_tensor(idx, torch.ones(idx.size(1)), shape, check_invariants=False)
    try:
        dist.all_reduce(t)
        return "returned"
    except RuntimeError as e:
        return str(e)


def test_sparse_all_reduce_fails_on_every_rank_alike():
    for case, culprit in (("range", "rank 1's indices lie outside"), ("shape", "rank 1's tensor is")):
        res = world.run(_bad_sparse, 2, case, timeout_s=20, wall_s=60)
        for r, said in enumerate(res):
            assert culprit in said, (case, r, said)
        assert res[0] == res[1], (case, res)


def _barrier(group=None, timeout=None, wait_all_ranks=False):
    """dist.monitored_barrier; where torch's Python still refuses any backend
    but gloo (torch 2.4), the group's own method, which reaches braid."""
    try:
        return dist.monitored_barrier(group, timeout, wait_all_ranks)
    except ValueError as e:
        if "only implemented for GLOO" not in str(e):
            raise
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    pg = group or dist.distributed_c10d._get_default_group()
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _monitored(rank, n):
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except RuntimeError as e:
            out[name] = str(e)

    t = timedelta(seconds=20)
    attempt("all come", lambda: _barrier(timeout=t))
    attempt("all come, wait all", lambda: _barrier(timeout=t, wait_all_ranks=True))
    sub = dist.new_group(ranks=[0, 1])
    # rank 2 is not in the subgroup: a no-op for it
    attempt("subgroup", lambda: _barrier(sub, timeout=t))
    dist.barrier()
    # from here on rank 1 stays away; after each failure the ranks that took
    # part never call again, so no call meets another's keys
    short = timedelta(seconds=1)
    if rank != 1:
        attempt("rank 1 missing", lambda: _barrier(timeout=short))
    if rank == 0:
        attempt("ranks 1, 2 missing", lambda: _barrier(timeout=short, wait_all_ranks=True))
        attempt("no time", lambda: _barrier(timeout=timedelta(seconds=0)))
    return out


def test_monitored_barrier_names_the_missing_ranks():
    n = 3
    # a rank that waited out the group's 60 s timeout would miss wall_s
    res = world.run(_monitored, n, timeout_s=60, wall_s=40)
    for r in range(n):
        for k in ("all come", "all come, wait all", "subgroup"):
            assert res[r][k] == "ok", (r, k, res[r][k])
    assert "Rank 1 failed to pass monitoredBarrier" in res[0]["rank 1 missing"]
    assert "Ranks 1, 2 failed to pass monitoredBarrier" in res[0]["ranks 1, 2 missing"]
    assert "Rank 0 timed out in monitoredBarrier" in res[0]["no time"]
    said = res[2]["rank 1 missing"]
    assert "Rank 2 successfully reached monitoredBarrier" in said, said
    assert "Rank 1 failed" in said, said  # rank 0's verdict travels to the others


def _late_rank0(rank, n):
    """Rank 0 comes after the others have given up on it (the group's
    timeout, 2 s): it must fail too, not pass."""
    if rank == 0:
        time.sleep(4)
    try:
        _barrier(timeout=timedelta(seconds=20))
        return "passed"
    except RuntimeError as e:
        return str(e)


def test_monitored_barrier_late_rank0_fails_everywhere():
    res = world.run(_late_rank0, 3, timeout_s=2, wall_s=40)
    assert "gave up on rank 0" in res[0] and "before rank 0 came" in res[0], res[0]
    for r in (1, 2):
        assert "successfully reached monitoredBarrier" in res[r], res[r]
