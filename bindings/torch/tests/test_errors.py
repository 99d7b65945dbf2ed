"""What cannot be done fails with the op's name; a dead or stuck peer
becomes an error on every rank within the process group's timeout."""

import os
import signal
import time

import torch
import torch.distributed as dist

import world


def _refusals(rank, n):
    msgs = {}

    def expect(name, fn):
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            msgs[name] = str(e)
        else:
            msgs[name] = None

    expect("bxor float", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR))
    expect("band reduce_scatter", lambda: dist.reduce_scatter_tensor(
        torch.empty(2, dtype=torch.int32), torch.ones(2 * n, dtype=torch.int32),
        op=dist.ReduceOp.BAND))
    expect("avg bool", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool),
                                               op=dist.ReduceOp.AVG))
    expect("max complex", lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64),
                                                  op=dist.ReduceOp.MAX))
    expect("bad root", lambda: dist.broadcast(torch.ones(3), src=n + 5))
    expect("wrong output size", lambda: dist.all_gather_into_tensor(torch.empty(5), torch.ones(3)))
    expect("uneven split", lambda: dist.all_to_all_single(
        torch.empty(4), torch.ones(4), input_split_sizes=[1] * (n - 1) + [4 - (n - 1) - 1]))
    # the group still works after every refusal
    t = torch.ones(3)
    dist.all_reduce(t)
    return msgs, float(t[0])


def test_unsupported_names_the_op():
    n = 2
    for msgs, total in world.run(_refusals, n):
        assert total == n
        want = {
            "bxor float": "all_reduce does not support ReduceOp.BXOR",
            "band reduce_scatter": "reduce_scatter_tensor does not support ReduceOp.BAND",
            "avg bool": "all_reduce does not support ReduceOp.AVG",
            "max complex": "all_reduce",
            "bad root": "broadcast",
            "wrong output size": "all_gather_into_tensor",
            "uneven split": "all_to_all_single",
        }
        for k, text in want.items():
            assert msgs[k] is not None, f"{k}: no error"
            assert text in msgs[k], f"{k}: {msgs[k]!r} does not say {text!r}"


def _peer_dies(rank, n):
    x = torch.ones(1 << 16)
    dist.all_reduce(x)  # connections up
    dist.barrier()
    if rank == 1:
        os._exit(3)  # leaves without a word
    time.sleep(0.2)
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        return str(e)
    return None


def test_dead_peer_is_an_error_on_every_rank():
    res = world.run(_peer_dies, 3, timeout_s=60, expect_exit=(1,))
    for r in (0, 2):
        assert res[r] is not None, f"rank {r}: all_reduce with a dead peer succeeded"
        assert "all_reduce" in res[r], res[r]


def _peer_stuck(rank, n):
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    if rank == 1:
        store.set("pid1", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)  # stuck: alive, its sockets open, silent
        return None
    work = dist.all_reduce(torch.ones(100), async_op=True)
    msg = None
    try:
        work.wait()
    except RuntimeError as e:
        msg = str(e)
    if rank == 0:  # the stopped rank never reports: end it
        os.kill(int(store.get("pid1")), signal.SIGKILL)
    return msg


def test_stuck_peer_times_out_on_every_rank():
    # the group's timeout (3 s) bounds the wait
    res = world.run(_peer_stuck, 3, timeout_s=3, wall_s=60, expect_exit=(1,))
    for r in (0, 2):
        assert res[r] is not None, f"rank {r}: no error"
        assert "all_reduce" in res[r], res[r]
        # the status taken before the abort names the stopped rank
        assert "rank 1 does not answer" in res[r], res[r]
        assert "is stopped (SIGSTOP?)" in res[r], res[r]


def _peer_never_calls(rank, n):
    dist.barrier()
    if rank == 1:  # busy elsewhere past the others' timeout: it never calls
        time.sleep(6)
        return None
    try:
        dist.all_reduce(torch.ones(100))
    except RuntimeError as e:
        return str(e)
    return None


def test_timeout_names_the_rank_that_never_called():
    res = world.run(_peer_never_calls, 3, timeout_s=3, wall_s=60)
    for r in (0, 2):
        assert res[r] is not None, f"rank {r}: no error"
        assert "rank 1 has not called all_reduce #" in res[r], res[r]
        assert "ranks 0, 2 have waited" in res[r], res[r]


def _unmatched_send_to_self(rank, n):
    w = dist.isend(torch.ones(8), rank)  # its receive never comes
    try:
        w.wait()
    except RuntimeError as e:
        return str(e)
    return None


def test_unmatched_send_to_self_times_out():
    # held for its partner, bounded by the group's timeout (2 s) like any op
    t0 = time.monotonic()
    res = world.run(_unmatched_send_to_self, 2, timeout_s=2, wall_s=60)
    assert time.monotonic() - t0 < 30
    for r, msg in enumerate(res):
        assert msg is not None, f"rank {r}: an unmatched send to self succeeded"
        assert "send to self" in msg and "timed out" in msg, msg
