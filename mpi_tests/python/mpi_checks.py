"""Checks and a runner shared by the MPI Python tests: a failure on any rank aborts the whole job
(so mpirun exits non-zero), and rank 0 reports each test as it passes."""
import sys
import time
import traceback

import numpy as np


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def eq(a, b, what):
    """Element-by-element equality of two arrays of the same shape and dtype."""
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}")
    check(a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}")
    bad = np.argwhere(a != b)
    check(len(bad) == 0, f"{what}: {len(bad)} elements differ, first at {bad[:3].tolist()}: "
                         f"got {a[tuple(bad[0])] if len(bad) else '?'}, want {b[tuple(bad[0])] if len(bad) else '?'}")


def run(comm, tests, summary, before=None):
    """Runs (name, fn) pairs in order on every rank of `comm`; `before` (optional) first. Any
    exception prints the traceback with the rank and aborts the job; at the end rank 0 prints
    `summary` with the total time."""
    rank, size = comm.Get_rank(), comm.Get_size()
    t_all = time.time()
    try:
        if before:
            before()
        for name, fn in tests:
            t0 = time.time()
            fn()
            comm.Barrier()
            if rank == 0:
                print(f"ok   {name} ({time.time() - t0:.2f} s)", flush=True)
    except BaseException:
        sys.stderr.write(f"FAIL on rank {rank} of {size}:\n{traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)
    if rank == 0:
        print(f"{summary} in {time.time() - t_all:.1f} s", flush=True)
