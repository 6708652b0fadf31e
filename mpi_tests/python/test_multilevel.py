#!/usr/bin/env python3
"""The binding of multi-level checkpoints and the memory budget, under mpirun (2 or 4 ranks).

Simulated nodes: H5CKPT_RANKS_PER_NODE (set by CTest) cuts the job into nodes of 1-2 ranks, and
`local_dir=<root>/node{node}` gives each its own "local disk". Every value saved is a formula of
the element's global index and the step; every check compares what comes back (a load into
another layout, h5py reading the persisted shared checkpoint) element by element with that
formula, computed by numpy. A failure on any rank prints the rank and traceback and aborts the job.

    H5CKPT_RANKS_PER_NODE=2 mpirun -np 4 /usr/bin/python3 mpi_tests/python/test_multilevel.py /tmp/ml
"""
import faulthandler
import os
import shutil
import sys

import h5py
import numpy as np
from mpi4py import MPI

import h5ckpt
from mpi_checks import check, eq, run
from h5ckpt import ErrorCode, ShardSpec

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-multilevel-test")
RPN = int(os.environ.get("H5CKPT_RANKS_PER_NODE", "0") or 0)
if RPN <= 0:
    RPN = N
NODES = (N + RPN - 1) // RPN
MY_NODE = R // RPN

SHAPE_W = [8, 6]   # model/w: rows split over TP, replicated over DP
SHAPE_M = [10, 7]  # optimizer/m: ZeRO flat ranges over all ranks


def same_everywhere(value, what):
    vals = W.allgather(value)
    check(all(v == vals[0] for v in vals), f"{what}: differs between ranks: {vals}")


def node_dir(n):
    return os.path.join(ROOT, f"node{n}")


def shared(*parts):
    return os.path.join(ROOT, "shared", *parts)


def g_w(step):
    return (np.arange(np.prod(SHAPE_W), dtype=np.float32).reshape(SHAPE_W) * 0.25 + 1000.0 * step).astype(np.float32)


def g_m(step):
    return (np.arange(np.prod(SHAPE_M), dtype=np.float64).reshape(SHAPE_M) * -1.5 + 10.0 * step)


def state(topo, step):
    """A StateDict for `topo` with this rank's parts of the step's values (zeros when step is None)."""
    c, s = topo.coords, topo.sizes
    sd = h5ckpt.StateDict()
    w_spec = ShardSpec.split(SHAPE_W, 0, s.tp, c.tp)
    b = w_spec.box
    w = g_w(step)[b.offset[0]:b.offset[0] + b.shape[0]].copy() if step is not None else np.zeros(b.shape, np.float32)
    sd.add("model/w", w, SHAPE_W, w_spec)
    n = int(np.prod(SHAPE_M))
    lo, hi = n * R // N, n * (R + 1) // N
    m_spec = ShardSpec.flat_range(ShardSpec.whole(SHAPE_M).box, lo, hi)
    m = g_m(step).reshape(-1)[lo:hi].copy() if step is not None else np.zeros(hi - lo, np.float64)
    sd.add("optimizer/m", m, SHAPE_M, m_spec)
    st = np.array([step if step is not None else -1], dtype=np.int64)
    sd.add_replicated("extra/step", st)
    return sd, w, (lo, hi, m), st, b


def expect_state(parts, step, what):
    _, w, (lo, hi, m), st, b = parts
    eq(w, g_w(step)[b.offset[0]:b.offset[0] + b.shape[0]], f"{what}: model/w")
    eq(m, g_m(step).reshape(-1)[lo:hi], f"{what}: optimizer/m")
    eq(st, np.array([step], np.int64), f"{what}: extra/step")


def test_options():
    o = h5ckpt.CheckpointerOptions(memory_bytes=1 << 20, local_dir="/x/node{node}", local_replicas=2, persist_every=5,
                                   local_keep=3)
    check((o.memory_bytes, o.local_dir, o.local_replicas, o.persist_every, o.local_keep) ==
          (1 << 20, "/x/node{node}", 2, 5, 3), "CheckpointerOptions fields")
    d = h5ckpt.CheckpointerOptions()
    check((d.memory_bytes, d.local_dir, d.local_replicas, d.persist_every, d.local_keep) == (0, "", 1, 0, 2),
          "CheckpointerOptions defaults (checkpointer.h)")
    check(h5ckpt.SaveOptions().persist is False and h5ckpt.SaveOptions(persist=True).persist is True, "SaveOptions.persist")
    cfg = h5ckpt.parse_config('[checkpointer]\nlocal_dir = "/l/{node}"\npersist_every = 7\nlocal_keep = 4\n'
                              'local_replicas = 2\nmemory_bytes = "64KiB"\n')
    c = cfg.checkpointer
    check((c.local_dir, c.persist_every, c.local_keep, c.local_replicas, c.memory_bytes) == ("/l/{node}", 7, 4, 2, 65536),
          "configuration keys reach the bound fields")


def test_memory_bytes():
    topo = h5ckpt.Topology.create(W, dp=N)
    # 100 bytes: refused by the library at the start of the call, the same on every rank.
    ck = h5ckpt.Checkpointer(topo, memory_bytes=100, metrics=False)
    sd, *_ = state(topo, 1)
    try:
        ck.save(sd, shared("tiny"))
        raise AssertionError("memory_bytes=100 was not refused")
    except h5ckpt.Error as e:
        check(e.code == ErrorCode.INVALID_ARGUMENT and "memory_bytes = 100" in e.message, f"memory_bytes refusal: {e}")
        same_everywhere(str(e), "memory_bytes error")
    ck.close()
    # 2 KiB: a budget below the state's size streams, element-exact, and the peak stays within it.
    ck = h5ckpt.Checkpointer(topo, memory_bytes=2048, metrics=False)
    big = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) * 3.0 + 1.0  # 16 KiB
    sd = h5ckpt.StateDict()
    sd.add_replicated("big", big.copy())
    ck.save(sd, shared("budget"), step=1)
    back = np.zeros_like(big)
    ld = h5ckpt.StateDict()
    ld.add("big", back, [64, 64], ShardSpec.whole([64, 64]))
    ck.load(ld, shared("budget"))
    eq(back, big, "load under memory_bytes=2048")
    ck.close()
    topo.close()


def test_local_level():
    tp = 2 if N % 2 == 0 else 1
    topo = h5ckpt.Topology.create(W, tp=tp, dp=N // tp)
    ck = h5ckpt.Checkpointer(topo, local_dir=os.path.join(ROOT, "node{node}"), local_replicas=1, metrics=False)
    shared_path = {s: shared(f"step-{s}") for s in (1, 2, 3)}
    reports = {}
    # Step 1: a plain (synchronous) local save; step 2: async and persisted; step 3: local only.
    sd, *_ = state(topo, 1)
    reports[1] = ck.save(sd, shared_path[1], step=1)
    sd, *_ = state(topo, 2)
    reports[2] = ck.save_async(sd, shared_path[2], step=2, persist=True).wait()
    sd, *_ = state(topo, 3)
    reports[3] = ck.save(sd, shared_path[3], h5ckpt.SaveOptions(step=3))
    for s, rep in reports.items():
        check(rep.level == "local", f"step {s}: SaveReport.level {rep.level!r}")
        check(os.path.normpath(rep.path) == os.path.join(node_dir(MY_NODE), f"step-{s}"), f"step {s}: path {rep.path}")
        check(rep.replicate_s >= 0 and rep.persist_s >= 0, f"step {s}: times")
        d = rep.to_dict()
        check((d["level"], d["persisted"], d["replicate_s"], d["persist_s"]) ==
              (rep.level, rep.persisted, rep.replicate_s, rep.persist_s), f"step {s}: to_dict")
        check("level='local'" in repr(rep), f"step {s}: repr {rep!r}")
    check(os.path.normpath(reports[2].persisted) == shared_path[2], f"persisted names the shared path: {reports[2].persisted!r}")
    check(reports[2].persist_s > 0, f"the persisted save spent time persisting: {reports[2].persist_s}")
    check(reports[1].persisted == "" and reports[3].persisted == "", "only the persist=True save is persisted")
    check(reports[1].persist_s == 0 and reports[3].persist_s == 0, "no persist time without a persist")
    # The shared level holds step 2 only; h5py reads the formula back from it.
    check(h5ckpt.is_checkpoint_dir(shared_path[2]), "step 2 is a shared checkpoint")
    check(not os.path.exists(shared_path[1]) and not os.path.exists(shared_path[3]), "steps 1, 3 stay local")
    with h5py.File(os.path.join(shared_path[2], "data.h5"), "r") as f:
        eq(f["model/w"][...], g_w(2), "h5py: persisted model/w")
        eq(f["optimizer/m"][...], g_m(2), "h5py: persisted optimizer/m")
    # local_keep (default 2): each node keeps steps 2 and 3.
    if R % RPN == 0:
        names = sorted(e for e in os.listdir(node_dir(MY_NODE)) if not e.startswith("."))
        check("step-1" not in names and "step-2" in names and "step-3" in names, f"node {MY_NODE} keeps {names}")
    W.Barrier()

    res = ck.resolve(shared())
    check(isinstance(res, h5ckpt.ResolvedCheckpoint) and isinstance(res.info, h5ckpt.CheckpointInfo), "resolve types")
    check(res.level == "local" and res.info.step == 3, f"resolve: {res.level} step {res.info.step}: {res.reason}")
    check(isinstance(res.reason, str) and res.reason, "resolve gives a reason")
    check(sorted(res.info.keys()) == ["extra/step", "model/w", "optimizer/m"], f"resolved keys {res.info.keys()}")
    same_everywhere((res.level, res.info.step, res.reason), "resolve")
    parts = state(topo, None)
    lr = ck.load(parts[0], shared())
    expect_state(parts, 3, "local load after resolve, saving layout")
    check(lr.transport == "mpi-local", f"load transport {lr.transport!r}")

    # Load under another layout (TP1 x DP N) from the local level.
    topo2 = h5ckpt.Topology.create(W, tp=1, dp=N)
    ck2 = h5ckpt.Checkpointer(topo2, local_dir=os.path.join(ROOT, "node{node}"), metrics=False)
    parts = state(topo2, None)
    ck2.load(parts[0], shared())
    expect_state(parts, 3, "local load, TP1")

    # The last node loses its disk: its files come from the partner copies.
    last = NODES - 1
    if R == last * RPN:
        shutil.rmtree(node_dir(last))
    W.Barrier()
    res = ck2.resolve(shared())
    check(res.level == "local" and res.info.step == 3, f"after losing node {last}: {res.level}: {res.reason}")
    parts = state(topo2, None)
    ck2.load(parts[0], shared())
    expect_state(parts, 3, f"local load without node {last}, TP1")
    # ck's earlier answer was used by its load; this load resolves again and sees the lost node.
    parts = state(topo, None)
    ck.load(parts[0], shared())
    expect_state(parts, 3, f"local load without node {last}, saving layout")

    # Every local disk lost: the newest shared checkpoint (the persisted step 2) is read.
    if R % RPN == 0 and os.path.exists(node_dir(MY_NODE)):
        shutil.rmtree(node_dir(MY_NODE))
    W.Barrier()
    res = ck2.resolve(shared())
    check(res.level == "shared" and res.info.step == 2, f"all disks lost: {res.level} step {res.info.step}: {res.reason}")
    check(os.path.normpath(res.info.path) == shared_path[2], f"resolved shared path {res.info.path}")
    parts = state(topo2, None)
    ck2.load(parts[0], shared())
    expect_state(parts, 2, "shared load after losing every disk")
    ck2.close()
    topo2.close()
    ck.close()
    topo.close()


def main():
    faulthandler.dump_traceback_later(150, exit=False)
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(shared())
    W.Barrier()
    run(W, [("options", test_options), ("memory_bytes", test_memory_bytes), ("local_level", test_local_level)],
        f"all multi-level binding tests passed on {N} rank(s), {NODES} nodes",
        before=lambda: check(NODES >= 2, f"needs at least 2 simulated nodes (H5CKPT_RANKS_PER_NODE={RPN}, {N} ranks)"))

if __name__ == "__main__":
    main()
