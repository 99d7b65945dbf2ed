"""Run a function on N forked ranks of a "braid" process group and collect
what each rank returns or raises. Used by the package's tests."""

import multiprocessing
import os
import pickle
import tempfile
import traceback
from datetime import timedelta

import braid_torch  # noqa: F401  (registers "braid")
import torch
import torch.distributed as dist


def _rank_main(fn, rank, n, store_path, timeout_s, backend, conn, args):
    try:
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, n)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=n, timeout=timedelta(seconds=timeout_s)
        )
        out = fn(rank, n, *args)
        # plain pickle: tensors by value, not as shared memory the parent
        # would fetch from this process after it has gone
        conn.send_bytes(pickle.dumps(("ok", out)))
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
        conn.send_bytes(
            pickle.dumps(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")))
    finally:
        conn.close()
    # leave without tearing down: a test that breaks the group must not hang in destroy
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def run(fn, n, *args, timeout_s=60, wall_s=120, backend="braid", expect_exit=()):
    """fn(rank, n, *args) on n ranks; returns [result of rank 0, ...]. A rank
    that raises fails the caller with its traceback; ranks in expect_exit may
    leave early without reporting (fn kills them on purpose)."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as d:
        store_path = os.path.join(d, "store")
        procs, conns = [], []
        for r in range(n):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_rank_main,
                args=(fn, r, n, store_path, timeout_s, backend, child, args),
            )
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        results, errors = [None] * n, []
        for r, (p, c) in enumerate(zip(procs, conns)):
            got = c.poll(wall_s)
            if got:
                try:
                    status, value = pickle.loads(c.recv_bytes())
                except EOFError:
                    status, value = "gone", None
            else:
                status, value = "hung", None
            if status == "ok":
                results[r] = value
            elif r in expect_exit and status == "gone":
                pass
            elif status == "error":
                errors.append(f"rank {r}: {value}")
            else:
                errors.append(f"rank {r}: {'no result within %d s' % wall_s if status == 'hung' else 'died'}")
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        if errors:
            raise AssertionError("\n".join(errors))
        return results
