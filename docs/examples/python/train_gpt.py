#!/usr/bin/env python3
"""A small GPT in torch.nn, trained with tensor parallelism (TP) x data parallelism (DP) over mpi4py,
checkpointed with h5ckpt, resumable under another TP/DP size.

    mpirun -np 4 /usr/bin/python3 docs/examples/python/train_gpt.py --tp 2 --dp 2 \
        --steps 10 --save-every 3 --ckpt-dir /tmp/gpt-ckpt
    mpirun -np 3 /usr/bin/python3 docs/examples/python/train_gpt.py --tp 1 --dp 3 \
        --steps 20 --save-every 3 --ckpt-dir /tmp/gpt-ckpt      # resumes from /tmp/gpt-ckpt/latest

The example's own sharding rules (Megatron style):
  - wte (token embedding) and lm_head: split by vocabulary rows over TP (vocabulary-parallel; the
    default vocabulary of 61 rows splits unevenly), with a vocabulary-parallel cross-entropy;
  - attention qkv (rows head-major: head h owns rows [3*hd*h, 3*hd*(h+1))) and mlp.fc1: split by
    output rows over TP (column-parallel); attention proj and mlp.fc2: split by input columns
    (row-parallel), their outputs summed over TP; layer norms, wpe and row-parallel biases replicated.
  - DP: every rank computes the gradient of its slice of the global batch; gradients are summed over
    DP; the Adam state is sharded ZeRO-1 style: DP rank d owns elements [n*d/DP, n*(d+1)/DP) of the
    flattening of each TP-local parameter (n elements), updates them, and the updated slices are
    all-gathered over DP.
Data: every rank draws the whole global batch from torch's, numpy's and Python's RNG (the same
numbers on every rank) and takes its slice, so the data does not depend on the layout, and the RNG
states are part of the checkpoint (h5ckpt.torch.ExtraState).

The checkpoint (keys without ranks, global shapes): model/<param>, optimizer/{exp_avg,exp_avg_sq,
step}/<param> (flat ranges of the TP parts), extra/rng/{torch,numpy,python}, extra/step,
extra/values. Any TP dividing the head count and any DP can resume it.

Options for tests: --stop-at N ends after step N (an interruption), --log FILE writes one JSON line per
step, --dump-dir DIR writes the global state (assembled from every rank's part) as .npz right after
each save (saved-stepN.npz), right after a load (loaded-stepN.npz) and at the end (final-stepN.npz).
"""
import argparse
import json
import math
import os
import random
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import h5ckpt
import h5ckpt.torch as ht


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--steps", type=int, required=True, help="train until this global step")
    ap.add_argument("--save-every", type=int, default=0, help="save asynchronously every K steps (0: never)")
    ap.add_argument("--ckpt-dir", default=None, help="checkpoint directory; resumes from its `latest` when present")
    ap.add_argument("--stop-at", type=int, default=None, help="stop after this step (default: --steps)")
    ap.add_argument("--sync-saves", action="store_true", help="Checkpointer.save instead of save_async")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=61)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=12, help="global batch (samples per step)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log", default=None, help="JSON lines: step, loss, lr")
    ap.add_argument("--dump-dir", default=None, help="write the global state as .npz after saves, loads and at the end")
    args = ap.parse_args(argv)
    if args.stop_at is None:
        args.stop_at = args.steps
    return args


# ---- tensor-parallel autograd pieces (mpi4py collectives on CPU tensors) ----------------------

class TP:
    """The TP group: this rank's index, size and communicator."""

    def __init__(self, comm):
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()

    def allreduce(self, t, op=MPI.SUM):
        if self.size == 1:
            return t
        a = t.detach().contiguous().numpy().copy()
        self.comm.Allreduce(MPI.IN_PLACE, a, op=op)
        return torch.from_numpy(a)


class _CopyToTP(torch.autograd.Function):
    """Entry of a column-parallel region: identity forward, gradients summed over TP backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.tp.allreduce(g), None


class _ReduceFromTP(torch.autograd.Function):
    """Exit of a row-parallel region: partial outputs summed over TP forward, identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        return tp.allreduce(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _VocabParallelCE(torch.autograd.Function):
    """Sum over tokens of the cross-entropy of logits split by vocabulary rows over TP."""

    @staticmethod
    def forward(ctx, logits, target, vstart, tp):
        vlocal = logits.shape[1]
        m = tp.allreduce(logits.max(dim=1).values, op=MPI.MAX)
        z = logits - m[:, None]
        e = torch.exp(z)
        s = tp.allreduce(e.sum(dim=1))
        in_range = (target >= vstart) & (target < vstart + vlocal)
        idx = (target - vstart).clamp(0, vlocal - 1)
        zt = tp.allreduce(z.gather(1, idx[:, None]).squeeze(1) * in_range)
        ctx.save_for_backward(e / s[:, None], idx, in_range)
        return (torch.log(s) - zt).sum()

    @staticmethod
    def backward(ctx, g):
        softmax, idx, in_range = ctx.saved_tensors
        grad = softmax.clone()
        grad[torch.arange(grad.shape[0]), idx] -= in_range.to(grad.dtype)
        return grad * g, None, None, None


# ---- the model ---------------------------------------------------------------------------------

def param_table(a):
    """name -> (global shape, TP split dimension or None): the example's sharding rules."""
    H, V, T = a.hidden, a.vocab, a.seq
    t = {"wte.weight": ([V, H], 0), "wpe.weight": ([T, H], None)}
    for i in range(a.layers):
        p = f"h.{i}."
        t.update({
            p + "ln1.weight": ([H], None), p + "ln1.bias": ([H], None),
            p + "attn.qkv.weight": ([3 * H, H], 0),
            p + "attn.proj.weight": ([H, H], 1), p + "attn.proj.bias": ([H], None),
            p + "ln2.weight": ([H], None), p + "ln2.bias": ([H], None),
            p + "mlp.fc1.weight": ([4 * H, H], 0), p + "mlp.fc1.bias": ([4 * H], 0),
            p + "mlp.fc2.weight": ([H, 4 * H], 1), p + "mlp.fc2.bias": ([H], None),
        })
    t.update({"ln_f.weight": ([H], None), "ln_f.bias": ([H], None), "lm_head.weight": ([V, H], 0)})
    return t


def placements(a, tp):
    return {name: (ht.Placement.split(shape, dim, tp.size, tp.rank) if dim is not None else ht.Placement.whole(shape))
            for name, (shape, dim) in param_table(a).items()}


def init_global(name, shape, gen):
    """Global initial value of a parameter (the same for every layout)."""
    if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_f.weight":
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    return torch.randn(shape, generator=gen) * 0.08


def local_part(full, pl):
    b = pl.shard.box
    return full[tuple(slice(o, o + s) for o, s in zip(b.offset, b.shape))].clone()


class Block(torch.nn.Module):
    def __init__(self, a, tp):
        super().__init__()
        H = a.hidden
        self.tp = tp
        self.heads_local = a.heads // tp.size
        self.hd = H // a.heads
        hl = self.heads_local * self.hd
        self.ln1 = torch.nn.LayerNorm(H)
        self.ln2 = torch.nn.LayerNorm(H)
        self.attn = torch.nn.Module()
        # No qkv bias: the key bias has a zero gradient in exact arithmetic (softmax ignores a shift
        # shared by all keys), so in floats its gradient is rounding noise, which Adam scales up to
        # steps of size lr whose signs depend on the order of float sums, i.e. on the layout.
        self.attn.qkv = torch.nn.Linear(H, 3 * hl, bias=False)
        self.attn.proj = torch.nn.Linear(hl, H)
        self.mlp = torch.nn.Module()
        self.mlp.fc1 = torch.nn.Linear(H, 4 * H // tp.size)
        self.mlp.fc2 = torch.nn.Linear(4 * H // tp.size, H)

    def forward(self, x):
        B, T, _ = x.shape
        h = _CopyToTP.apply(self.ln1(x), self.tp)
        qkv = F.linear(h, self.attn.qkv.weight).view(B, T, self.heads_local, 3, self.hd)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # [B, heads, T, hd]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.heads_local * self.hd)
        x = x + _ReduceFromTP.apply(F.linear(y, self.attn.proj.weight), self.tp) + self.attn.proj.bias
        h = _CopyToTP.apply(self.ln2(x), self.tp)
        h = F.gelu(F.linear(h, self.mlp.fc1.weight, self.mlp.fc1.bias))
        return x + _ReduceFromTP.apply(F.linear(h, self.mlp.fc2.weight), self.tp) + self.mlp.fc2.bias


class GPT(torch.nn.Module):
    def __init__(self, a, tp):
        super().__init__()
        self.tp = tp
        self.pl = placements(a, tp)
        vl = self.pl["wte.weight"].shard.box.shape[0]
        self.vstart = self.pl["wte.weight"].shard.box.offset[0]
        self.wte = torch.nn.Embedding(vl, a.hidden)
        self.wpe = torch.nn.Embedding(a.seq, a.hidden)
        self.h = torch.nn.ModuleList([Block(a, tp) for _ in range(a.layers)])
        self.ln_f = torch.nn.LayerNorm(a.hidden)
        self.lm_head = torch.nn.Linear(a.hidden, vl, bias=False)
        gen = torch.Generator().manual_seed(a.seed + 1)
        with torch.no_grad():
            params = dict(self.named_parameters())
            assert sorted(params) == sorted(self.pl), sorted(set(params) ^ set(self.pl))
            for name, (shape, _) in param_table(a).items():  # a fixed order: the same draws everywhere
                params[name].copy_(local_part(init_global(name, shape, gen), self.pl[name]))

    def loss_sum(self, tokens, targets):
        B, T = tokens.shape
        local = (tokens >= self.vstart) & (tokens < self.vstart + self.wte.num_embeddings)
        emb = self.wte((tokens - self.vstart).clamp(0, self.wte.num_embeddings - 1)) * local[..., None]
        x = _ReduceFromTP.apply(emb, self.tp) + self.wpe.weight[:T]
        for blk in self.h:
            x = blk(x)
        x = _CopyToTP.apply(self.ln_f(x), self.tp)
        logits = F.linear(x, self.lm_head.weight).reshape(B * T, -1)
        return _VocabParallelCE.apply(logits, targets.reshape(-1), self.vstart, self.tp)


# ---- ZeRO-1 Adam over DP -----------------------------------------------------------------------

class ZeroAdam:
    """torch.optim.Adam over this DP rank's flat slices of the (TP-local) parameters."""

    def __init__(self, model, dp_comm, lr):
        self.comm = dp_comm
        self.dp, self.d = dp_comm.Get_size(), dp_comm.Get_rank()
        self.entries = []  # (name, param, shard parameter, begin, end, counts)
        for name, p in model.named_parameters():
            n = p.numel()
            bounds = [n * i // self.dp for i in range(self.dp + 1)]
            b, e = bounds[self.d], bounds[self.d + 1]
            shard = torch.nn.Parameter(p.detach().reshape(-1)[b:e].clone())
            counts = [bounds[i + 1] - bounds[i] for i in range(self.dp)]
            self.entries.append((name, p, shard, b, e, counts))
        self.opt = torch.optim.Adam([s for _, _, s, _, _, _ in self.entries], lr=lr, betas=(0.9, 0.95), eps=1e-8)
        ht.init_optimizer_state(self.opt)  # the state exists before step 1, so a load can fill it

    def named_shards(self):
        return [(name, s) for name, _, s, _, _, _ in self.entries]

    def shard_placements(self, model_pl):
        return {name: model_pl[name].flat_range(b, e) for name, _, _, b, e, _ in self.entries}

    def reduce_gradients(self):
        flat = torch.cat([p.grad.reshape(-1) for _, p, _, _, _, _ in self.entries]).numpy()
        if self.dp > 1:
            self.comm.Allreduce(MPI.IN_PLACE, flat)
        off = 0
        for _, p, shard, b, e, _ in self.entries:
            n = p.numel()
            shard.grad = torch.from_numpy(flat[off + b:off + e].copy())
            off += n

    def step(self, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.gather()

    def gather(self):
        """Every DP rank's updated slices into the full TP-local parameters."""
        with torch.no_grad():
            for _, p, shard, b, e, counts in self.entries:
                full = p.data.reshape(-1).numpy()  # a view: p is contiguous
                if self.dp == 1:
                    full[:] = shard.detach().numpy()
                else:
                    displs = [sum(counts[:i]) for i in range(self.dp)]
                    self.comm.Allgatherv(shard.detach().numpy(), [full, counts, displs, MPI.FLOAT])

    def refresh_shards(self):
        """After a load of the parameters: the master slices from them."""
        with torch.no_grad():
            for _, p, shard, b, e, _ in self.entries:
                shard.copy_(p.detach().reshape(-1)[b:e])


def lr_at(a, step):
    warm = 3
    if step <= warm:
        return a.lr * step / warm
    frac = (step - warm) / max(1, a.steps - warm)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# ---- data: the same global batch on every rank, from the three RNGs ----------------------------

def global_batch(a):
    probs = 1.0 / torch.arange(1, a.vocab + 1, dtype=torch.float64)  # Zipf-like unigram frequencies
    toks = torch.multinomial(probs, a.batch * (a.seq + 1), replacement=True).view(a.batch, a.seq + 1)
    period = np.random.randint(2, a.seq // 2 + 1, size=a.batch)  # second half repeats: learnable copying
    for i in range(a.batch):
        for j in range(a.seq // 2, a.seq + 1):
            toks[i, j] = toks[i, j - int(period[i])]
    order = list(range(a.batch))
    random.shuffle(order)
    toks = toks[order]
    return toks[:, :-1], toks[:, 1:]


# ---- global view of the state, for the tests' dumps --------------------------------------------

def gather_global(sd, world):
    """Assembles every item of the StateDict into its global array on world rank 0 from each rank's
    part (numpy only, following each item's ShardSpec). Replicas must be bit-identical."""
    parts = []
    for key in sd.keys():
        it = sd.item(key)
        buf = sd.buffer(key)
        arr = buf.detach().numpy() if isinstance(buf, torch.Tensor) else np.asarray(buf)
        arr = np.ascontiguousarray(arr).reshape(-1)
        spec = it["shard"]
        parts.append((key, list(it["global_shape"]), list(spec.box.offset), list(spec.box.shape), spec.flat,
                      arr.copy()))
    everyone = world.gather(parts, root=0)
    if world.Get_rank() != 0:
        return None
    out, seen = {}, {}
    for rank_parts in everyone:
        for key, gshape, off, shape, flat, data in rank_parts:
            ident = (key, tuple(off), tuple(shape), flat)
            if ident in seen:
                if not np.array_equal(seen[ident].view(np.uint8), data.view(np.uint8)):
                    raise RuntimeError(f"replicas of {key} {ident[1:]} differ between ranks")
                continue
            seen[ident] = data
            g = out.setdefault(key, np.zeros(gshape, dtype=data.dtype))
            sl = tuple(slice(o, o + s) for o, s in zip(off, shape))
            if flat is None:
                g[sl] = data.reshape(shape)
            else:
                tmp = g[sl].copy().reshape(-1)
                tmp[flat[0]:flat[1]] = data
                g[sl] = tmp.reshape(shape)
    return out


def dump(sd, world, a, name):
    if not a.dump_dir:
        return
    g = gather_global(sd, world)
    if world.Get_rank() == 0:
        os.makedirs(a.dump_dir, exist_ok=True)
        np.savez(os.path.join(a.dump_dir, name), **{k.replace("/", "|"): v for k, v in g.items()})


# ---- main --------------------------------------------------------------------------------------

def train(a):
    world = MPI.COMM_WORLD
    if world.Get_size() != a.tp * a.dp:
        raise SystemExit(f"--tp {a.tp} x --dp {a.dp} needs {a.tp * a.dp} ranks, not {world.Get_size()}")
    if a.heads % a.tp or a.hidden % a.heads or (4 * a.hidden) % a.tp:
        raise SystemExit("--tp must divide --heads (and 4 x --hidden)")
    torch.set_num_threads(1)
    r = world.Get_rank()
    tp_rank, dp_rank = r % a.tp, r // a.tp  # Megatron order, built by the trainer itself
    tp_comm = world.Split(color=dp_rank, key=tp_rank)
    dp_comm = world.Split(color=tp_rank, key=dp_rank)
    tp = TP(tp_comm)
    topo = h5ckpt.Topology.from_comms(world, tp_comm, dp_comm, MPI.COMM_SELF)
    ckpt = h5ckpt.Checkpointer(topo)

    model = GPT(a, tp)  # the modules' default initialization draws from torch's RNG by local shapes:
    zero = ZeroAdam(model, dp_comm, a.lr)
    torch.manual_seed(a.seed)  # seed after it, so that every rank, in every layout, draws the same data
    np.random.seed(a.seed)
    random.seed(a.seed)
    extra = ht.ExtraState(comm=world)  # checks at every capture that the replicated states agree
    # One StateDict for the whole run: it references the live tensors, which change in place.
    sd = h5ckpt.StateDict()
    ht.add_module(sd, model, model.pl)
    ht.add_optimizer(sd, zero.opt, zero.named_shards(), zero.shard_placements(model.pl))
    extra.add_to(sd)

    start = 0
    info = None
    if a.ckpt_dir and os.path.isdir(a.ckpt_dir):
        try:
            info = h5ckpt.read_checkpoint_info(a.ckpt_dir)
        except h5ckpt.Error as e:
            # Only an empty directory means "start fresh": checkpoints that all fail validation are
            # an error (training over them would overwrite the evidence).
            if e.code != h5ckpt.ErrorCode.NOT_FOUND:
                raise
    if info is not None:
        t0 = time.perf_counter()
        rep = ckpt.load(sd, info.path)
        zero.refresh_shards()
        start = extra.restore()["step"]
        if r == 0:
            print(f"resumed from {rep.path} (step {start}, saved as TP{info.saved_sizes.tp}xDP{info.saved_sizes.dp}) "
                  f"as TP{a.tp}xDP{a.dp} in {time.perf_counter() - t0:.3f} s", flush=True)
        dump(sd, world, a, f"loaded-step{start}.npz")
    elif a.ckpt_dir and r == 0:
        os.makedirs(a.ckpt_dir, exist_ok=True)

    log = open(a.log, "a") if (a.log and r == 0) else None
    handle = None
    bsz = a.batch
    lo, hi = bsz * dp_rank // a.dp, bsz * (dp_rank + 1) // a.dp
    for step in range(start + 1, min(a.steps, a.stop_at) + 1):
        tokens, targets = global_batch(a)
        for p in model.parameters():
            p.grad = None
        loss_local = model.loss_sum(tokens[lo:hi], targets[lo:hi])
        (loss_local / (bsz * a.seq)).backward()
        zero.reduce_gradients()
        lr = lr_at(a, step)
        zero.step(lr)
        loss = np.array([float(loss_local.detach())], dtype=np.float64)
        if a.dp > 1:
            dp_comm.Allreduce(MPI.IN_PLACE, loss)
        loss = float(loss[0]) / (bsz * a.seq)
        if log:
            log.write(json.dumps({"step": step, "loss": loss, "lr": lr}) + "\n")
            log.flush()
        if a.ckpt_dir and a.save_every and step % a.save_every == 0:
            if handle is not None:
                handle.wait()  # one save in flight; raises (on every rank) if it failed
            extra.capture(step=step, lr=lr)
            path = os.path.join(a.ckpt_dir, f"step-{step:08d}")
            if a.sync_saves:
                ckpt.save(sd, path, step=step)
            else:
                handle = ckpt.save_async(sd, path, step=step)  # returns after the snapshot
            dump(sd, world, a, f"saved-step{step}.npz")
    last = min(a.steps, a.stop_at)
    if handle is not None:
        rep = handle.wait()
        if r == 0:
            print(f"last save: {rep.path} ({rep.bytes_total} bytes)", flush=True)
    extra.capture(step=last, lr=lr_at(a, last))
    dump(sd, world, a, f"final-step{last}.npz")
    if log:
        log.close()
    ckpt.close()
    topo.close()
    tp_comm.Free()
    dp_comm.Free()


def main():
    a = parse_args()
    try:
        train(a)
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
