"""Every collective of backend "braid" on every dtype it moves or reduces,
checked against the answer each rank computes alone from every rank's input."""

import json

import braid_torch
import torch
import torch.distributed as dist

import world

N = 3  # odd: uneven splits, a rank in the middle of every ring

MOVED = [
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
        torch.uint32, torch.uint64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def data(rank, numel, dtype, salt=0):
    """small exact values: every sum, product, min and max below is exact"""
    x = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 3 + salt) % 5
    if dtype == torch.bool:
        return (x + rank) % 2 == 0
    if dtype.is_complex:
        return torch.complex(x.float(), (x + 1).float()).to(dtype)
    if dtype in FP8:
        return x.float().to(dtype)
    return x.to(dtype)


def reference(op, tensors):
    dt = tensors[0].dtype
    if dt in FP8:
        tensors = [t.float() for t in tensors]
    elif not (dt.is_floating_point or dt.is_complex or dt in (torch.bool, torch.int64)):
        # torch lacks arithmetic on some unsigned types: reckon in int64, wrap back
        return reference(op, [t.long() for t in tensors]).to(dt)
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op == dist.ReduceOp.SUM:
            acc = acc | t if acc.dtype == torch.bool else acc + t
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc & t if acc.dtype == torch.bool else acc * t
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, t)
        elif op == dist.ReduceOp.BAND:
            acc = acc & t
        elif op == dist.ReduceOp.BOR:
            acc = acc | t
        elif op == dist.ReduceOp.BXOR:
            acc = acc ^ t
    if op == dist.ReduceOp.AVG:
        acc = sum(t.to(torch.complex128 if t.is_complex() else torch.float64)
                  for t in tensors) / len(tensors)
    return acc


def close(got, want):
    if got.dtype in FP8:
        got = got.float()
    if want.dtype in FP8:
        want = want.float()
    if got.dtype.is_floating_point or got.dtype.is_complex:
        return torch.allclose(got.to(torch.complex128 if got.is_complex() else torch.float64),
                              want.to(torch.complex128 if got.is_complex() else torch.float64),
                              rtol=1e-2, atol=1e-2)
    if got.dtype == torch.bool:
        return torch.equal(got, want.to(torch.bool))
    return torch.equal(got.long(), want.to(got.dtype).long())


def _reductions(rank, n):
    bad = []
    numel = 1031
    cases = []
    for dt in INTS + FLOATS + FP8 + [torch.bool]:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
        if dt != torch.bool:
            ops.append(dist.ReduceOp.AVG)
        if dt in INTS or dt == torch.bool:
            ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
        for op in ops:
            cases.append((dt, op))
    cases.append((torch.complex64, dist.ReduceOp.SUM))
    cases.append((torch.complex128, dist.ReduceOp.AVG))
    for dt, op in cases:
        inputs = [data(r, numel, dt) for r in range(n)]
        want = reference(op, inputs)
        if op == dist.ReduceOp.AVG and not (dt.is_floating_point or dt.is_complex):
            want = (sum(t.long() for t in inputs) // n).to(dt)
        elif op == dist.ReduceOp.AVG:
            want = want.to(dt)
        # all_reduce
        t = inputs[rank].clone()
        dist.all_reduce(t, op=op)
        if not close(t, want):
            bad.append(f"all_reduce {op} {dt}: {t[:6].tolist()} != {want[:6].tolist()}")
        # reduce, to the last rank
        t = inputs[rank].clone()
        dist.reduce(t, dst=n - 1, op=op)
        if rank == n - 1 and not close(t, want):
            bad.append(f"reduce {op} {dt}: {t[:6].tolist()} != {want[:6].tolist()}")
        # reduce_scatter (tensor and list) where NCCL reduces
        if op not in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            big = [data(r, numel * n, dt, salt=1) for r in range(n)]
            want_rs = reference(op, big)
            if op == dist.ReduceOp.AVG and not (dt.is_floating_point or dt.is_complex):
                want_rs = (sum(b.long() for b in big) // n).to(dt)
            elif op == dist.ReduceOp.AVG:
                want_rs = want_rs.to(dt)
            mine = want_rs[rank * numel:(rank + 1) * numel]
            out = torch.empty(numel, dtype=dt)
            dist.reduce_scatter_tensor(out, big[rank].clone(), op=op)
            if not close(out, mine):
                bad.append(f"reduce_scatter_tensor {op} {dt}")
            out2 = torch.empty(numel, dtype=dt)
            dist.reduce_scatter(out2, list(big[rank].clone().chunk(n)), op=op)
            if not close(out2, mine):
                bad.append(f"reduce_scatter {op} {dt}")
    # PREMUL_SUM, a float factor and a tensor factor
    for dt in [torch.float32, torch.float64, torch.bfloat16, torch.float16]:
        for factor in (2.5, torch.tensor([0.5], dtype=dt)):
            op = dist._make_nccl_premul_sum(factor)
            t = data(rank, numel, dt).clone()
            dist.all_reduce(t, op=op)
            f = float(factor) if not torch.is_tensor(factor) else factor.item()
            want = sum(data(r, numel, dt).double() * f for r in range(n)).to(dt)
            if not close(t, want):
                bad.append(f"all_reduce PREMUL_SUM({f}) {dt}")
    return bad


def test_reductions():
    for bad in world.run(_reductions, N):
        assert not bad, "\n".join(bad)


def _movers(rank, n):
    bad = []
    numel = 517
    for dt in MOVED:
        mine = data(rank, numel, dt)
        alls = [data(r, numel, dt) for r in range(n)]
        # broadcast from each root
        for root in range(n):
            t = mine.clone()
            dist.broadcast(t, src=root)
            if not torch.equal(t.view(torch.uint8), alls[root].view(torch.uint8)):
                bad.append(f"broadcast root {root} {dt}")

        def eq(a, b):
            # compare bytes: every dtype, NaN-free
            return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

        # all_gather, list and tensor
        outs = [torch.empty(numel, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, mine)
        if not all(eq(outs[r], alls[r]) for r in range(n)):
            bad.append(f"all_gather {dt}")
        flat = torch.empty(n * numel, dtype=dt)
        dist.all_gather_into_tensor(flat, mine)
        if not eq(flat, torch.cat(alls)):
            bad.append(f"all_gather_into_tensor {dt}")
        # gather and scatter at a middle root
        root = n // 2
        outs = [torch.empty(numel, dtype=dt) for _ in range(n)] if rank == root else None
        dist.gather(mine, outs, dst=root)
        if rank == root and not all(eq(outs[r], alls[r]) for r in range(n)):
            bad.append(f"gather {dt}")
        got = torch.empty(numel, dtype=dt)
        pieces = [data(r, numel, dt, salt=2) for r in range(n)]
        dist.scatter(got, pieces if rank == root else None, src=root)
        if not eq(got, pieces[rank]):
            bad.append(f"scatter {dt}")
        # all_to_all_single, even and uneven; all_to_all with lists
        inp = torch.cat([data(rank * n + j, 4, dt) for j in range(n)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        want = torch.cat([data(j * n + rank, 4, dt) for j in range(n)])
        if not eq(out, want):
            bad.append(f"all_to_all_single {dt}")
        # rank r sends j+r+1 rows to rank j (rank 0 sends none to itself when j+r+1 hits 0: never)
        sends = [(j + rank) % 3 for j in range(n)]
        recvs = [(rank + j) % 3 for j in range(n)]
        inp = torch.cat([data(rank * 10 + j, s * 2, dt).view(s, 2) for j, s in enumerate(sends)])
        out = torch.empty(sum(recvs), 2, dtype=dt)
        dist.all_to_all_single(out, inp, output_split_sizes=recvs, input_split_sizes=sends)
        want = torch.cat([data(j * 10 + rank, recvs[j] * 2, dt).view(recvs[j], 2) for j in range(n)])
        if not eq(out, want):
            bad.append(f"all_to_all_single uneven {dt}")
        ins = [data(rank * n + j, j + 1, dt) for j in range(n)]
        outs = [torch.empty(rank + 1, dtype=dt) for _ in range(n)]
        dist.all_to_all(outs, ins)
        if not all(eq(outs[j], data(j * n + rank, rank + 1, dt)) for j in range(n)):
            bad.append(f"all_to_all {dt}")
    return bad


def test_movers():
    for bad in world.run(_movers, N):
        assert not bad, "\n".join(bad)


def _shapes(rank, n):
    """non-contiguous and empty tensors, in and out"""
    bad = []
    base = torch.arange(48, dtype=torch.float32).view(6, 8) + rank
    t = base.clone().t()  # transposed: not contiguous
    dist.all_reduce(t)
    want = sum(torch.arange(48, dtype=torch.float32).view(6, 8) + r for r in range(n)).t()
    if not torch.equal(t, want):
        bad.append("all_reduce of a transposed tensor")
    s = (torch.arange(40, dtype=torch.int64) + rank)[::3]  # strided view
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    if not torch.equal(s, (torch.arange(40) + n - 1)[::3]):
        bad.append("all_reduce of a strided view")
    big = torch.zeros(10, 10, dtype=torch.int32)
    view = big[2:5, 3:7]  # writes land inside a larger tensor, nothing outside
    view.fill_(rank + 1)
    dist.broadcast(view, src=1)
    if not (torch.all(big[2:5, 3:7] == 2) and int(big.sum()) == 2 * 12):
        bad.append("broadcast into a sub-view")
    outs = [torch.empty(4, 3, dtype=torch.float64).t() for _ in range(n)]
    dist.all_gather(outs, (torch.ones(3, 4, dtype=torch.float64) * rank))
    if not all(torch.equal(outs[r], torch.full((3, 4), float(r), dtype=torch.float64))
               for r in range(n)):
        bad.append("all_gather into transposed outputs")
    e = torch.empty(0)
    dist.all_reduce(e)
    dist.broadcast(e, src=0)
    outs = [torch.empty(0) for _ in range(n)]
    dist.all_gather(outs, e)
    dist.all_gather_into_tensor(torch.empty(0), e)
    dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0))
    dist.all_to_all_single(torch.empty(0), torch.empty(0))
    if rank == 0:
        dist.send(torch.empty(0, 5), 1)
    elif rank == 1:
        dist.recv(torch.empty(0, 5), 0)
    dist.barrier()
    return bad


def test_shapes():
    for bad in world.run(_shapes, N):
        assert not bad, "\n".join(bad)


def _coalesced(rank, n):
    bad = []
    ts = [torch.full((5,), float(rank)), torch.full((3, 3), float(rank))]
    dist.all_reduce_coalesced(ts)
    total = sum(range(n))
    if not (torch.all(ts[0] == total) and torch.all(ts[1] == total)):
        bad.append("all_reduce_coalesced")
    outs = [torch.empty(2 * n), torch.empty(3 * n, dtype=torch.int64)]
    ins = [torch.full((2,), float(rank)), torch.full((3,), rank, dtype=torch.int64)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for o, k in zip(outs, (2, 3)):
        if not torch.equal(o, torch.arange(n).repeat_interleave(k).to(o.dtype)):
            bad.append(f"all_gather_into_tensor coalesced {o}")
    outs = [torch.empty(2), torch.empty(1, dtype=torch.int64)]
    ins = [torch.ones(2 * n) * rank, torch.ones(n, dtype=torch.int64) * (rank + 1)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    if not (torch.all(outs[0] == total) and torch.all(outs[1] == total + n)):
        bad.append(f"reduce_scatter_tensor coalesced {outs}")
    return bad


def test_coalesced():
    for bad in world.run(_coalesced, N):
        assert not bad, "\n".join(bad)


def _direct_op(rank, n):
    """braid_torch.all_reduce_: in place, done at return, in issue order with
    the group's asynchronous ops, on a subgroup too; a bad op is refused."""
    import braid_torch

    x = torch.full((1000,), float(rank + 1))
    big = torch.full((1 << 18,), float(rank))
    w = dist.all_reduce(big, async_op=True)  # issued first: runs first
    braid_torch.all_reduce_(x)
    w.wait()
    y = torch.full((7,), float(rank + 1), dtype=torch.bfloat16)
    braid_torch.all_reduce_(y, op="max")
    sub = dist.new_group([0, 1])
    z = torch.ones(5)
    if rank < 2:
        braid_torch.all_reduce_(z, group=sub)
    try:
        braid_torch.all_reduce_(torch.ones(3), op="bxor")
        refused = None
    except RuntimeError as e:
        refused = str(e)
    return float(x[0]), float(big[0]), float(y[0]), float(z[0]), refused


def test_direct_all_reduce_op():
    n = 3
    for rank, (x, big, y, z, refused) in enumerate(world.run(_direct_op, n)):
        assert x == n * (n + 1) / 2 and big == sum(range(n)) and y == n
        assert z == (2.0 if rank < 2 else 1.0)
        assert refused and "bxor" in refused, refused


def _library_loop(rank, n):
    import braid_torch

    x = torch.full((1000,), float(rank + 1))
    per_call = braid_torch._library_loop(x, 3)
    try:
        braid_torch._library_loop(x, 0)
        refused = None
    except RuntimeError as e:
        refused = str(e)
    return float(x[0]), per_call, refused


def test_library_loop():
    # perf/torch_gap.py's reference: 3 sum all-reduces in place, timed
    n = 2
    for x, per_call, refused in world.run(_library_loop, n):
        assert x == 3 * n**2 and per_call > 0  # 1 + 2, then doubled twice
        assert refused and "iters" in refused, refused


def _store_barrier(name, rank, n):
    # a barrier outside Braid: a collective would show up in the status asked
    store = dist.distributed_c10d._get_default_store()
    store.set(f"{name}{rank}", "1")
    store.wait([f"{name}{r}" for r in range(n)])


def _status(rank, n):
    dist.all_reduce(torch.ones(10))
    dist.broadcast(torch.ones(10), 0)
    _store_barrier("called", rank, n)  # every rank is between calls when asked
    out = braid_torch.status(), braid_torch.status(format="json"), braid_torch.recorder()
    _store_barrier("asked", rank, n)  # and still there, answering, until all have asked
    return out


def test_status_and_recorder():
    # every rank asks at once, between calls: nobody waits, every rank answers
    res = world.run(_status, 3)
    for r in range(3):
        text, js, rec = res[r]
        assert "3 ranks: no rank waits in Braid" in text.splitlines()[0], text
        lines = [json.loads(x) for x in js.splitlines()]
        assert [x["rank"] for x in lines if "nranks" in x] == [0, 1, 2], js
        assert lines[-1]["verdict"][0].endswith("no rank waits in Braid: the job is between calls")
        own = [json.loads(x) for x in rec.splitlines()]
        assert own[0]["rank"] == r and own[0]["nranks"] == 3, rec
        ops = [x["op"] for x in own[1:]]
        assert ops[-2:] == ["all_reduce", "broadcast"], ops
        assert all(x["state"] == "done" for x in own[1:]), rec


def _hooks(rank, n):
    c10d = dist.distributed_c10d
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(4))
    hooks = getattr(c10d._world, "pg_flight_recorder_hooks", None)
    return (hasattr(c10d, "_FR_SELF_RECORDING_BACKENDS"),
            None if hooks is None else [g for g in (dist.group.WORLD, sub) if g in hooks],
            [json.loads(x).get("op") for x in braid_torch.recorder().splitlines()])


def test_records_itself():
    # Braid's own recorder has the group's calls; torch, told so, hangs no
    # flight-recorder hook of its own on the world or a subgroup
    for has_set, hooked, own in world.run(_hooks, 2):
        assert "all_reduce" in own, own
        if has_set:
            assert hooked == [], hooked
