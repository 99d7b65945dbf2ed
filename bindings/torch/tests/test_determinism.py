"""The deterministic mode through the backend (docs/determinism.md): with
BRAID_DETERMINISTIC=1 in every process, DDP's weights after some steps are
bitwise the same for any bucket size and any NCCL_ALGO; without it, the
same two runs end apart (the comparison has teeth)."""

import os

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import world


def _train(rank, n, bucket_mb):
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        # wide magnitudes: gradient sums depend on their order
        scale = 10.0 ** torch.randint(-3, 4, (32, 1), generator=g).float()
        x = torch.randn(32, 64, generator=g) * scale
        y = torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _weights(bucket_mb, algo, deterministic):
    keys = ("BRAID_DETERMINISTIC", "NCCL_ALGO")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["BRAID_DETERMINISTIC"] = "1" if deterministic else "0"
    os.environ["NCCL_ALGO"] = algo
    try:
        return world.run(_train, 3, bucket_mb)[0]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bits(t):
    return t.view(torch.int32)


def test_ddp_weights_follow_neither_buckets_nor_algorithm():
    a = _weights(0.001, "Ring", True)  # a bucket per few hundred floats
    b = _weights(25.0, "Tree", True)  # one bucket
    assert torch.equal(_bits(a), _bits(b))
    c = _weights(0.001, "Ring", False)
    d = _weights(25.0, "Tree", False)
    assert not torch.equal(_bits(c), _bits(d)), "default mode ended alike: no teeth"
