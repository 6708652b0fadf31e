#!/usr/bin/env python3
"""The load contract and parent directories from Python, under mpirun: a save into a directory tree
that does not exist yet; one error naming every missing key and shape mismatch, the same on every
rank; LoadOptions.strictness (enum or name), strict=False and check_only. A failure on any rank
aborts the job (non-zero exit)."""
import os
import shutil
import sys

import numpy as np
from mpi4py import MPI

import h5ckpt
from mpi_checks import check, eq, run

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-contract-py")
ROWS, COLS = 2 * N + 1, 3
KEYS = ["model/a", "model/b", "opt/x", "opt/y"]


def my_rows():
    q, m = divmod(ROWS, N)
    lo = R * q + min(R, m)
    return lo, lo + q + (1 if R < m else 0)


def formula(k):
    return (np.arange(ROWS * COLS, dtype=np.float32) + 100 * (k + 1)).reshape(ROWS, COLS)


topo = h5ckpt.Topology.create(W, tp=1, dp=N, pp=1)
ck = h5ckpt.Checkpointer(topo)
GOOD = os.path.join(ROOT, "deep", "er", "tree", "step-1")  # none of it exists yet


def state(keys, shapes=None, fill=0.0):
    sd, bufs = h5ckpt.StateDict(), {}
    lo, hi = my_rows()
    for k in keys:
        shape = (shapes or {}).get(k, [ROWS, COLS])
        if shape == [ROWS, COLS]:
            bufs[k] = np.full((hi - lo, COLS), fill, dtype=np.float32)
            sd.add(k, bufs[k], [ROWS, COLS], h5ckpt.ShardSpec.box_of([lo, 0], [hi - lo, COLS]))
        else:
            bufs[k] = np.full(shape, fill, dtype=np.float32)
            sd.add(k, bufs[k])
    return sd, bufs


def same_everywhere(text):
    texts = W.allgather(text)
    check(all(t == texts[0] for t in texts), f"ranks disagree: {texts}")


def test_save_makes_parents():
    sd, bufs = state(KEYS)
    lo, hi = my_rows()
    for i, k in enumerate(KEYS):
        bufs[k][:] = formula(i)[lo:hi]
    ck.save(sd, GOOD)
    check(os.path.isdir(GOOD), "checkpoint directory")
    with open(os.path.join(os.path.dirname(GOOD), "latest")) as f:
        check(f.read().strip() == "step-1", "latest")
    # A regular file in the way is a clear error on every rank.
    blocker = os.path.join(ROOT, "a_file")
    if R == 0:
        with open(blocker, "w") as f:
            f.write("x")
    W.Barrier()
    try:
        ck.save(sd, os.path.join(blocker, "sub", "step-1"))
        raise AssertionError("a save under a regular file succeeded")
    except h5ckpt.Error as e:
        check(f"'{blocker}' exists and is not a directory" in str(e), str(e))
        same_everywhere(str(e))


def test_one_error_names_everything():
    sd, bufs = state(["model/a", "model/b", "opt/x", "model/c", "model/d", "model/e"],
                     {"model/b": [ROWS, COLS + 1], "opt/x": [7]}, fill=-1.0)
    try:
        ck.load(sd, os.path.dirname(GOOD))
        raise AssertionError("a load with missing keys and wrong shapes succeeded")
    except h5ckpt.Error as e:
        msg = str(e)
        for part in ("3 keys missing from the checkpoint: 'model/c', 'model/d', 'model/e'",
                     f"2 shape mismatches: 'model/b': checkpoint has global shape [{ROWS},{COLS}], the state wants "
                     f"[{ROWS},{COLS + 1}], 'opt/x': checkpoint has global shape [{ROWS},{COLS}], the state wants [7]",
                     "1 key in the checkpoint the state does not ask for (not an error): 'opt/y'"):
            check(part in msg, f"missing {part!r} in {msg}")
        same_everywhere(msg)
    eq(bufs["model/a"], np.full_like(bufs["model/a"], -1.0), "nothing read before the contract failed")
    rep = ck.load(sd, GOOD, check_only=True)
    check(rep.missing_keys == ["model/c", "model/d", "model/e"], rep.missing_keys)
    check(rep.unexpected_keys == ["opt/y"], rep.unexpected_keys)
    check(len(rep.shape_mismatches) == 2 and rep.shape_mismatches[0].startswith("'model/b'"), rep.shape_mismatches)
    check(rep.dtype_mismatches == [] and rep.bytes_read == 0, repr(rep))


def test_strictness_modes():
    lo, hi = my_rows()
    sd, bufs = state(["model/a"])
    rep = ck.load(sd, GOOD)  # default: ignore_unexpected
    check(rep.unexpected_keys == ["model/b", "opt/x", "opt/y"], rep.unexpected_keys)
    eq(bufs["model/a"], formula(0)[lo:hi], "model/a")
    for mode in ("raise_all", h5ckpt.LoadStrictness.RAISE_ALL):
        try:
            ck.load(sd, GOOD, strictness=mode)
            raise AssertionError("raise_all accepted unexpected keys")
        except h5ckpt.Error as e:
            check(e.code == h5ckpt.ErrorCode.INVALID_ARGUMENT, repr(e.code))
            check("3 keys in the checkpoint the state does not ask for: 'model/b', 'opt/x', 'opt/y'" in str(e), str(e))
    full, fb = state(KEYS)
    rep = ck.load(full, GOOD, strictness="raise_all")
    check(rep.unexpected_keys == [], rep.unexpected_keys)
    for i, k in enumerate(KEYS):
        eq(fb[k], formula(i)[lo:hi], k)
    lax, lb = state(["model/a", "model/zz"], fill=3.0)
    for kw in ({"strictness": "allow_missing"}, {"strictness": h5ckpt.LoadStrictness.ALLOW_MISSING}, {"strict": False}):
        lb["model/a"][:] = 0
        rep = ck.load(lax, GOOD, **kw)
        check(rep.missing_keys == ["model/zz"], f"{kw}: {rep.missing_keys}")
        eq(lb["model/a"], formula(0)[lo:hi], f"{kw}: model/a")
        eq(lb["model/zz"], np.full_like(lb["model/zz"], 3.0), f"{kw}: a missing key's buffer is untouched")
    try:
        h5ckpt.LoadOptions(strictness="sloppy")
        raise AssertionError("an unknown strictness name was accepted")
    except ValueError as e:
        check("'sloppy'" in str(e), str(e))


def setup():
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(ROOT)
    W.Barrier()


run(W, [("save makes parents", test_save_makes_parents), ("one error names everything", test_one_error_names_everything),
        ("strictness modes", test_strictness_modes)], f"load contract at {N} ranks: all passed", before=setup)
ck.close()
topo.close()
