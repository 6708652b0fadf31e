#!/usr/bin/env python3
"""Publishes the weights of the torch GPT example trainer (train_gpt.py) to a group of "inference"
ranks in another tensor-parallel layout after every step, with h5ckpt.StateTransfer (no storage),
and checks that every inference rank holds exactly the trainer's weights.

    mpirun -np 6 /usr/bin/python3 docs/examples/python/publish_gpt.py --tp 2 --dp 2 --infer-tp 1 --steps 5

The first tp*dp ranks train (TP x DP, ZeRO-sharded Adam, as train_gpt.py); the others serve: they
are cut into replicas of --infer-tp ranks, each holding its TP part of every model weight (numpy
arrays, no torch modules needed). Each step the trainer publishes the new weights as version
`step`; after the first version only the checksum blocks that changed move (every weight changes
under Adam, so here almost all of them do; a frozen embedding would not move at all).
Checked every step: the weights assembled from the trainer ranks (on world rank 0) are broadcast
and each inference rank compares its parts element by element.
"""
import argparse
import os
import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt as tg  # noqa: E402  (the model, its sharding rules, the data and the optimizer)

import h5ckpt  # noqa: E402
import h5ckpt.torch as ht  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--infer-tp", type=int, default=1, help="TP size of each inference replica")
    ap.add_argument("--no-delta", action="store_true", help="send every block every step")
    a, rest = ap.parse_known_args()
    t = tg.parse_args(rest)
    t.infer_tp, t.no_delta = a.infer_tp, a.no_delta
    return t


def run(a):
    world = MPI.COMM_WORLD
    r, n = world.Get_rank(), world.Get_size()
    ntrain = a.tp * a.dp
    ninfer = n - ntrain
    if ninfer < a.infer_tp or ninfer % a.infer_tp:
        raise SystemExit(f"{n} ranks: {ntrain} train, the other {ninfer} must be replicas of --infer-tp {a.infer_tp}")
    if a.heads % a.tp or a.heads % a.infer_tp:
        raise SystemExit("--tp and --infer-tp must divide --heads")
    torch.set_num_threads(1)
    trainer = r < ntrain
    group = world.Split(color=0 if trainer else 1, key=r)
    xfer = h5ckpt.StateTransfer(world)
    src = dst = None
    if trainer:
        tp_rank, dp_rank = r % a.tp, r // a.tp
        tp_comm = group.Split(color=dp_rank, key=tp_rank)
        dp_comm = group.Split(color=tp_rank, key=dp_rank)
        model = tg.GPT(a, tg.TP(tp_comm))
        zero = tg.ZeroAdam(model, dp_comm, a.lr)
        torch.manual_seed(a.seed)
        np.random.seed(a.seed)
        tg.random.seed(a.seed)
        src = h5ckpt.StateDict()  # the weights only: inference needs no optimizer state
        ht.add_module(src, model, model.pl, buffers=False)
    else:
        i = r - ntrain
        itp = i % a.infer_tp

        class _Rank:  # placements() wants .size and .rank
            size, rank = a.infer_tp, itp

        weights = {}
        dst = h5ckpt.StateDict()
        for name, pl in tg.placements(a, _Rank).items():
            buf = np.full(pl.shard.box.shape, np.nan, dtype=np.float32)
            weights[name] = (buf, pl)
            dst.add("model/" + name, buf, pl.global_shape, pl.shard)

    bsz = a.batch
    for step in range(0, a.steps + 1):
        if trainer and step > 0:
            lo, hi = bsz * dp_rank // a.dp, bsz * (dp_rank + 1) // a.dp
            tokens, targets = tg.global_batch(a)
            for p in model.parameters():
                p.grad = None
            (model.loss_sum(tokens[lo:hi], targets[lo:hi]) / (bsz * a.seq)).backward()
            zero.reduce_gradients()
            zero.step(tg.lr_at(a, step))
        rep = xfer.transfer(src, dst, version=step, delta=not a.no_delta)
        # The check: the trainer's weights, assembled on world rank 0, against every inference part.
        full = tg.gather_global(src, group) if trainer else None
        full = world.bcast(full, root=0)
        bad = 0
        if not trainer:
            for name, (buf, pl) in weights.items():
                b = pl.shard.box
                want = full["model/" + name][tuple(slice(o, o + s) for o, s in zip(b.offset, b.shape))]
                bad += int(np.count_nonzero(want.view(np.uint32) != buf.view(np.uint32)))
        bad = world.allreduce(bad)
        got = world.allreduce(rep.bytes_received)
        total = world.allreduce(rep.bytes_total)
        if r == 0:
            print(f"step {step}: published version {rep.version} ({'delta' if rep.delta else 'full'}): "
                  f"{got} of {total} bytes moved, {bad} mismatching elements", flush=True)
        if bad:
            raise SystemExit(f"step {step}: {bad} elements on the inference ranks differ from the trainer's")
    xfer.close()
    if r == 0:
        print(f"published {a.steps + 1} versions to {ninfer // a.infer_tp} replica(s) of TP{a.infer_tp}: all equal",
              flush=True)


def main():
    a = parse_args()
    try:
        run(a)
    except SystemExit as e:
        if e.code not in (None, 0):
            sys.stderr.write(f"rank {MPI.COMM_WORLD.Get_rank()}: {e.code}\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(2)
    except BaseException:
        sys.stderr.write(f"rank {MPI.COMM_WORLD.Get_rank()}: " + traceback.format_exc())
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


if __name__ == "__main__":
    main()
