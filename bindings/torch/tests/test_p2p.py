"""Point-to-point with gloo's semantics, the same program on gloo and on
braid: each isend/irecv progresses on its own whatever order the ranks post
them in, matched by (peer, tag) in posting order; batches still go
together. Each case runs on both backends and must give the same tensors."""

import torch
import torch.distributed as dist

import world

SMALL = 1000                # floats
BIG = (9 << 20) // 4        # floats: 9 MiB, more than a shared-memory ring (4 MiB)


def _payload(frm, to, tag, n):
    return torch.arange(n, dtype=torch.float32) * (frm + 1) + 1000 * to + tag


def _every_peer(rank, n, order):
    """irecv from and isend to every other rank, in an order an ordered
    send/recv would deadlock on, then wait for all."""
    peers = [p for p in range(n) if p != rank]
    if order == "reverse":
        peers = peers[::-1]
    size = BIG if order == "sends_first_big" else SMALL
    recvs = {p: torch.zeros(size) for p in peers}
    works = []
    if order == "sends_first_big":
        works += [dist.isend(_payload(rank, p, 0, size), p) for p in peers]
        works += [dist.irecv(recvs[p], p) for p in peers]
    else:
        for p in peers:  # per peer: receive first, then send
            works.append(dist.irecv(recvs[p], p))
            works.append(dist.isend(_payload(rank, p, 0, size), p))
    for w in works:
        w.wait()
    return {p: (float(t[0]), float(t[-1]), float(t.sum())) for p, t in recvs.items()}


def _tags(rank, n):
    """Rank 0 sends tags 1 and 2, rank 1 receives 2 first; then 12 tags to
    one peer received in reverse, and two messages of one tag (posting
    order)."""
    out = {}
    if rank == 0:
        ws = [dist.isend(_payload(0, 1, t, 64), 1, tag=t) for t in (1, 2)]
        ws += [dist.isend(_payload(0, 1, t, 32 + t), 1, tag=t) for t in range(10, 22)]
        ws += [dist.isend(_payload(0, 1, k, 16), 1, tag=7) for k in (100, 101)]
        for w in ws:
            w.wait()
        return out
    got = {t: torch.zeros(64) for t in (1, 2)}
    ws = [dist.irecv(got[2], 0, tag=2), dist.irecv(got[1], 0, tag=1)]
    many = {t: torch.zeros(32 + t) for t in range(10, 22)}
    ws += [dist.irecv(many[t], 0, tag=t) for t in reversed(range(10, 22))]
    same = [torch.zeros(16), torch.zeros(16)]
    ws += [dist.irecv(s, 0, tag=7) for s in same]
    for w in ws:
        w.wait()
    out["tags 1, 2"] = [got[t].tolist() for t in (1, 2)]
    out["many"] = {t: many[t].tolist() for t in many}
    out["same tag"] = [s.tolist() for s in same]
    return out


def _batch(rank, n):
    """batch_isend_irecv in a ring, receives listed before sends."""
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(SMALL)
    ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, _payload(rank, right, 0, SMALL),
                                                          right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return got.tolist()


def _both(fn, n, *args):
    gloo = world.run(fn, n, *args, backend="gloo", timeout_s=60, wall_s=120)
    braid = world.run(fn, n, *args, backend="braid", timeout_s=60, wall_s=120)
    return gloo, braid


def test_every_peer_in_any_order():
    for order in ("rank", "reverse", "sends_first_big"):
        gloo, braid = _both(_every_peer, 4, order)
        assert braid == gloo, order
        for r, got in enumerate(braid):
            for p, (first, last, _) in got.items():
                size = BIG if order == "sends_first_big" else SMALL
                assert first == float(_payload(p, r, 0, size)[0]), (order, r, p)
                assert last == float(_payload(p, r, 0, size)[-1]), (order, r, p)


def test_tags_match_their_receives():
    gloo, braid = _both(_tags, 2)
    assert braid == gloo
    got = braid[1]
    assert got["tags 1, 2"] == [_payload(0, 1, t, 64).tolist() for t in (1, 2)]
    assert got["same tag"] == [_payload(0, 1, k, 16).tolist() for k in (100, 101)]


def test_batch_isend_irecv():
    gloo, braid = _both(_batch, 3)
    assert braid == gloo


def _any_source(rank, n):
    """Rank 0 receives from any source, as many times as there are peers;
    each says where it came from."""
    if rank != 0:
        dist.send(_payload(rank, 0, 0, 32), 0)
        return None
    got = {}
    for _ in range(n - 1):
        t = torch.zeros(32)
        src = dist.recv(t)  # src=None: any source
        got[src] = t.tolist()
    return got


def test_recv_from_any_source():
    gloo, braid = _both(_any_source, 3)
    assert braid == gloo
    assert braid[0] == {r: _payload(r, 0, 0, 32).tolist() for r in (1, 2)}
