#!/usr/bin/env python3
"""The binding of multi-piece items (StateDict.add_pieces) and of context/expert parallel topologies,
under mpirun (2 or 4 ranks).

Values saved are formulas of the element's global index; loads into other splits are compared
element by element with the formula, sliced by numpy; coordinates and communicator members are
compared with Megatron's rank rule computed here. A failure on any rank prints the rank and
traceback and aborts the job.

    mpirun -np 4 /usr/bin/python3 mpi_tests/python/test_pieces_topology.py /tmp/pieces
"""
import os
import shutil
import sys

import h5py
import numpy as np
import torch
from mpi4py import MPI

import h5ckpt
from mpi_checks import check, eq, run
from h5ckpt import ErrorCode, ShardPiece, ShardSpec

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-pieces-test")
torch.set_num_threads(1)

F, H = 12, 5  # fc1 of a SwiGLU MLP: [gate; up] = [2F, H]


def path(*parts):
    return os.path.join(ROOT, *parts)


def expect_error(fn, code, contains=()):
    try:
        fn()
    except h5ckpt.Error as e:
        check(e.code == code, f"expected {code}, got {e.code}: {e}")
        texts = W.allgather(str(e))
        check(all(t == texts[0] for t in texts), f"the same error on every rank: {texts}")
        for c in contains:
            check(c in e.message, f"'{c}' in '{e.message}'")
        return e
    raise AssertionError(f"no error raised (expected {code})")


def g_fc1():
    i = np.arange(2 * F * H, dtype=np.float32).reshape(2 * F, H)
    return i * 0.5 - 7.0


def g_bias():
    return np.arange(2 * F, dtype=np.float64) * 3.0 + 0.125


def rows(parts, index):
    """Rows [lo, hi) of part `index` of F rows cut into `parts` (the first F % parts get one more)."""
    b = ShardSpec.split([F], 0, parts, index).box
    return b.offset[0], b.offset[0] + b.shape[0]


# ---- add_pieces ------------------------------------------------------------------------------------

def test_add_pieces():
    topo = h5ckpt.Topology.create(W, tp=N)
    ck = h5ckpt.Checkpointer(topo, metrics=False)
    G, B = g_fc1(), g_bias()
    # Save: rank r holds gate rows and up rows of part r of N, fused as [gate_r; up_r] in one buffer.
    lo, hi = rows(N, R)
    f = hi - lo
    fused = np.concatenate([G[lo:hi], G[F + lo:F + hi]])
    fc1_pieces = [(ShardSpec.box_of([lo, 0], [f, H]), 0), (ShardSpec.box_of([F + lo, 0], [f, H]), f * H * 4)]
    # The bias as a torch tensor, [up_r; gate_r] after 3 elements of padding, pieces as ShardPiece objects.
    bias = torch.zeros(3 + 2 * f, dtype=torch.float64)
    bias[3:3 + f] = torch.from_numpy(B[F + lo:F + hi])
    bias[3 + f:] = torch.from_numpy(B[lo:hi])
    bias_pieces = [ShardPiece(ShardSpec.box_of([F + lo], [f]), 3 * 8), ShardPiece(ShardSpec.box_of([lo], [f]), (3 + f) * 8)]
    sd = h5ckpt.StateDict()
    sd.add_pieces("model/fc1.weight", None, [2 * F, H], fc1_pieces, fused)
    sd.add_pieces("model/fc1.bias", "f64", [2 * F], bias_pieces, bias)
    sd.add("model/other", np.full(4, R, np.int32), [4 * N], ShardSpec.split([4 * N], 0, N, R))
    it = sd.item("model/fc1.weight")
    check(it["pieces"] == [ShardPiece(s, o) for s, o in fc1_pieces], f"item pieces {it['pieces']}")
    check(sd.buffer("model/fc1.bias") is bias, "the StateDict references the tensor")
    check(sd.error is None, f"no pending error: {sd.error}")
    del fused, bias  # the StateDict keeps them alive
    ck.save(sd, path("fused"), step=1)
    with h5py.File(path("fused", "data.h5"), "r") as h:
        eq(h["model/fc1.weight"][...], G, "h5py: the fused pieces make the global fc1")
        eq(h["model/fc1.bias"][...], B, "h5py: the fused pieces make the global bias")
        eq(h["model/other"][...], np.repeat(np.arange(N, dtype=np.int32), 4), "h5py: the ordinary item after them")

    # Load under another split: columns of fc1 split over the ranks in reverse order, as pieces
    # [up_c; gate_c]; the bias whole as two pieces in reverse order.
    q = N - 1 - R
    cb = ShardSpec.split([F, H], 1, N, q).box
    c0, cw = cb.offset[1], cb.shape[1]
    back = np.zeros(2 * F * cw, np.float32)
    bias_back = np.zeros(2 * F, np.float64)
    ld = h5ckpt.StateDict()
    ld.add_pieces("model/fc1.weight", None, [2 * F, H],
                  [(ShardSpec.box_of([F, c0], [F, cw]), 0), (ShardSpec.box_of([0, c0], [F, cw]), F * cw * 4)], back)
    ld.add_pieces("model/fc1.bias", None, [2 * F],
                  [ShardPiece(ShardSpec.box_of([F], [F])), ShardPiece(ShardSpec.box_of([0], [F]), F * 8)], bias_back)
    ck.load(ld, path("fused"))
    want = np.concatenate([G[F:, c0:c0 + cw].reshape(-1), G[:F, c0:c0 + cw].reshape(-1)])
    eq(back, want, "fc1 loaded by columns as [up; gate]")
    eq(bias_back, np.concatenate([B[F:], B[:F]]), "bias loaded as [up; gate]")
    # A flat range of fc1 (elements [a, b) of its row-major flattening) at byte offset 4 of a buffer.
    a, b = 2 * F * H * R // N, 2 * F * H * (R + 1) // N
    flat = np.zeros(b - a + 1, np.float32)
    fl = h5ckpt.StateDict()
    fl.add_pieces("model/fc1.weight", None, [2 * F, H], [(ShardSpec.flat_range(ShardSpec.whole([2 * F, H]).box, a, b), 4)],
                  flat)
    ck.load(fl, path("fused"))
    eq(flat[1:], G.reshape(-1)[a:b], "flat-range piece at byte offset 4")
    eq(flat[:1], np.zeros(1, np.float32), "the byte before the piece untouched")
    # Into ordinary items of a TP split the other way (rows in 2 parts, or whole).
    parts = 2 if N % 2 == 0 else 1
    rb = ShardSpec.split([2 * F, H], 0, parts, R % parts)
    plain = np.zeros(rb.box.shape, np.float32)
    pl = h5ckpt.StateDict()
    pl.add("model/fc1.weight", plain, [2 * F, H], rb)
    ck.load(pl, path("fused"))
    eq(plain, G[rb.box.offset[0]:rb.box.offset[0] + rb.box.shape[0]], "fused save loaded as an ordinary row split")

    # The binding's own check: a piece beyond the buffer's end, the same error on every rank.
    bad = h5ckpt.StateDict()
    bad.add_pieces("model/fc1.weight", None, [2 * F, H], [(ShardSpec.box_of([0, 0], [F, H]), 8)], np.zeros(F * H, np.float32))
    check(bad.error is not None and "piece 0" in bad.error, f"pending error {bad.error}")
    expect_error(lambda: ck.load(bad, path("fused")), ErrorCode.SHAPE_MISMATCH, ["model/fc1.weight", "piece 0"])
    # The library's: overlapping pieces.
    ov = h5ckpt.StateDict()
    ov.add_pieces("model/fc1.weight", None, [2 * F, H],
                  [(ShardSpec.box_of([0, 0], [2, H]), 0), (ShardSpec.box_of([1, 0], [2, H]), 2 * H * 4)],
                  np.zeros(4 * H, np.float32))
    e = expect_error(lambda: ck.save(ov, path("overlap")), ErrorCode.INVALID_ARGUMENT, ["model/fc1.weight"])
    check("overlap" in e.message, f"overlap named: {e.message}")
    try:
        h5ckpt.StateDict().add_pieces("k", None, [4], [("not a shard",)], np.zeros(4, np.float32))
        raise AssertionError("a malformed piece was accepted")
    except TypeError:
        pass
    ck.close()
    topo.close()


# ---- topologies with CP and EP -----------------------------------------------------------------

def members(comm):
    return comm.allgather(R)


def test_topology_cp_ep():
    configs = []
    for tp in (1, 2, 4):
        for cp in (1, 2, 4):
            if N % (tp * cp):
                continue
            dp = N // (tp * cp)
            for ep in (1, 2, 4):
                if (dp * cp) % ep == 0 and (cp > 1 or ep > 1):
                    configs.append((tp, cp, dp, ep))
    if N == 4:
        check((1, 2, 2, 1) in configs, "the tp1 cp2 dp2 case is covered")
    for tp, cp, dp, ep in configs:
        what = f"tp{tp} cp{cp} dp{dp} ep{ep}"
        with h5ckpt.Topology.create(W, tp=tp, dp=dp, cp=cp, ep=ep) as t:
            s = t.sizes
            check((s.tp, s.cp, s.dp, s.pp, s.ep) == (tp, cp, dp, 1, ep), f"{what}: sizes {s}")
            check(s == h5ckpt.ParallelSizes(tp, dp, 1, cp=cp, ep=ep) and s.edp() == dp * cp // ep, f"{what}: {s}")

            def coords_of(r):
                # world rank = tp + TP*(cp + CP*(dp + DP*pp)); experts: g = dp*CP + cp, ep = g % EP, edp = g // EP
                c_tp, rest = r % tp, r // tp
                c_cp, rest = rest % cp, rest // cp
                c_dp, c_pp = rest % dp, rest // dp
                g = c_dp * cp + c_cp
                return c_tp, c_cp, c_dp, c_pp, g % ep, g // ep

            for r, c in enumerate(t.all_coords):
                check((c.tp, c.cp, c.dp, c.pp, c.ep, c.edp) == coords_of(r), f"{what}: rank {r} coords {c}")
            c = t.coords
            want = coords_of(R)
            check((c.tp, c.cp, c.dp, c.pp, c.ep, c.edp) == want, f"{what}: my coords {c}")
            m_tp, m_cp, m_dp, m_pp, m_ep, m_edp = want

            def rank_of(a_tp, a_cp, a_dp, a_pp):
                return a_tp + tp * (a_cp + cp * (a_dp + dp * a_pp))

            check(members(t.cp_comm()) == [rank_of(m_tp, x, m_dp, m_pp) for x in range(cp)], f"{what}: cp_comm")
            check(members(t.dp_comm()) == [rank_of(m_tp, m_cp, x, m_pp) for x in range(dp)], f"{what}: dp_comm")
            check(members(t.tp_comm()) == [rank_of(x, m_cp, m_dp, m_pp) for x in range(tp)], f"{what}: tp_comm")
            check(members(t.dp_cp_comm()) == [rank_of(m_tp, g % cp, g // cp, m_pp) for g in range(dp * cp)],
                  f"{what}: dp_cp_comm")
            # ep_comm: same edp, ordered by ep; expert_dp_comm: same ep, ordered by edp (g = edp*EP + ep).
            check(members(t.ep_comm()) == [rank_of(m_tp, (m_edp * ep + x) % cp, (m_edp * ep + x) // cp, m_pp)
                                           for x in range(ep)], f"{what}: ep_comm")
            check(members(t.expert_dp_comm()) == [rank_of(m_tp, (x * ep + m_ep) % cp, (x * ep + m_ep) // cp, m_pp)
                                                  for x in range(dp * cp // ep)], f"{what}: expert_dp_comm")
            check(f"cp={cp}" in repr(t), f"{what}: repr {t!r}")
            # The same grid from the caller's own communicators.
            comms = [W.Split(key_color, R) for key_color in
                     (m_cp + cp * (m_dp + dp * m_pp),           # tp: same (cp, dp, pp)
                      m_tp + tp * (m_dp + dp * m_pp),           # cp: same (tp, dp, pp)
                      m_tp + tp * (m_cp + cp * m_pp),           # dp: same (tp, cp, pp)
                      m_tp + tp * (m_cp + cp * m_dp),           # pp: same (tp, cp, dp)
                      m_tp + tp * (m_edp + (dp * cp // ep) * m_pp))]  # ep: same (tp, edp, pp)
            ctp, ccp, cdp, cpp, cep = comms
            with h5ckpt.Topology.from_comms(W, ctp, cdp, cpp, cp=ccp, ep=cep) as t2:
                c2 = t2.coords
                check((c2.tp, c2.cp, c2.dp, c2.pp, c2.ep, c2.edp) == want, f"{what}: from_comms coords {c2}")
                check(t2.sizes == s, f"{what}: from_comms sizes {t2.sizes}")
            for cm in comms:
                cm.Free()
    # Old calls keep working: positional tp, dp, pp and cp = ep = 1.
    with h5ckpt.Topology.create(W, 1, N) as t:
        c = t.coords
        check((c.cp, c.ep, c.edp) == (0, 0, R) and t.sizes == h5ckpt.ParallelSizes(1, N, 1), f"default cp/ep {c}")
        check(t.coords == h5ckpt.RankCoords(0, R, 0), "RankCoords(tp, dp, pp) still equals")
    expect_error(lambda: h5ckpt.Topology.create(W, tp=1, dp=1, cp=N + 1), ErrorCode.INVALID_ARGUMENT)
    if N >= 2:
        expect_error(lambda: h5ckpt.Topology.create(W, tp=1, dp=N, ep=3 if N % 3 else 5), ErrorCode.INVALID_ARGUMENT)

    # A save under CP: replicated over CP and DP, one copy written; loaded back at TP1 x DP N.
    if N % 2 == 0:
        t = h5ckpt.Topology.create(W, tp=1, dp=N // 2, cp=2)
        ck = h5ckpt.Checkpointer(t, metrics=False)
        G = g_fc1()
        sd = h5ckpt.StateDict()
        sd.add_replicated("model/fc1.weight", G.copy())
        ck.save(sd, path("cp"), step=2)
        ck.close()
        t.close()
        with h5ckpt.Topology.create(W, dp=N) as t3, h5ckpt.Checkpointer(t3, metrics=False) as ck3:
            back = np.zeros(G.shape, np.float32)
            ld = h5ckpt.StateDict()
            ld.add_replicated("model/fc1.weight", back)
            ck3.load(ld, path("cp"))
            eq(back, G, "saved under CP, loaded at DP")


def main():
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(ROOT)
    W.Barrier()
    run(W, [("add_pieces", test_add_pieces), ("topology_cp_ep", test_topology_cp_ep)],
        f"all add_pieces/topology binding tests passed on {N} rank(s)")

if __name__ == "__main__":
    main()
