"""Point-to-point (tags, batches), groups, subgroups and splits, and the
ways torch launches ranks (torchrun, mp.spawn), with "cpu:braid" routing."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import torch
import torch.distributed as dist

import world

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
from free_port import free_port  # noqa: E402  (the repository's tool, not a package)


def _p2p(rank, n):
    bad = []
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    # blocking send/recv round a ring, odd ranks first the other way round
    out = torch.arange(10, dtype=torch.float64) + rank
    got = torch.empty(10, dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(out, nxt, tag=5)
        dist.recv(got, prv, tag=5)
    else:
        dist.recv(got, prv, tag=5)
        dist.send(out, nxt, tag=5)
    if not torch.equal(got, torch.arange(10, dtype=torch.float64) + prv):
        bad.append("send/recv ring")
    # isend/irecv with tags, in the same order on both sides
    reqs, bufs = [], []
    for tag in (1, 2, 3):
        reqs.append(dist.isend(torch.full((tag * 100,), rank * 10 + tag, dtype=torch.int32), nxt,
                               tag=tag))
        b = torch.empty(tag * 100, dtype=torch.int32)
        bufs.append(b)
        reqs.append(dist.irecv(b, prv, tag=tag))
    for r in reqs:
        r.wait()
    for tag, b in zip((1, 2, 3), bufs):
        if not torch.all(b == prv * 10 + tag):
            bad.append(f"isend/irecv tag {tag}")
    # batch_isend_irecv both ways round the ring, non-contiguous receive
    sendl = torch.full((3, 4), float(rank))
    sendr = torch.full((3, 4), float(rank) + 0.5)
    recvl = torch.empty(4, 3).t()
    recvr = torch.empty(3, 4)
    ops = [dist.P2POp(dist.isend, sendl, prv), dist.P2POp(dist.isend, sendr, nxt),
           dist.P2POp(dist.irecv, recvl, nxt), dist.P2POp(dist.irecv, recvr, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if not (torch.all(recvl == float(nxt)) and torch.all(recvr == float(prv) + 0.5)):
        bad.append("batch_isend_irecv")
    # a send to self inside a batch
    me_out, me_in = torch.ones(5) * rank, torch.empty(5)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, me_in, rank),
                                     dist.P2POp(dist.isend, me_out, rank)]):
        w.wait()
    if not torch.equal(me_in, me_out):
        bad.append("batch_isend_irecv to self")
    # to self op by op (torch 2.4 issues CPU batches so): the first waits for
    # its partner; pairs match in the order issued; a strided receive
    outs = [torch.arange(6, dtype=torch.float32) + 10 * k + rank for k in range(3)]
    ins = [torch.empty(6), torch.empty(3, 2).t(), torch.empty(6)]
    s0 = dist.isend(outs[0], rank)
    r0 = dist.irecv(ins[0], rank)
    r1 = dist.irecv(ins[1], rank)  # a receive first this time
    done_early = r1.is_completed()
    s1 = dist.isend(outs[1].view(2, 3), rank)
    s2 = dist.isend(outs[2], rank)
    dist.recv(ins[2], rank)
    for w in (s0, r0, r1, s1, s2):
        w.wait()
    if done_early:
        bad.append("a receive from self completed before its send")
    if not (torch.equal(ins[0], outs[0]) and torch.equal(ins[1].flatten(), outs[1])
            and torch.equal(ins[2], outs[2])):
        bad.append("isend/irecv to self, op by op")
    # sizes that differ fail both, and the group goes on
    s3 = dist.isend(torch.ones(4), rank)
    try:
        dist.recv(torch.empty(5), rank)
        bad.append("a 5-element receive from a 4-element send to self succeeded")
    except RuntimeError as e:
        if "16 bytes" not in str(e):
            bad.append(f"mismatched self pair: {e}")
    try:
        s3.wait()
        bad.append("the mismatched send to self succeeded")
    except RuntimeError:
        pass
    t = torch.ones(2)
    dist.all_reduce(t)
    if not torch.all(t == n):
        bad.append("all_reduce after the self p2p")
    return bad


def test_p2p():
    for bad in world.run(_p2p, 3):
        assert not bad, "\n".join(bad)


def _groups(rank, n):
    bad = []
    # new_group: a subset, and the world again
    sub = [1, 2, 3]
    g = dist.new_group(sub)
    if rank in sub:
        t = torch.ones(7) * rank
        dist.all_reduce(t, group=g)
        if not torch.all(t == sum(sub)):
            bad.append("all_reduce on new_group([1, 2, 3])")
        outs = [torch.empty(2) for _ in sub]
        dist.all_gather(outs, torch.ones(2) * rank, group=g)
        if [int(o[0]) for o in outs] != sub:
            bad.append("all_gather on a subgroup")
        b = torch.ones(3) * rank
        dist.broadcast(b, src=3, group=g)  # a global rank
        if not torch.all(b == 3):
            bad.append("broadcast from global rank 3 on a subgroup")
    # new_subgroups: pairs
    cur, subs = dist.new_subgroups(group_size=2)
    t = torch.ones(1) * rank
    dist.all_reduce(t, group=cur)
    if int(t) != (rank // 2) * 4 + 1:
        bad.append(f"new_subgroups pair all_reduce: {int(t)}")
    # split_group (ncclCommSplit), where this torch has it
    if hasattr(dist, "split_group"):
        sg = dist.split_group(split_ranks=[[0, 2], [1, 3]])
        t = torch.ones(2) * rank
        dist.all_reduce(t, group=sg)
        want = 2 if rank % 2 == 0 else 4
        if not torch.all(t == want):
            bad.append(f"split_group all_reduce: {t.tolist()} != {want}")
        # the parent still works after the split
        u = torch.ones(1)
        dist.all_reduce(u)
        if int(u) != n:
            bad.append("the world after split_group")
    return bad


def test_groups():
    for bad in world.run(_groups, 4):
        assert not bad, "\n".join(bad)


SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, torch, torch.distributed as dist
    import braid_torch
    backend = sys.argv[1]
    if os.environ.get("RANK") is None and "SLURM_PROCID" in os.environ:  # srun
        first = subprocess.check_output(
            ["scontrol", "show", "hostnames", os.environ["SLURM_STEP_NODELIST"]], text=True
        ).split()[0]
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ["SLURM_LOCALID"], MASTER_ADDR=first,
                          MASTER_PORT=sys.argv[2])
    if os.environ.get("RANK") is None:  # mp.spawn
        import torch.multiprocessing as mp

        def main(rank, n):
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(n))
            run()

    def run():
        dist.init_process_group(backend)
        n = dist.get_world_size()
        t = torch.ones(3) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        assert int(t[0]) == n * (n + 1) // 2, t
        print("ok", dist.get_rank(), dist.get_backend(), flush=True)
        dist.destroy_process_group()

    if os.environ.get("RANK") is None:  # mp.spawn
        if __name__ == "__main__":
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
            mp.spawn(main, args=(2,), nprocs=2)
    else:
        run()
    """
)


def test_torchrun_and_spawn(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("NCCL_COMM_ID", None)
    # torchrun, with the cpu:braid routing a GPU job would use; --standalone binds its store
    # on port 0 itself, so no other process can take the port first
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(script), "cpu:braid"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ok") == 2, p.stdout
    # mp.spawn
    p = subprocess.run([sys.executable, str(script), "braid", str(free_port())],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ok") == 2, p.stdout


def slurm_answers():
    """A Slurm controller that has a node up (sinfo), else why not."""
    if shutil.which("srun") is None:
        return "no srun on this machine"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo: {e}"
    states = p.stdout.split()
    if p.returncode != 0 or not any(s.startswith(("idle", "mix")) for s in states):
        return f"no Slurm node to run on (sinfo: {p.stdout.strip() or p.stderr.strip()})"
    return None


def test_slurm(tmp_path):
    # srun starts the ranks; the script takes RANK/WORLD_SIZE/MASTER_ADDR
    # from SLURM_PROCID/NTASKS/STEP_NODELIST, as Slurm jobs do
    why = slurm_answers()
    if why:
        pytest.skip(why)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("NCCL_COMM_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run(["srun", "-n", "4", "--overcommit", "--time=2", sys.executable, str(script),
                        "braid", str(free_port())],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.split("\n"))[-4:] == [f"ok {r} braid" for r in range(4)], p.stdout
