#!/usr/bin/env python3
"""The MoE tensors of an h5ckpt-train checkpoint, read back with h5py (independent of the library).

Trains a tiny mixture-of-experts model on 8 ranks (TP2 x CP2 x DP2, experts over EP2 inside the
DP x CP ranks, ZeRO) for a few steps, with and without fused SwiGLU, then requires of the saved
data.h5 (docs/trainer.md):
  - each expert tensor stored once, as one dataset with its global shape [E, ...]
    (model/ and the three optimizer/ groups): no per-expert or per-EP-rank datasets;
  - the router [E, H] in each MoE layer, no dense MLP there; dense fc1 [2F, H] with SwiGLU;
  - every element of those datasets equal to the trainer's formulas after the steps
    (scripts/check_trainer_formulas.py's independent float32 emulation);
  - metadata.json recording the saving topology's cp and ep.

usage: check_moe_checkpoint.py TRAIN_EXE MPIEXEC WORKDIR
env: H5CKPT_MPIEXEC_PREFLAGS (space separated)
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from check_trainer_formulas import expected  # noqa: E402

STEPS = 3
E, H, F, LAYERS, EVERY = 4, 16, 32, 4, 2
MODEL = ["--layers", str(LAYERS), "--hidden", str(H), "--heads", "4", "--kv-heads", "2", "--ffn", str(F),
         "--vocab", "37", "--experts", str(E), "--moe-every", str(EVERY)]
LAYOUT = ["--tp", "2", "--cp", "2", "--dp", "2", "--ep", "2", "--zero"]
GROUPS = ("model", "optimizer/fp32_param", "optimizer/exp_avg", "optimizer/exp_avg_sq")


def bits(x):
    return struct.pack("<f", float(x))


def check(exe, mpiexec, work, swiglu):
    pre = os.environ.get("H5CKPT_MPIEXEC_PREFLAGS", "").split()
    ck = os.path.join(work, "swiglu" if swiglu else "plain")
    shutil.rmtree(ck, ignore_errors=True)
    args = [mpiexec, "-n", "8", *pre, "--timeout", "120", exe, *LAYOUT, *MODEL, "--steps", str(STEPS),
            "--save-every", "0", "--ckpt-dir", ck, "--quiet"] + (["--swiglu"] if swiglu else [])
    subprocess.run(args, check=True)
    step_dir = os.path.join(ck, open(os.path.join(ck, "latest")).read().strip())
    bad = []
    topo = json.load(open(os.path.join(step_dir, "metadata.json")))["topology"]
    if topo.get("cp") != 2 or topo.get("ep") != 2 or topo.get("tp") != 2 or topo.get("dp") != 2:
        bad.append(f"metadata.json topology {topo}: expected tp 2, cp 2, dp 2, ep 2")
    fc1 = 2 * F if swiglu else F
    moe_layers = [layer for layer in range(LAYERS) if (layer + 1) % EVERY == 0]
    want = {}  # name -> global shape
    for layer in range(LAYERS):
        p = f"decoder.layers.{layer}.mlp."
        if layer in moe_layers:
            want[p + "router.weight"] = (E, H)
            want[p + "experts.linear_fc1.weight"] = (E, fc1, H)
            want[p + "experts.linear_fc2.weight"] = (E, H, F)
        else:
            want[p + "linear_fc1.weight"] = (fc1, H)
            want[p + "linear_fc1.bias"] = (fc1,)
    checked = 0
    with h5py.File(os.path.join(step_dir, "data.h5"), "r") as f:
        for g in GROUPS:
            names = list(f[g].keys())
            # Expert tensors once each, whole: no dataset per expert or per EP rank.
            expert_names = sorted(n for n in names if "expert" in n)
            want_experts = sorted(n for n in want if "expert" in n)
            if expert_names != want_experts:
                bad.append(f"/{g}: expert datasets {expert_names}, expected exactly {want_experts}")
            for layer in moe_layers:
                dense = [n for n in names if n.startswith(f"decoder.layers.{layer}.mlp.linear_fc")]
                if dense:
                    bad.append(f"/{g}: MoE layer {layer} still has dense MLP datasets {dense}")
            for name, shape in want.items():
                if name not in f[g]:
                    bad.append(f"/{g}/{name} missing")
                    continue
                ds = f[g][name]
                if tuple(ds.shape) != shape:
                    bad.append(f"/{g}/{name}: shape {tuple(ds.shape)}, expected {shape}")
                    continue
        # Values: model, master, m, v of every element against the formulas (keyed by model/<name>).
        for name, shape in want.items():
            n = 1
            for d in shape:
                n *= d
            exp = expected("model/" + name, n, STEPS, True, n)
            for g, ref in zip(GROUPS, exp):
                if name not in f[g] or tuple(f[g][name].shape) != shape:
                    continue
                got = f[g][name].astype("<f4")[()].reshape(-1)
                diff = [i for i in range(n) if bits(got[i]) != bits(ref[i])]
                checked += n
                if diff:
                    i = diff[0]
                    bad.append(f"/{g}/{name}: {len(diff)} of {n} elements differ, first {i}: got {got[i]!r}, "
                               f"expected {ref[i]!r}")
    tag = "swiglu" if swiglu else "plain"
    for b in bad:
        print(f"MISMATCH ({tag}) {b}")
    if not bad:
        print(f"moe checkpoint OK ({tag}): {len(want)} tensors x {len(GROUPS)} groups once each with their global "
              f"shapes, {checked} elements match the formulas after {STEPS} steps; topology {topo}")
    return len(bad)


def main():
    exe, mpiexec, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    bad = check(exe, mpiexec, work, False) + check(exe, mpiexec, work, True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
