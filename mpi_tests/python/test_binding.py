#!/usr/bin/env python3
"""The Python binding against independently computed values, under mpirun at any rank count.

Every value saved is a formula of the element's global index; every check compares what comes back
(through h5py, through the binding's reader, or through a load into another layout) element by
element with that formula, sliced by numpy from the global array. Errors must carry the same code
and message on every rank. A failure on any rank prints the rank and traceback and aborts the job
(non-zero exit).

    mpirun -np 4 /usr/bin/python3 mpi_tests/python/test_binding.py /tmp/binding-test
"""
import gc
import os
import shutil
import struct
import sys
import threading
import time
import traceback
import weakref

import numpy as np
import torch
from mpi4py import MPI

import h5ckpt
from h5ckpt import DType, ErrorCode, ShardSpec

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-binding-test")
torch.set_num_threads(1)


# ---- helpers -----------------------------------------------------------------------------------

def check(cond, what):
    if not cond:
        raise AssertionError(what)


def eq(a, b, what):
    """Element-by-element equality of two arrays (bitwise for floats, so -0.0 and NaN count)."""
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}")
    check(a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}")
    same = np.ascontiguousarray(a).view(np.uint8) == np.ascontiguousarray(b).view(np.uint8)
    if not same.all():
        bad = np.argwhere(~(a == b)) if a.dtype != np.bool_ else np.argwhere(a != b)
        raise AssertionError(f"{what}: {int((~same).sum())} bytes differ, first elements at {bad[:3].tolist()}: "
                             f"got {a[tuple(bad[0])] if len(bad) else '?'}, want {b[tuple(bad[0])] if len(bad) else '?'}")


def path(*parts):
    return os.path.join(ROOT, *parts)


def expect_error(fn, code, contains=()):
    """fn() must raise h5ckpt.Error with `code`, the same text on every rank, mentioning `contains`."""
    try:
        fn()
    except h5ckpt.Error as e:
        check(isinstance(e, RuntimeError), "h5ckpt.Error is a RuntimeError")
        check(e.code == code, f"expected {code}, got {e.code}: {e}")
        check(str(e) == f"{h5ckpt.error_code_name(code)}: {e.message}", f"str(e) is '<code name>: <message>': {e}")
        texts = W.allgather(str(e))
        check(all(t == texts[0] for t in texts), f"the same error on every rank: {texts}")
        for c in contains:
            check(c in e.message, f"'{c}' in '{e.message}'")
        return e
    raise AssertionError(f"no error raised (expected {code})")


def f32_to_bf16_rne(x):
    """Round-to-nearest-even f32 -> bf16 bits, finite values (an independent implementation)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def gvals(key_id, shape, kind):
    """The global value of every element of a tensor: a formula of (key_id, flat index)."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64)
    if kind in ("f32", "f64"):
        v = (i * 0.25 - 3.75 + key_id * 1000.0).astype(np.float32 if kind == "f32" else np.float64)
    elif kind == "f16":
        v = ((i % 512) * 0.5 - 100 + key_id).astype(np.float16)
    elif kind == "bf16f32":  # values bf16 represents exactly, as float32
        v = ((i * 7 + key_id) % 200 - 100).astype(np.float32)
    elif kind == "bool":
        v = (i * 3 + key_id) % 5 < 2
    else:
        info = np.iinfo(kind)
        span = min(int(info.max) - int(info.min) + 1, 1 << 20)
        v = ((i * 7919 + key_id * 31) % span + max(int(info.min), -(span // 2))).astype(kind)
    return v.reshape(shape)


def part(global_arr, spec):
    """numpy's view of what `spec` names in the global array, laid out as the rank's buffer."""
    b = spec.box
    sub = global_arr[tuple(slice(o, o + s) for o, s in zip(b.offset, b.shape))]
    if spec.flat is None:
        return np.ascontiguousarray(sub)
    return np.ascontiguousarray(sub).reshape(-1)[spec.flat[0]:spec.flat[1]]


def flat_part(shape, parts, index):
    n = int(np.prod(shape))
    return ShardSpec.flat_range(ShardSpec.whole(shape).box, n * index // parts, n * (index + 1) // parts)


# ---- the state of test 2, saved at layout TP=N ------------------------------------------------

def items_save(r, n):
    """(key, kind, global shape, ShardSpec, container) for rank r of n (TP = n)."""
    return [
        ("model/split0", "f32", [4 * n + 1, 6], ShardSpec.split([4 * n + 1, 6], 0, n, r), "numpy"),
        ("model/split1", "f64", [5, 3 * n + 2], ShardSpec.split([5, 3 * n + 2], 1, n, r), "numpy"),
        ("model/box", "int32", [2 * n, 4], ShardSpec.box_of([2 * (n - 1 - r), 0], [2, 4]), "numpy"),
        ("optimizer/flat", "f32", [7, 5], flat_part([7, 5], n, r), "numpy"),
        ("model/whole", "f16", [3, 3], ShardSpec.whole([3, 3]), "numpy"),
        ("model/bf16_torch", "bf16", [2 * n, 8], ShardSpec.split([2 * n, 8], 0, n, r), "torch"),
        ("model/bf16_raw", "bf16raw", [n, 4], ShardSpec.split([n, 4], 0, n, r), "numpy"),
        ("model/i8", "int8", [n, 3], ShardSpec.split([n, 3], 0, n, r), "numpy"),
        ("model/u8", "uint8", [3, n], ShardSpec.split([3, n], 1, n, r), "numpy"),
        ("model/i16", "int16", [2 * n], ShardSpec.split([2 * n], 0, n, r), "numpy"),
        ("model/i64", "int64", [n, 2], ShardSpec.split([n, 2], 0, n, r), "torch"),
        ("model/bool", "bool", [n, 5], ShardSpec.split([n, 5], 0, n, r), "numpy"),
        ("model/torch_flat", "f32", [3, 4, 5], flat_part([3, 4, 5], n, r), "torch"),
        ("model/tiny", "f32", [1, 3], ShardSpec.split([1, 3], 0, n, r), "numpy"),  # empty shards on ranks > 0
        ("model/round", "round", [n, 64], ShardSpec.split([n, 64], 0, n, r), "numpy"),
    ]


def global_of(key_id, kind, shape):
    if kind in ("bf16", "bf16raw"):
        return f32_to_bf16_rne(gvals(key_id, shape, "bf16f32"))  # bits; exact values
    if kind == "round":  # float32 values whose bf16 rounding is not trivial, ties included
        rng = np.random.default_rng(99)
        v = rng.standard_normal(int(np.prod(shape))).astype(np.float32) * 100
        u = v.view(np.uint32)
        u[::4] = (u[::4] & 0xFFFF0000) | 0x8000  # exact ties: half of them round up, half down (to even)
        return u.view(np.float32).reshape(shape)
    return gvals(key_id, shape, kind)


def make_buffer(global_arr, spec, kind, container):
    local = part(global_arr, spec)
    if container == "torch":
        if kind == "bf16":
            return torch.from_numpy(local.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(local.copy())
    return local.copy()


def expected_bytes(n):
    total = 0
    for k, (key, kind, shape, spec, cont) in enumerate(items_save(0, n)):
        size = {"f32": 4, "f64": 8, "int32": 4, "f16": 2, "bf16": 2, "bf16raw": 2, "int8": 1, "uint8": 1,
                "int16": 2, "int64": 8, "bool": 1, "round": 4}[kind]
        total += int(np.prod(shape)) * size
    total += len(b"shared bytes!") + sum(len(f"rank-{r}".encode()) for r in range(n))
    return total


# ---- tests -------------------------------------------------------------------------------------

def test_topology():
    divisors = [d for d in range(1, N + 1) if N % d == 0]
    for tp in divisors:
        dp = N // tp
        with h5ckpt.Topology.create(W, tp=tp, dp=dp) as t:
            check(t.rank == R and t.size == N, "rank and size")
            check(t.sizes == h5ckpt.ParallelSizes(tp, dp, 1), f"sizes {t.sizes}")
            check(t.coords == h5ckpt.RankCoords(R % tp, (R // tp) % dp, 0), f"Megatron coords {t.coords}")
            check([(c.tp, c.dp, c.pp) for c in t.all_coords] == [(r % tp, (r // tp) % dp, 0) for r in range(N)],
                  "all_coords")
            check(t.tp_comm().Get_size() == tp and t.tp_comm().Get_rank() == R % tp, "tp_comm")
            check(t.dp_comm().Get_size() == dp and t.dp_comm().Get_rank() == (R // tp) % dp, "dp_comm")
            check(t.world().Get_size() == N and t.pp_comm().Get_size() == 1, "world and pp_comm")
        check(t.closed, "closed after the with block")
        expect_error(lambda: t.rank, ErrorCode.INVALID_ARGUMENT, ["closed"])
    if N % 2 == 0:
        t = h5ckpt.Topology.create(tp=1, dp=N // 2, pp=2)
        check(t.coords == h5ckpt.RankCoords(0, R % (N // 2), R // (N // 2)), "pipeline coords")
        t.close()
    expect_error(lambda: h5ckpt.Topology.create(W, tp=N + 1), ErrorCode.INVALID_ARGUMENT)
    try:
        h5ckpt.Topology.create(42)
        raise AssertionError("a non-communicator must raise TypeError")
    except TypeError:
        pass

    # The caller's own communicators, DP fastest (not Megatron's order).
    T = 2 if N % 2 == 0 else 1
    D = N // T
    tpc = W.Split(color=R % D, key=R // D)
    dpc = W.Split(color=R // D, key=R % D)
    topo = h5ckpt.Topology.from_comms(W, tpc, dpc, MPI.COMM_SELF)
    check(topo.coords == h5ckpt.RankCoords(R // D, R % D, 0), f"from_comms coords {topo.coords}")
    # Save a tensor split over TP and replicated over DP: each region is written once.
    shape = [2 * T + 1, 3]
    g = gvals(7, shape, "f32")
    spec = ShardSpec.split(shape, 0, T, topo.coords.tp)
    sd = h5ckpt.StateDict()
    sd.add("model/w", part(g, spec), shape, spec)
    with h5ckpt.Checkpointer(topo) as ck:
        rep = ck.save(sd, path("from_comms"))
    check(W.allreduce(rep.bytes_written) == g.nbytes == rep.bytes_total, "replicas written once")
    with h5ckpt.CheckpointReader.open(path("from_comms")) as rd:
        eq(rd.read("model/w"), g, "from_comms checkpoint")
    topo.close()
    tpc.Free()
    dpc.Free()


def test_save_shard_kinds():
    topo = h5ckpt.Topology.create(W, tp=N)
    ck = h5ckpt.Checkpointer(topo)
    sd = h5ckpt.StateDict()
    globals_ = {}
    for k, (key, kind, shape, spec, cont) in enumerate(items_save(R, N)):
        g = global_of(k, kind, shape)
        globals_[key] = g
        buf = make_buffer(g, spec, kind, cont)
        if kind == "bf16raw":
            sd.add(key, buf, shape, spec, dtype="bf16")
        else:
            sd.add(key, buf, shape, spec)
    sd.add_bytes("extra/shared", bytearray(b"shared bytes!"))
    sd.add_bytes(f"extra/rank{R}", f"rank-{R}".encode())  # bytes: a read-only buffer is fine for a save
    check(sd.error is None, f"no local problem: {sd.error}")
    check(len(sd) == len(items_save(R, N)) + 2 and "model/round" in sd, "StateDict size and keys")
    check(sd.item("model/split0")["shard"] == ShardSpec.split([4 * N + 1, 6], 0, N, R), "item() describes the shard")
    rep = ck.save(sd, path("kinds"), step=7)
    check(rep.path == path("kinds") and not rep.async_, f"report path {rep.path}")
    check(rep.bytes_total == expected_bytes(N), f"bytes_total {rep.bytes_total} != {expected_bytes(N)}")
    check(W.allreduce(rep.bytes_written) == rep.bytes_total, "every byte written once (replicas de-duplicated)")

    # h5py, an independent reader: global shapes and values.
    if R == 0:
        import h5py
        with h5py.File(path("kinds", "data.h5"), "r") as f:
            for key, g in globals_.items():
                kind = dict((it[0], it[1]) for it in items_save(0, N))[key]
                ds = f[key]
                check(list(ds.shape) == list(g.shape), f"h5py shape of {key}: {ds.shape}")
                if kind in ("bf16", "bf16raw"):  # HDF5 converts the custom bf16 type to float32 exactly
                    eq(ds[...].astype(np.float32), bf16_bits_to_f32(g), f"h5py {key}")
                elif kind == "bool":
                    eq(ds[...].astype(bool), g, f"h5py {key}")
                else:
                    eq(ds[...], g, f"h5py {key}")
            eq(np.asarray(f["extra/shared"][...], dtype=np.uint8), np.frombuffer(b"shared bytes!", np.uint8), "h5py bytes")
            for r in range(N):
                eq(np.asarray(f[f"extra/rank{r}"][...], dtype=np.uint8), np.frombuffer(f"rank-{r}".encode(), np.uint8),
                   f"h5py bytes of rank {r}")

    # The binding's reader, on every rank: whole tensors, boxes, flat ranges, dtypes, `out`.
    with h5ckpt.CheckpointReader.open(path("kinds")) as rd:
        check(rd.keys() == sorted(list(globals_) + ["extra/shared"] + [f"extra/rank{r}" for r in range(N)]),
              "reader keys sorted")
        eq(rd.read("model/split0"), globals_["model/split0"], "read whole f32")
        eq(rd.read("model/split1", h5ckpt.Box([1, 1], [3, 2])), globals_["model/split1"][1:4, 1:3], "read a box")
        eq(rd.read("model/bf16_torch"), bf16_bits_to_f32(globals_["model/bf16_torch"]), "bf16 read as float32")
        eq(rd.read("model/bf16_raw", dtype="bf16"), globals_["model/bf16_raw"], "bf16 raw bits")
        eq(rd.read("model/split0", dtype=DType.F64), globals_["model/split0"].astype(np.float64), "read converted to f64")
        spec = flat_part([7, 5], 3, 1)
        eq(rd.read_shard("optimizer/flat", spec), part(globals_["optimizer/flat"], spec), "read_shard flat range")
        out = torch.zeros(2 * N, 8, dtype=torch.bfloat16)
        check(rd.read("model/bf16_torch", out=out) is out, "read(out=) returns out")
        eq(out.view(torch.int16).numpy().view(np.uint16), globals_["model/bf16_torch"], "read into a bf16 tensor")
        eq(rd.read("model/bool"), globals_["model/bool"], "bool")
        eq(rd.read("model/tiny"), globals_["model/tiny"], "a tensor saved by one rank of several")
        check(rd.find("model/nope") is None and rd.find("model/i8").shape == [N, 3], "find")
        check(rd.bytes_read > 0, "bytes_read")
        expect_error(lambda: rd.read("model/nope"), ErrorCode.NOT_FOUND, ["model/nope"])
        expect_error(lambda: rd.read("model/i8", h5ckpt.Box([0, 0], [N + 1, 3])), ErrorCode.INVALID_ARGUMENT)
        expect_error(lambda: rd.read("model/i8", dtype="f32"), ErrorCode.DTYPE_MISMATCH)
    ck.close()
    topo.close()
    return globals_


def test_load_reshard(globals_):
    """Load the TP=N checkpoint as DP=N with other shard kinds, into numpy arrays and torch tensors."""
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo)
    rr = N - 1 - R
    wants = [  # key, global shape, this rank's spec, container, dtype of the buffer
        ("model/split0", [4 * N + 1, 6], flat_part([4 * N + 1, 6], N, rr), "numpy", np.float32),
        ("model/split1", [5, 3 * N + 2], ShardSpec.whole([5, 3 * N + 2]), "numpy", np.float64),
        ("model/box", [2 * N, 4], ShardSpec.split([2 * N, 4], 1, N, R), "numpy", np.int32),
        ("optimizer/flat", [7, 5], ShardSpec.split([7, 5], 0, N, R), "torch", np.float32),
        ("model/whole", [3, 3], ShardSpec.split([3, 3], 1, N, R), "numpy", np.float16),
        ("model/i8", [N, 3], ShardSpec.whole([N, 3]), "numpy", np.int8),
        ("model/u8", [3, N], ShardSpec.box_of([1, 0], [2, N]) if R == 0 else None, "numpy", np.uint8),
        ("model/i16", [2 * N], flat_part([2 * N], N, rr), "numpy", np.int16),
        ("model/i64", [N, 2], ShardSpec.whole([N, 2]), "torch", np.int64),
        ("model/bool", [N, 5], ShardSpec.split([N, 5], 1, N, R), "numpy", np.bool_),
        ("model/torch_flat", [3, 4, 5], ShardSpec.split([3, 4, 5], 2, N, rr), "torch", np.float32),
        ("model/tiny", [1, 3], ShardSpec.whole([1, 3]), "numpy", np.float32),
    ]
    sd = h5ckpt.StateDict()
    bufs = {}
    for key, shape, spec, cont, dt in wants:
        if spec is None:
            continue
        n = spec.numel()
        local_shape = [n] if spec.flat is not None else list(spec.box.shape)
        sentinel = np.full(local_shape, 77, dtype=dt) if dt != np.bool_ else np.ones(local_shape, dtype=bool)
        buf = torch.from_numpy(sentinel) if cont == "torch" else sentinel
        bufs[key] = (buf, spec)
        sd.add(key, buf, shape, spec)
    # Conversions on load: bf16 saved -> f32 buffer (exact); f32 saved -> bf16 tensor (nearest even).
    b16 = np.zeros(8 * 2, dtype=np.float32)
    spec16 = ShardSpec.box_of([2 * rr, 0], [2, 8])
    sd.add("model/bf16_torch", b16, [2 * N, 8], spec16)
    round_t = torch.zeros(N, 64, dtype=torch.bfloat16)
    sd.add("model/round", round_t)
    raw_t = torch.zeros(N, 4, dtype=torch.bfloat16)
    sd.add("model/bf16_raw", raw_t)
    shared = bytearray(len(b"shared bytes!"))
    other = np.zeros(len(f"rank-{(R + 1) % N}"), dtype=np.uint8)
    sd.add_bytes("extra/shared", shared)
    sd.add_bytes(f"extra/rank{(R + 1) % N}", other)

    def verify(tag):
        for key, (buf, spec) in bufs.items():
            got = buf.numpy() if isinstance(buf, torch.Tensor) else buf
            eq(got.reshape(-1), part(globals_[key], spec).reshape(-1), f"{tag}: {key}")
        eq(b16.reshape(2, 8), bf16_bits_to_f32(part(globals_["model/bf16_torch"], spec16)), f"{tag}: bf16 -> f32")
        eq(round_t.view(torch.int16).numpy().view(np.uint16), f32_to_bf16_rne(globals_["model/round"]),
           f"{tag}: f32 -> bf16 (nearest even)")
        check(torch.equal(round_t, torch.from_numpy(globals_["model/round"]).to(torch.bfloat16)),
              f"{tag}: f32 -> bf16 equals torch's own rounding")
        eq(raw_t.view(torch.int16).numpy().view(np.uint16), globals_["model/bf16_raw"], f"{tag}: bf16 raw -> bf16 tensor")
        check(bytes(shared) == b"shared bytes!" and other.tobytes() == f"rank-{(R + 1) % N}".encode(), f"{tag}: bytes")

    rep = ck.load(sd, path("kinds"))
    verify("load")
    check(rep.path == path("kinds") and rep.transport == "mpi", f"load report {rep}")
    check(W.allreduce(rep.bytes_sent) == W.allreduce(rep.bytes_received), "bytes sent == bytes received")
    d = rep.to_dict()
    check(0 < rep.open_s <= rep.plan_s and d["open_s"] == rep.open_s, f"open_s inside plan_s: {d}")
    check(d["io_s"] == rep.io_s and d["copy_s"] == rep.copy_s and rep.copy_s >= 0, f"io_s, copy_s: {d}")
    check(rep.bytes_read == 0 or rep.io_s > 0, f"a rank that read waited in pread: {d}")

    def wipe():
        for key, (buf, spec) in bufs.items():
            (buf.numpy() if isinstance(buf, torch.Tensor) else buf)[...] = 0
        b16[:] = 0
        round_t.zero_()
        raw_t.zero_()
        shared[:] = b"\0" * len(shared)
        other[:] = 0

    wipe()
    rep = ck.load(sd, path("kinds"), h5ckpt.LoadOptions(aggregate_reads=True, read_window_bytes=64))
    verify("aggregated load")
    check(rep.transport == ("mpi-aggregated" if N > 1 else "mpi"), f"transport {rep.transport}")  # one rank: per item
    wipe()
    rep = ck.load(sd, path(), verify_checksums=True, zero_redundancy=False)  # follows ROOT/latest
    verify("verified load via latest")
    check(rep.path == path("kinds"), f"latest -> {rep.path}")

    # Non-strict load: a missing key is skipped and listed, its buffer untouched.
    miss = np.full(4, 5.0, dtype=np.float32)
    sd2 = h5ckpt.StateDict()
    sd2.add("model/missing", miss)
    whole = np.zeros((3, 3), dtype=np.float16)
    sd2.add("model/whole", whole)
    rep = ck.load(sd2, path("kinds"), strict=False)
    check(rep.missing_keys == ["model/missing"], f"missing_keys {rep.missing_keys}")
    eq(miss, np.full(4, 5.0, dtype=np.float32), "a missing key's buffer is untouched")
    eq(whole, globals_["model/whole"], "non-strict load of the other key")
    expect_error(lambda: ck.load(sd2, path("kinds")), ErrorCode.NOT_FOUND, ["model/missing"])

    # A padded vocabulary: more rows than saved, with allow_shape_mismatch; without it an error.
    padded = np.full((4 * N + 3, 6), 9.0, dtype=np.float32)
    sd3 = h5ckpt.StateDict()
    sd3.add("model/split0", padded, allow_shape_mismatch=True)
    ck.load(sd3, path("kinds"))
    eq(padded[:4 * N + 1], globals_["model/split0"], "padded load: the saved rows")
    eq(padded[4 * N + 1:], np.zeros((2, 6), np.float32), "padded load: zero-filled rows")
    sd4 = h5ckpt.StateDict()
    sd4.add("model/split0", padded)
    expect_error(lambda: ck.load(sd4, path("kinds")), ErrorCode.SHAPE_MISMATCH, ["model/split0"])
    sd5 = h5ckpt.StateDict()
    sd5.add("model/i8", np.zeros((N, 3), dtype=np.int16))
    expect_error(lambda: ck.load(sd5, path("kinds")), ErrorCode.DTYPE_MISMATCH, ["model/i8"])
    ck.close()
    topo.close()


def test_async_and_lifetime():
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo)
    shape = [N, 1000]
    g = gvals(3, shape, "f32")
    spec = ShardSpec.split(shape, 0, N, R)

    # 1. Buffers changed right after save_async returns: the checkpoint has the values of the call.
    a = part(g, spec).copy()
    t = torch.from_numpy(part(g, spec).copy() + 1)
    sd = h5ckpt.StateDict()
    sd.add("model/a", a, shape, spec)
    sd.add("model/t", t, shape, spec)
    h = ck.save_async(sd, path("async-1"), step=1)
    a[:] = -1
    t.fill_(-1)
    rep = h.wait()
    check(rep.async_ and rep.path == path("async-1"), f"async report {rep}")
    check(h.wait().path == rep.path and h.test(), "wait() again, test() after the end")
    with h5ckpt.CheckpointReader.open(path("async-1")) as rd:
        eq(rd.read("model/a"), g, "async save: values at the call")
        eq(rd.read("model/t"), g + 1, "async save of a tensor: values at the call")

    # 2. Temporaries: the StateDict holds the only reference; freed memory would be reused below.
    sd = h5ckpt.StateDict()
    for j in range(4):
        sd.add(f"model/tmp{j}", part(gvals(10 + j, shape, "f32"), spec).copy(), shape, spec)
    junk = [np.full(1000, 12345.0, dtype=np.float32) for _ in range(64)]
    h = ck.save_async(sd, path("async-2"))
    junk += [np.full(1000, 666.0, dtype=np.float32) for _ in range(64)]
    h.wait()
    with h5ckpt.CheckpointReader.open(path("async-2")) as rd:
        for j in range(4):
            eq(rd.read(f"model/tmp{j}"), gvals(10 + j, shape, "f32"), f"temporary {j}")
    del junk

    # 3. The handle keeps the tensors alive until the save is done, then lets them go.
    x = torch.from_numpy(part(g, spec).copy())
    y = part(g, spec).copy() * 2
    wx, wy = weakref.ref(x), weakref.ref(y)
    sd = h5ckpt.StateDict()
    sd.add("model/x", x, shape, spec)
    sd.add("model/y", y, shape, spec)
    h = ck.save_async(sd, path("async-3"))
    del x, y, sd
    gc.collect()
    held_before = h.held_buffers
    alive_before = wx() is not None and wy() is not None
    while not h.test():
        time.sleep(0.005)
    gc.collect()
    check(held_before == 2 and alive_before, f"held {held_before} buffers while in flight, alive {alive_before}")
    check(h.held_buffers == 0 and wx() is None and wy() is None, "released once the save is done")
    with h5ckpt.CheckpointReader.open(path("async-3")) as rd:
        eq(rd.read("model/y"), g * 2, "tensors freed by the caller during the save")

    # 4. Another thread drops the caller's references and churns memory while save_async runs.
    holder = {"v": [part(gvals(20 + j, shape, "f32"), spec).copy() for j in range(3)]}
    sd = h5ckpt.StateDict()
    for j, v in enumerate(holder["v"]):
        sd.add(f"model/th{j}", v, shape, spec)
    stop = threading.Event()

    def churn():
        holder["v"] = None
        while not stop.is_set():
            [np.full(1000, -7.0, dtype=np.float32) for _ in range(32)]
            time.sleep(0)

    th = threading.Thread(target=churn)
    th.start()
    h = ck.save_async(sd, path("async-4"))
    del sd
    h.wait()
    stop.set()
    th.join()
    with h5ckpt.CheckpointReader.open(path("async-4")) as rd:
        for j in range(3):
            eq(rd.read(f"model/th{j}"), gvals(20 + j, shape, "f32"), f"save while another thread churns ({j})")

    # 5. Saving over an existing checkpoint: refused on every rank; allowed with overwrite.
    sd = h5ckpt.StateDict()
    sd.add("model/a", a, shape, spec)
    expect_error(lambda: ck.save_async(sd, path("async-1")), ErrorCode.ALREADY_EXISTS, ["async-1"])
    a[:] = part(g, spec) * 3
    ck.save_async(sd, path("async-1"), overwrite=True).wait()
    with h5ckpt.CheckpointReader.open(path("async-1")) as rd:
        eq(rd.read("model/a"), g * 3, "overwritten checkpoint")

    # 6. A synchronous Checkpointer (async_=False): save_async completes before it returns.
    with h5ckpt.Checkpointer(topo, async_=False) as ck_sync:
        h = ck_sync.save_async(sd, path("async-sync"))
        check(h.test() and not h.wait().async_, "async_=False saves synchronously")
    ck.close()
    topo.close()


def test_errors_same_everywhere():
    topo = h5ckpt.Topology.create(W, tp=N)
    ck = h5ckpt.Checkpointer(topo)
    shape = [2 * N, 4]
    g = gvals(5, shape, "f32")
    good = ShardSpec.split(shape, 0, N, R)

    # A shard outside the shape on the last rank only (found by the binding's check of the spec).
    sd = h5ckpt.StateDict()
    spec = ShardSpec.box_of([2 * N, 0], [2, 4]) if R == N - 1 else good
    sd.add("model/bad", part(g, good), shape, spec)
    check((sd.error is not None) == (R == N - 1), "the local problem is visible as sd.error")
    expect_error(lambda: ck.save(sd, path("err-1")), ErrorCode.INVALID_ARGUMENT, [f"rank {N - 1}:", "model/bad"])

    # Shards that are valid on each rank but wrong together (the library's own agreement).
    sd = h5ckpt.StateDict()
    if N == 1:
        sd.add("model/gap", np.zeros((2, 2), np.float32), [3, 2], ShardSpec.box_of([0, 0], [2, 2]))
    else:
        sd.add("model/gap", np.zeros((2, 2), np.float32), [N + 1, 2], ShardSpec.box_of([R, 0], [2, 2]))
    expect_error(lambda: ck.save(sd, path("err-2")), ErrorCode.INVALID_ARGUMENT, ["model/gap"])
    if N > 1:  # dtypes that disagree between ranks
        sd = h5ckpt.StateDict()
        sd.add("model/dt", part(g, good).astype(np.float64 if R == 0 else np.float32), shape, good)
        expect_error(lambda: ck.save(sd, path("err-3")), ErrorCode.DTYPE_MISMATCH, ["model/dt"])

    # A non-contiguous array on rank 0 only.
    sd = h5ckpt.StateDict()
    wide = np.zeros((2 * N, 8), np.float32)
    sd.add("model/nc", wide[:, ::2] if R == 0 else part(g, good).copy(), shape if R else [2 * N, 4],
           None if R == 0 else good)
    expect_error(lambda: ck.save(sd, path("err-4")), ErrorCode.INVALID_ARGUMENT, ["rank 0:", "not C-contiguous"])

    # A buffer of the wrong size, everywhere; dtypes that do not fit the buffer; not a buffer at all.
    sd = h5ckpt.StateDict()
    sd.add("model/size", np.zeros(3, np.float32), shape, good)
    expect_error(lambda: ck.save(sd, path("err-5")), ErrorCode.SHAPE_MISMATCH, ["model/size", "holds"])
    sd = h5ckpt.StateDict()
    sd.add("model/u32", np.zeros(4, np.uint32))
    expect_error(lambda: ck.save(sd, path("err-6")), ErrorCode.INVALID_ARGUMENT, ["cannot tell the dtype"])
    sd = h5ckpt.StateDict()
    sd.add("model/f2i", np.zeros(4, np.float32), dtype="i32")
    expect_error(lambda: ck.save(sd, path("err-7")), ErrorCode.DTYPE_MISMATCH, ["float32"])
    sd = h5ckpt.StateDict()
    sd.add("model/list", [1.0, 2.0])
    expect_error(lambda: ck.save(sd, path("err-8")), ErrorCode.INVALID_ARGUMENT, ["list"])
    sd = h5ckpt.StateDict()
    sd.add("model/dev", torch.zeros(4), device=h5ckpt.Device.CUDA)
    expect_error(lambda: ck.save(sd, path("err-9")), ErrorCode.INVALID_ARGUMENT, ["device"])

    # A read-only buffer can be saved, not loaded into.
    ro = part(g, good).copy()
    ro.flags.writeable = False
    sd = h5ckpt.StateDict()
    sd.add("model/ro", ro, shape, good)
    ck.save(sd, path("ro"))
    expect_error(lambda: ck.load(sd, path("ro")), ErrorCode.INVALID_ARGUMENT, ["read-only"])
    # The binding's checks come first: a read-only buffer fails the load before it looks for the path.
    expect_error(lambda: ck.load(sd, path("does-not-exist")), ErrorCode.INVALID_ARGUMENT, ["read-only"])
    sd = h5ckpt.StateDict()
    sd.add("model/ro", ro.copy(), shape, good)
    expect_error(lambda: ck.load(sd, path("does-not-exist")), ErrorCode.NOT_FOUND, ["does-not-exist"])

    # Misspelt options are Python errors (the same on every rank, before any collective).
    try:
        ck.save(sd, path("err-10"), stpe=3)
        raise AssertionError("unknown option accepted")
    except AttributeError:
        pass

    # After all that, a save and a load still work (no half-done collective left behind).
    sd = h5ckpt.StateDict()
    w = part(g, good).copy()
    sd.add("model/ok", w, shape, good)
    ck.save(sd, path("after-errors"))
    w[:] = 0
    ck.load(sd, path("after-errors"))
    eq(w, part(g, good), "save and load after errors")
    ck.close()
    topo.close()


def test_info_listing_prune():
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo)
    ck.set_attribute("trainer", "binding-test")
    if R == 0:
        os.makedirs(path("list"), exist_ok=True)
    W.Barrier()
    shape = [3, N + 2]
    sd = h5ckpt.StateDict()
    a = part(gvals(1, shape, "f64"), ShardSpec.split(shape, 1, N, R))
    sd.add("model/a", a, shape, ShardSpec.split(shape, 1, N, R))
    b = np.arange(5, dtype=np.int64)
    sd.add("model/b", b)
    for s in (1, 2, 3):
        rep = ck.save(sd, path("list", f"step-{s}"), step=s)
        check(rep.plan_cached == (s > 1), f"save plan cached from the second save: {rep.plan_cached}")
    info = h5ckpt.read_checkpoint_info(path("list"))
    check(info.path == path("list", "step-3") and info.step == 3, f"latest checkpoint {info.path} step {info.step}")
    check(info.attributes.get("trainer") == "binding-test", f"attributes {info.attributes}")
    check(info.saved_sizes == h5ckpt.ParallelSizes(1, N, 1), f"saved sizes {info.saved_sizes}")
    check([(c.tp, c.dp) for c in info.saved_coords] == [(0, r) for r in range(N)], "saved coords")
    check(info.format_version >= 1 and info.library_version == h5ckpt.version(), "versions")
    check(info.keys() == ["model/a", "model/b"], f"keys {info.keys()}")
    for t in info.tensors:
        want_shape = shape if t.key == "model/a" else [5]
        check(t.shape == want_shape and t.nbytes == int(np.prod(want_shape)) * 8, f"{t.key}: shape/nbytes")
        check(sum(rg.shard.numel() for rg in t.regions) == int(np.prod(want_shape)), f"{t.key}: regions cover it once")
        check(all(0 <= rg.writer_rank < N and (rg.checksum != 0 or len(rg.block_checksums) > 0) for rg in t.regions),
              f"{t.key}: writers, checksums")
    check(len(info.find("model/a").regions) == N and info.find("model/zzz") is None, "find")
    check(info.total_bytes() == 3 * (N + 2) * 8 + 40, f"total_bytes {info.total_bytes()}")
    h5ckpt.verify_checkpoint(info, R, N)
    check(h5ckpt.is_checkpoint_dir(path("list", "step-2")) and not h5ckpt.is_checkpoint_dir(path("list")),
          "is_checkpoint_dir")
    lst = h5ckpt.list_checkpoints(path("list"))
    check(lst.latest == "step-3" and sorted(e.name for e in lst.checkpoints) == ["step-1", "step-2", "step-3"],
          f"listing {lst.latest} {lst.checkpoints}")
    check([e.name for e in lst.checkpoints if e.latest] == ["step-3"], "the latest flag")
    W.Barrier()
    if R == 0:
        # A flipped byte in a tensor: the metadata still validates, the checksums do not.
        shutil.copytree(path("list", "step-2"), path("corrupt"))
        off = h5ckpt.read_checkpoint_info(path("corrupt")).find("model/b").file_offset
        with open(path("corrupt", "data.h5"), "r+b") as f:
            f.seek(off + 3)
            byte = f.read(1)
            f.seek(off + 3)
            f.write(bytes([byte[0] ^ 0x10]))
        ci = h5ckpt.read_checkpoint_info(path("corrupt"))
        try:
            h5ckpt.verify_checkpoint(ci)
            raise AssertionError("a corrupted checkpoint verified")
        except h5ckpt.Error as e:
            check(e.code == ErrorCode.CORRUPT and "model/b" in e.message, f"verify: {e}")
        pr = h5ckpt.prune_checkpoints(path("list"), keep_last=1, dry_run=True)
        check(pr.deleted == ["step-1", "step-2"] and pr.kept == ["step-3"], f"dry run {pr.deleted} {pr.kept}")
        pr = h5ckpt.prune_checkpoints(path("list"), h5ckpt.PruneOptions(keep_last=2))
        check(pr.deleted == ["step-1"] and not os.path.exists(path("list", "step-1")), f"prune {pr.deleted}")
    W.Barrier()
    ck.close()
    topo.close()


def test_retention():
    topo = h5ckpt.Topology.create(W, dp=N)
    if R == 0:
        os.makedirs(path("keep"), exist_ok=True)
    W.Barrier()
    sd = h5ckpt.StateDict()
    sd.add("model/v", np.arange(4, dtype=np.float32))
    with h5ckpt.Checkpointer(topo, h5ckpt.CheckpointerOptions(keep_last=2)) as ck:
        for s in (1, 2, 3):
            ck.save(sd, path("keep", f"step-{s}"), step=s)
    W.Barrier()
    names = sorted(e.name for e in h5ckpt.list_checkpoints(path("keep")).checkpoints)
    check(names == ["step-2", "step-3"], f"keep_last=2 kept {names}")
    topo.close()


def test_config():
    cfg = h5ckpt.parse_config('[checkpointer]\nio_threads = 3\nstaging_bytes = "1MiB"\n'
                              '[load]\naggregate_reads = true\n[save]\nchecksums = false\n', "inline.toml")
    check(cfg.checkpointer.io_threads == 3 and cfg.checkpointer.staging_bytes == 1 << 20, "checkpointer keys")
    check(cfg.load.aggregate_reads and not cfg.save.checksums, "load and save keys")
    cfg.checkpointer.io_threads = 2  # fields of the nested options change in place
    check(cfg.checkpointer.io_threads == 2, "nested fields are references")
    expect_error(lambda: h5ckpt.parse_config("[checkpointer]\nasynk = true\n", "bad.toml"), ErrorCode.INVALID_ARGUMENT,
                 ["asynk", "bad.toml"])
    os.environ["H5CKPT_IO_THREADS"] = "5"
    try:
        h5ckpt.apply_env(cfg)
        check(cfg.checkpointer.io_threads == 5, "apply_env")
        os.environ["H5CKPT_IO_THREADS"] = "two"
        expect_error(lambda: h5ckpt.apply_env(cfg), ErrorCode.INVALID_ARGUMENT, ["H5CKPT_IO_THREADS"])
        check(cfg.checkpointer.io_threads == 5, "a failed apply_env changes nothing")
    finally:
        del os.environ["H5CKPT_IO_THREADS"]
    check(h5ckpt.parse_byte_size("1.5GiB") == 1610612736 and h5ckpt.parse_byte_size("2KB") == 2000, "byte sizes")
    expect_error(lambda: h5ckpt.parse_byte_size("0.3KiB"), ErrorCode.INVALID_ARGUMENT)
    h5ckpt.set_log_level("error")
    expect_error(lambda: h5ckpt.set_log_level("verbose"), ErrorCode.INVALID_ARGUMENT, ["verbose"])
    topo = h5ckpt.Topology.create(W, dp=N)
    sd = h5ckpt.StateDict()
    sd.add("model/v", np.arange(6, dtype=np.float32))
    with h5ckpt.Checkpointer(topo, cfg) as ck:
        ck.save(sd, path("config"), cfg.save)
    info = h5ckpt.read_checkpoint_info(path("config"))
    check(all(rg.checksum == 0 and not rg.block_checksums for rg in info.find("model/v").regions),
          "checksums = false from the config")
    so = h5ckpt.SaveOptions(step=9, checksums=False)
    check(so.step == 9 and not so.checksums and so.device_stream == 0, "SaveOptions keywords")
    topo.close()


def test_loader_state():
    L = h5ckpt.loader
    cfg = L.LoaderConfig(seed=5, context_len=64, workers_per_rank=2)
    cfg.sources = [L.SourceSpec("a", 0.7, 10, 50), L.SourceSpec("b", 0.3, 5, 20)]
    cfg.validate()
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo)
    rl = L.RankLoader.fresh(cfg, N, R)
    check(len(rl.shards) == 2 and rl.replicated.num_shards == 2 * N, "a fresh rank loader")
    check([s.shard for s in rl.shards] == [2 * R, 2 * R + 1], "shard ids dp_rank * workers + worker")
    lc = L.LoaderCheckpoint()
    sd = h5ckpt.StateDict()
    lc.stage_save(sd, rl, R)
    check(sorted(sd.keys()) == sorted(["loader/replicated", f"loader/shard/dp{R}/worker0", f"loader/shard/dp{R}/worker1"]),
          f"staged keys {sd.keys()}")
    ck.save(sd, path("loader"))
    with h5ckpt.CheckpointReader.open(path("loader")) as rd:
        check(rd.read("loader/replicated").tobytes() == L.serialize(rl.replicated), "replicated bytes")
        for d in range(N):
            for w in range(2):
                raw = rd.read(f"loader/shard/dp{d}/worker{w}").tobytes()
                shard = L.parse_shard(raw)
                check(shard.shard == 2 * d + w, f"stored shard dp{d}/worker{w}")
                if d == R:
                    check(shard == rl.shards[w] and raw == L.serialize(rl.shards[w]), "this rank's shard bytes")
    check(L.shard_key(3, 1) == "loader/shard/dp3/worker1" and L.parse_shard_key("loader/shard/dp3/worker1") == (3, 1),
          "shard keys")
    info = h5ckpt.read_checkpoint_info(path("loader"))
    lc2 = L.LoaderCheckpoint()
    sd2 = h5ckpt.StateDict()
    lc2.stage_load(sd2, info)
    check(len(sd2) == 1 + 2 * N, "stage_load stages every shard")
    ck.load(sd2, path("loader"))
    same = lc2.finish_load(N, R, 2)
    check(same.replicated == rl.replicated and all(a == b for a, b in zip(same.shards, rl.shards)),
          "the same shard count loads the saved state unchanged")
    check(len(lc2.saved_shards()) == 2 * N and lc2.saved_replicated() == rl.replicated, "saved_shards")
    merged = lc2.finish_load(1, 0, 1)
    check(merged.replicated.num_shards == 1 and len(merged.shards) == 1, "merged into one shard")
    rs = L.reshard(lc2.saved_replicated(), lc2.saved_shards(), 3)
    check(len(rs.shards) == 3 and rs.replicated.num_shards == 3, "reshard to 3")
    # Staging again frees what the first StateDict references: its next save fails cleanly.
    lc.stage_save(h5ckpt.StateDict(), rl, R)
    expect_error(lambda: ck.save(sd, path("loader-stale")), ErrorCode.INVALID_ARGUMENT, ["staged other items"])
    ck.close()
    topo.close()


def test_convert_elements():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-40, 38, 4096)).astype(np.float32)
    u = x.view(np.uint32)
    u[::3] = (u[::3] & 0xFFFF0000) | 0x8000  # ties
    x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -3e-39, 3.3895314e38, 3.4028235e38],
                                    dtype=np.float32)])
    dst = np.zeros(x.size, dtype=np.uint16)
    h5ckpt.convert_elements(x, dst, dst_dtype="bf16")
    want = f32_to_bf16_rne(x)
    want[np.isinf(x)] = (x[np.isinf(x)].view(np.uint32) >> 16).astype(np.uint16)
    eq(dst, want, "f32 -> bf16 against numpy's nearest-even")
    t = torch.zeros(x.size, dtype=torch.bfloat16)
    h5ckpt.convert_elements(torch.from_numpy(x), t)
    check(torch.equal(t.view(torch.int16), torch.from_numpy(x).to(torch.bfloat16).view(torch.int16)),
          "f32 -> bf16 against torch's rounding")
    h16 = np.zeros(x.size, dtype=np.float16)
    with np.errstate(over="ignore"):
        h5ckpt.convert_elements(x, h16)
        eq(h16, x.astype(np.float16), "f32 -> f16 against numpy")
    back = np.zeros(x.size, dtype=np.float32)
    h5ckpt.convert_elements(dst, back, src_dtype="bf16")
    eq(back, bf16_bits_to_f32(dst), "bf16 -> f32 is exact")
    expect_error(lambda: h5ckpt.convert_elements(np.zeros(3, np.int32), np.zeros(3, np.float32)), ErrorCode.DTYPE_MISMATCH)
    expect_error(lambda: h5ckpt.convert_elements(np.zeros(3, np.float32), np.zeros(4, np.float32)),
                 ErrorCode.SHAPE_MISMATCH)
    check(h5ckpt.dtype_size(DType.BF16) == 2 and h5ckpt.dtype_name(DType.F8E4M3) == "f8e4m3"
          and h5ckpt.dtype_from_name("bfloat16") == DType.BF16, "dtype helpers")


def test_zero_dim_and_bytes():
    topo = h5ckpt.Topology.create(W, dp=N)
    ck = h5ckpt.Checkpointer(topo)
    sd = h5ckpt.StateDict()
    s0 = torch.tensor(3.5)
    n0 = np.array(7, dtype=np.int64)
    blob = np.frombuffer(struct.pack("<qd", 42, 2.5), dtype=np.uint8).copy()
    sd.add("extra/t0", s0)
    sd.add("extra/n0", n0)
    sd.add_bytes("extra/blob", blob)
    check(sd.item("extra/t0")["global_shape"] == [1], "0-d stored as [1]")
    ck.save(sd, path("zero-dim"))
    s0.fill_(0)
    n0[...] = 0
    blob[:] = 0
    ck.load(sd, path("zero-dim"))
    check(float(s0) == 3.5 and int(n0) == 7 and struct.unpack("<qd", blob.tobytes()) == (42, 2.5), "0-d and bytes load")
    sd2 = h5ckpt.StateDict()
    sd2.add_bytes("extra/blob", np.zeros(8, dtype=np.uint8))
    expect_error(lambda: ck.load(sd2, path("zero-dim")), ErrorCode.SHAPE_MISMATCH, ["extra/blob"])
    ck.close()
    topo.close()


def main():
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(ROOT)
    W.Barrier()
    t_all = time.time()
    try:
        test_topology()
        globals_ = test_save_shard_kinds()
        tests = [lambda: test_load_reshard(globals_), test_async_and_lifetime, test_errors_same_everywhere,
                 test_info_listing_prune, test_retention, test_config, test_loader_state, test_convert_elements,
                 test_zero_dim_and_bytes]
        names = ["load_reshard", "async_and_lifetime", "errors_same_everywhere", "info_listing_prune", "retention",
                 "config", "loader_state", "convert_elements", "zero_dim_and_bytes"]
        if R == 0:
            print("ok   topology\nok   save_shard_kinds", flush=True)
        for name, t in zip(names, tests):
            t0 = time.time()
            t()
            W.Barrier()
            if R == 0:
                print(f"ok   {name} ({time.time() - t0:.2f} s)", flush=True)
    except BaseException:
        sys.stderr.write(f"FAIL on rank {R} of {N}:\n{traceback.format_exc()}")
        sys.stderr.flush()
        W.Abort(1)
    if R == 0:
        print(f"all binding tests passed on {N} rank(s) in {time.time() - t_all:.1f} s", flush=True)


if __name__ == "__main__":
    main()
