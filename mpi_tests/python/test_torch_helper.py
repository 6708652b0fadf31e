#!/usr/bin/env python3
"""h5ckpt.torch under mpirun: StateDicts from a torch module and optimizer with sharding rules, and
the extra state (RNG states, step, values).

A small module whose embedding and linear layer are split by rows over all ranks (uneven splits), with
a replicated LayerNorm and a BatchNorm (buffers, a 0-d counter), trained two Adam steps, is saved;
the expected global tensors are assembled by numpy from every rank's tensors with the test's own row
arithmetic. Checks: the checkpoint's keys and every value (read back through h5py-independent
CheckpointReader reads, element by element); a load into the reversed row layout gives each rank
exactly its rows; restoring the extra state reproduces the RNG draws made after the capture; a model
and optimizer loaded at the saving layout continue training bit-identically to the original; and
init_optimizer_state gives the same first step as torch's lazily created state.
A failure on any rank aborts the job (non-zero exit).
"""
import os
import random
import shutil
import sys
import time
import traceback

import numpy as np
import torch
from mpi4py import MPI

import h5ckpt
import h5ckpt.torch as ht

W = MPI.COMM_WORLD
R, N = W.Get_rank(), W.Get_size()
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h5ckpt-torch-test")
torch.set_num_threads(1)
E, F, H = 3 * N + 1, 2 * N + 3, 6  # embedding rows, linear output rows, hidden size


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def eq(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    check(a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} {a.dtype} != {b.shape} {b.dtype}")
    same = np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    check(same, f"{what}: values differ\n{a}\n!=\n{b}")


def rows(n, parts, index):
    """The test's own near-equal split: the first n % parts parts get one more row."""
    q, m = divmod(n, parts)
    lo = index * q + min(index, m)
    return lo, lo + q + (1 if index < m else 0)


class Net(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index
        e0, e1 = rows(E, N, index)
        f0, f1 = rows(F, N, index)
        self.emb = torch.nn.Embedding(e1 - e0, H)
        self.fc = torch.nn.Linear(H, f1 - f0)
        self.norm = torch.nn.LayerNorm(H)
        self.bn = torch.nn.BatchNorm1d(H)

    def rules(self):
        return {"emb.weight": ht.Placement.split([E, H], 0, N, self.index),
                "fc.weight": ht.Placement.split([F, H], 0, N, self.index),
                "fc.bias": ht.Placement.split([F], 0, N, self.index)}

    def set_global(self, g):
        e0, e1 = rows(E, N, self.index)
        f0, f1 = rows(F, N, self.index)
        with torch.no_grad():
            self.emb.weight.copy_(torch.from_numpy(g["emb.weight"][e0:e1]))
            self.fc.weight.copy_(torch.from_numpy(g["fc.weight"][f0:f1]))
            self.fc.bias.copy_(torch.from_numpy(g["fc.bias"][f0:f1]))
            self.norm.weight.copy_(torch.from_numpy(g["norm.weight"]))
            self.norm.bias.copy_(torch.from_numpy(g["norm.bias"]))

    def loss(self, step):
        # norm and bn see the same input on every rank (replicated), emb and fc are this rank's rows.
        x = self.bn(self.norm(torch.linspace(-1, 1, 4 * H).view(4, H) * step))
        y = self.fc(x + self.emb.weight.mean(dim=0))
        return (y ** 2).mean() + (self.emb.weight ** 2).sum() * 1e-3


def train_step(net, opt, step):
    opt.zero_grad()
    net.loss(step).backward()
    # The replicated parameters get the sum of every rank's gradient, as in tensor parallelism.
    for p in (net.norm.weight, net.norm.bias, net.bn.weight, net.bn.bias):
        g = p.grad.numpy().copy()
        W.Allreduce(MPI.IN_PLACE, g)
        p.grad.copy_(torch.from_numpy(g))
    opt.step()


def global_values():
    i = np.arange(1000, dtype=np.float32)
    return {"emb.weight": (i[:E * H].reshape(E, H) * 0.01 - 1).astype(np.float32),
            "fc.weight": (np.cos(i[:F * H]).reshape(F, H) * 0.5).astype(np.float32),
            "fc.bias": (i[:F] * 0.1).astype(np.float32),
            "norm.weight": np.ones(H, np.float32) + i[:H] * 0.05,
            "norm.bias": i[:H] * -0.02}


SPLIT_PARAMS = {"emb.weight": E, "fc.weight": F, "fc.bias": F}


def assemble(local):
    """{name: local array} on every rank -> {name: global array}, by the test's row arithmetic."""
    everyone = W.allgather(local)
    out = {}
    for name in local:
        if name.split("|")[-1] in SPLIT_PARAMS and not name.startswith("optimizer|step|"):  # step: 0-d, replicated
            out[name] = np.concatenate([everyone[r][name] for r in range(N)], axis=0)
        else:
            for r in range(N):
                eq(everyone[r][name], everyone[0][name], f"replica of {name} on rank {r}")
            out[name] = everyone[0][name]
    return out


def test_module_optimizer_extra():
    topo = h5ckpt.Topology.create(W, tp=N)
    ck = h5ckpt.Checkpointer(topo)
    net = Net(R)  # its default initialization draws from torch's RNG by local shapes: seed after it
    net.set_global(global_values())
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for s in (1, 2):
        train_step(net, opt, s)

    sd = h5ckpt.StateDict()
    placements = ht.add_module(sd, net, net.rules())
    check(sorted(placements) == sorted(net.state_dict()), "a placement per state_dict entry")
    check(placements["bn.num_batches_tracked"].global_shape == [1], "a 0-d buffer is stored as [1]")
    keys, non_tensor = ht.add_optimizer(sd, opt, net.named_parameters(), placements)
    check(not non_tensor, f"Adam's state is all tensors: {non_tensor}")
    extra = ht.ExtraState(comm=W)
    extra.add_to(sd)
    if N > 1:  # states that differ between ranks cannot be saved under replicated keys
        torch.manual_seed(100 + R)
        try:
            extra.capture(step=2)
            raise AssertionError("RNG states that differ between ranks were accepted")
        except ValueError as e:
            check("differ between ranks" in str(e), str(e))
        torch.manual_seed(1)
    extra.capture(step=2, note="hello", lr=0.01)
    draws = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)], np.random.randn(3))
    check(sd.error is None, f"no local problem: {sd.error}")
    ck.save(sd, os.path.join(ROOT, "ckpt", "step-2"), step=2)

    # The expected global values, from every rank's own tensors.
    local = {}
    for name, t in net.state_dict().items():
        local["model|" + name] = t.detach().numpy().reshape(-1 if t.dim() == 0 else t.shape).copy()
    names = dict((id(p), n) for n, p in net.named_parameters())
    for p, st in opt.state.items():
        for sname, v in st.items():
            local[f"optimizer|{sname}|{names[id(p)]}"] = v.detach().numpy().reshape(-1 if v.dim() == 0 else v.shape).copy()
    want = assemble(local)
    want = {k.replace("|", "/"): v for k, v in want.items()}
    want_keys = sorted(list(want) + extra.keys())
    with h5ckpt.CheckpointReader.open(os.path.join(ROOT, "ckpt")) as rd:
        check(rd.keys() == want_keys, f"checkpoint keys\n{rd.keys()}\n!=\n{want_keys}")
        for key, g in want.items():
            eq(rd.read(key).reshape(g.shape), g, f"saved {key}")
        check(rd.find("model/emb.weight").shape == [E, H] and rd.find("optimizer/exp_avg/fc.weight").shape == [F, H],
              "global shapes")
        eq(rd.read("optimizer/step/fc.bias"), np.array([2.0], np.float32), "Adam's step")
        eq(rd.read("extra/step"), np.array([2], np.int64), "extra/step")

    # Load into the reversed row layout, fresh modules, other RNG states.
    torch.manual_seed(77)
    np.random.seed(78)
    random.seed(79)
    net2 = Net(N - 1 - R)
    for p in net2.parameters():
        p.data.zero_()
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.01)
    ht.init_optimizer_state(opt2)
    sd2 = h5ckpt.StateDict()
    pl2 = ht.add_module(sd2, net2, net2.rules())
    ht.add_optimizer(sd2, opt2, net2.named_parameters(), pl2)
    extra2 = ht.ExtraState()
    extra2.add_to(sd2)
    ck.load(sd2, os.path.join(ROOT, "ckpt"))
    for name, t in net2.state_dict().items():
        g = want["model/" + name]
        if name in SPLIT_PARAMS:
            lo, hi = rows(SPLIT_PARAMS[name], N, N - 1 - R)
            g = g[lo:hi]
        eq(t.numpy().reshape(g.shape), g, f"loaded {name} (rows of rank {N - 1 - R})")
    for name, p in net2.named_parameters():
        for sname, v in opt2.state[p].items():
            g = want[f"optimizer/{sname}/{name}"]
            if name in SPLIT_PARAMS and v.dim() > 0:
                lo, hi = rows(SPLIT_PARAMS[name], N, N - 1 - R)
                g = g[lo:hi]
            eq(v.numpy().reshape(g.shape), g, f"loaded optimizer {sname} of {name}")
    values = extra2.restore()
    check(values == {"note": "hello", "lr": 0.01, "step": 2}, f"restored values {values}")
    again = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)], np.random.randn(3))
    check(torch.equal(again[0], draws[0]), "torch RNG restored")
    eq(again[1], draws[1], "numpy RNG restored")
    check(again[2] == draws[2], "Python RNG restored")
    eq(again[3], draws[3], "numpy's cached Gaussian restored")

    # At the saving layout, a loaded model and optimizer continue exactly like the original.
    net3 = Net(R)
    opt3 = torch.optim.Adam(net3.parameters(), lr=0.01)
    ht.init_optimizer_state(opt3)
    sd3 = h5ckpt.StateDict()
    pl3 = ht.add_module(sd3, net3, net3.rules())
    ht.add_optimizer(sd3, opt3, net3.named_parameters(), pl3)
    ck.load(sd3, os.path.join(ROOT, "ckpt"))
    for s in (3, 4):
        train_step(net, opt, s)
        train_step(net3, opt3, s)
    for (n1, a), (n3, b) in zip(net.state_dict().items(), net3.state_dict().items()):
        eq(b.numpy(), a.numpy(), f"continued training: {n1}")
    ck.close()
    topo.close()


def test_init_optimizer_state_is_a_fresh_state():
    torch.manual_seed(5)
    base = torch.nn.Linear(4, 3)
    for make in (lambda ps: torch.optim.Adam(ps, lr=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True),
                 lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)):
        a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
        a.load_state_dict(base.state_dict())
        b.load_state_dict(base.state_dict())
        oa, ob = make(a.parameters()), make(b.parameters())
        ht.init_optimizer_state(ob)
        check(all(len(ob.state[p]) > 0 for p in b.parameters()), f"{type(ob).__name__}: state created")
        x = torch.arange(8.0).view(2, 4)
        for _ in range(2):
            for m, o in ((a, oa), (b, ob)):
                o.zero_grad()
                (m(x) ** 2).sum().backward()
                o.step()
        eq(b.weight.detach().numpy(), a.weight.detach().numpy(), f"{type(oa).__name__}: same steps as a lazy state")
    try:
        ht.init_optimizer_state(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9, dampening=0.5))
        raise AssertionError("SGD with dampening must be refused")
    except NotImplementedError:
        pass


def test_placements():
    p = ht.Placement.split([10, 4], 0, 3, 1)
    check(p.global_shape == [10, 4] and p.local_shape == [3, 4] and p.shard.box.offset == [4, 0], f"split {p}")
    z = p.flat_range(2, 7)
    check(z.local_shape == [5] and z.shard.flat == (2, 7) and z.shard.box == p.shard.box, f"flat_range {z}")
    b = ht.Placement.box([5, 5], [1, 2], [2, 3])
    check(b.local_shape == [2, 3], "box")
    sd = h5ckpt.StateDict()
    ht.add_tensor(sd, "model/flat", torch.zeros(5), z)
    check(sd.item("model/flat")["shard"] == z.shard and sd.error is None, "add_tensor with a flat placement")
    ht.add_tensor(sd, "model/wrong", torch.zeros(4), z)
    check(sd.error is not None and "model/wrong" in sd.error, "a tensor that does not fit its placement is reported")


def main():
    if R == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
        os.makedirs(os.path.join(ROOT, "ckpt"))
    W.Barrier()
    t0 = time.time()
    try:
        for t in (test_placements, test_init_optimizer_state_is_a_fresh_state, test_module_optimizer_extra):
            t()
            W.Barrier()
            if R == 0:
                print(f"ok   {t.__name__}", flush=True)
    except BaseException:
        sys.stderr.write(f"FAIL on rank {R} of {N}:\n{traceback.format_exc()}")
        sys.stderr.flush()
        W.Abort(1)
    if R == 0:
        print(f"all torch helper tests passed on {N} rank(s) in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
