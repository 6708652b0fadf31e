#!/usr/bin/env python3
"""Independent check of h5ckpt-train's numbers against the formulas of issue 3.

Trains a tiny model for a few steps under a sharded layout (TP, PP, DP with ZeRO), reads the
saved datasets back with h5dump, and recomputes every element in pure Python with exact float32
emulation (each +, -, *, /, sqrt of two float32 values is exact in double and rounded once to
float32, which equals IEEE float32 arithmetic):
  init   p = (((i*7 + h) mod 251) - 125) / 128,  h = FNV-1a-32("model/<name>") mod 251
  target t = ((i*3 + h) mod 17) / 16,  g = p - t
  Adam   b1 0.9, b2 0.999, eps 1e-8, lr 1e-2, bias correction; params = bf16_rne(master)
Vocabulary padding rows (>= --vocab) must stay exactly zero. A second run with mixture-of-experts
layers, fused SwiGLU, context and expert parallelism checks the MoE tensors ([E, ...] whole) and
the fused fc1 the same way.

usage: check_trainer_formulas.py TRAIN_EXE MPIEXEC WORKDIR
env: H5CKPT_MPIEXEC_PREFLAGS (space separated)
"""
import math
import os
import re
import shutil
import struct
import subprocess
import sys

STEPS = 3
MODEL = dict(layers=2, hidden=16, heads=4, kv_heads=2, ffn=32, vocab=37)
TP, PP, DP = 2, 2, 2
# A second run: mixture of experts (4 experts, MoE layer 1) with fused SwiGLU, TP2 x CP2 x PP2,
# experts over EP2 inside the DP x CP ranks, ZeRO (dense over DP x CP, experts over expert DP).
MOE_EXPERTS = 4
MOE_ARGS = ["--tp", "2", "--cp", "2", "--pp", "2", "--dp", "1", "--ep", "2", "--zero", "--swiglu",
            "--experts", str(MOE_EXPERTS), "--moe-every", "2"]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16(x):
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def fnv1a32(s):
    h = 2166136261
    for c in s.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def expected(key, n, steps, bf, valid_numel):
    """Final (param, master, m, v) lists for the n elements of model key `key`."""
    h = fnv1a32(key) % 251
    b1, b2, eps, lr = f32(0.9), f32(0.999), f32(1e-8), f32(1e-2)
    one_b1, one_b2 = f32(1.0 - b1), f32(1.0 - b2)
    out = ([], [], [], [])
    for i in range(n):
        if i >= valid_numel:  # vocabulary padding
            for lst in out:
                lst.append(0.0)
            continue
        w = f32((((i * 7 + h) % 251) - 125) / 128.0)
        p, m, v = w, 0.0, 0.0
        t = f32(((i * 3 + h) % 17) / 16.0)
        for k in range(1, steps + 1):
            bc1, bc2 = f32(1.0 - 0.9 ** k), f32(1.0 - 0.999 ** k)
            g = f32(p - t)
            m = f32(f32(b1 * m) + f32(one_b1 * g))
            v = f32(f32(b2 * v) + f32(one_b2 * f32(g * g)))
            mhat, vhat = f32(m / bc1), f32(v / bc2)
            w = f32(w - f32(f32(lr * mhat) / f32(f32(math.sqrt(vhat)) + eps)))
            p = bf16(w) if bf else w
        for lst, x in zip(out, (p, w, m, v)):
            lst.append(x)
    return out


def h5values(path, dataset):
    txt = subprocess.run(["h5dump", "-m", "%.9g", "-y", "-w", "0", "-d", dataset, path],
                         check=True, capture_output=True, text=True).stdout
    body = txt[txt.index("DATA {") + 6:]
    body = body[:body.index("}")]
    return [float(x) for x in re.split(r"[,\s]+", body.strip()) if x]


def main():
    exe, mpiexec, work = sys.argv[1:4]
    pre = os.environ.get("H5CKPT_MPIEXEC_PREFLAGS", "").split()
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    def train(name, layout):
        ck = os.path.join(work, name)
        args = [mpiexec, "-n", "8", *pre, "--timeout", "120", exe, *layout, "--steps", str(STEPS),
                "--save-every", "0", "--ckpt-dir", ck, "--quiet"]
        for k, v in MODEL.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        subprocess.run(args, check=True)
        return os.path.join(ck, open(os.path.join(ck, "latest")).read().strip(), "data.h5")

    data = train("ckpt", ["--tp", str(TP), "--pp", str(PP), "--dp", str(DP), "--zero"])
    moe_data = train("moe", MOE_ARGS)

    H, V = MODEL["hidden"], MODEL["vocab"]
    vp = (V + TP - 1) // TP * TP
    qkv = (MODEL["heads"] + 2 * MODEL["kv_heads"]) * (H // MODEL["heads"])
    checks = {  # name -> (numel, numel of real rows)
        "embedding.word_embeddings.weight": (vp * H, V * H),
        "output_layer.weight": (vp * H, V * H),
        "decoder.layers.0.self_attention.linear_qkv.weight": (qkv * H, qkv * H),
        "decoder.layers.1.self_attention.linear_qkv.bias": (qkv, qkv),
        "decoder.layers.1.self_attention.linear_proj.weight": (H * H, H * H),
        "decoder.layers.0.mlp.linear_fc1.weight": (MODEL["ffn"] * H, MODEL["ffn"] * H),
        "decoder.layers.1.mlp.linear_fc2.weight": (H * MODEL["ffn"], H * MODEL["ffn"]),
        "decoder.layers.0.input_layernorm.weight": (H, H),
        "decoder.final_layernorm.bias": (H, H),
    }
    checks = [(name, n, valid, data) for name, (n, valid) in checks.items()]
    E, F = MOE_EXPERTS, MODEL["ffn"]
    checks += [  # the MoE run: fused [gate; up] fc1 of 2F rows, experts [E, ...] whole
        ("decoder.layers.0.mlp.linear_fc1.weight", 2 * F * H, 2 * F * H, moe_data),
        ("decoder.layers.0.mlp.linear_fc1.bias", 2 * F, 2 * F, moe_data),
        ("decoder.layers.1.mlp.router.weight", E * H, E * H, moe_data),
        ("decoder.layers.1.mlp.experts.linear_fc1.weight", E * 2 * F * H, E * 2 * F * H, moe_data),
        ("decoder.layers.1.mlp.experts.linear_fc2.weight", E * H * F, E * H * F, moe_data),
    ]
    bad = 0
    total = 0
    for name, n, valid, data in checks:
        exp = expected("model/" + name, n, STEPS, True, valid)
        for ds, ref in zip(("/model/", "/optimizer/fp32_param/", "/optimizer/exp_avg/", "/optimizer/exp_avg_sq/"),
                           exp):
            got = h5values(data, ds + name)
            if len(got) != n:
                print(f"MISMATCH {ds}{name}: {len(got)} elements, expected {n}")
                bad += 1
                continue
            diff = [i for i in range(n) if struct.pack("<f", got[i]) != struct.pack("<f", ref[i])]
            total += n
            if diff:
                i = diff[0]
                print(f"MISMATCH {ds}{name}: {len(diff)} elements differ, first {i}: got {got[i]!r} "
                      f"expected {ref[i]!r}")
                bad += 1
    if bad:
        print(f"formula check FAILED: {bad} datasets")
        return 1
    print(f"formula check OK: {total} elements of {4 * len(checks)} datasets match the issue's formulas "
          f"bit for bit after {STEPS} steps (layouts tp{TP}.pp{PP}.dp{DP}.zero and {' '.join(MOE_ARGS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
