#!/usr/bin/env python3
"""scale_smoke: runs `h5ckpt-scale --small` and checks its JSON line against counts computed here,
independently, from the synthetic trainer's model (docs/trainer.md): its tensors, their TP splits,
ZeRO slices over DP, the loader and extra items, and the pipeline split of the layers.

Usage: check_scale.py <path to h5ckpt-scale>
"""
import json
import subprocess
import sys

# The small preset of h5ckpt-scale.
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 7, 64, 8, 4, 128, 1001
SAVE = dict(tp=2, dp=3, pp=3)
LOAD = dict(tp=4, dp=2, pp=2)
LOADER_WORKERS = 2


def stage_layers(layers, pp):
    """Equal stages except the first and last, one layer fewer; else the first stages one more."""
    if pp >= 2 and (layers + 2) % pp == 0 and (layers + 2) // pp >= 2:
        per = [(layers + 2) // pp] * pp
        per[0] -= 1
        per[-1] -= 1
        return per
    return [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


def model(tp, pp):
    """(name, shape, split dim or None, stage, vocab padded?) of every model tensor."""
    head_dim = HIDDEN // HEADS
    qkv = (HEADS + 2 * KV_HEADS) * head_dim
    vocab = -(-VOCAB // tp) * tp
    out = [("embedding.word_embeddings.weight", (vocab, HIDDEN), 0, 0, True)]
    layer = 0
    for stage, count in enumerate(stage_layers(LAYERS, pp)):
        for _ in range(count):
            p = f"decoder.layers.{layer}."
            for name, shape, split in [
                ("input_layernorm.weight", (HIDDEN,), None), ("input_layernorm.bias", (HIDDEN,), None),
                ("self_attention.linear_qkv.weight", (qkv, HIDDEN), 0), ("self_attention.linear_qkv.bias", (qkv,), 0),
                ("self_attention.linear_proj.weight", (HIDDEN, HEADS * head_dim), 1),
                ("self_attention.linear_proj.bias", (HIDDEN,), None),
                ("pre_mlp_layernorm.weight", (HIDDEN,), None), ("pre_mlp_layernorm.bias", (HIDDEN,), None),
                ("mlp.linear_fc1.weight", (FFN, HIDDEN), 0), ("mlp.linear_fc1.bias", (FFN,), 0),
                ("mlp.linear_fc2.weight", (HIDDEN, FFN), 1), ("mlp.linear_fc2.bias", (HIDDEN,), None)]:
                out.append((p + name, shape, split, stage, False))
            layer += 1
    out.append(("decoder.final_layernorm.weight", (HIDDEN,), None, pp - 1, False))
    out.append(("decoder.final_layernorm.bias", (HIDDEN,), None, pp - 1, False))
    out.append(("output_layer.weight", (vocab, HIDDEN), 0, pp - 1, True))
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def tp_shard(shape, split, tp, t):
    """(offset, extent) of TP rank t's box: near-equal parts, the first n % tp one larger."""
    if split is None:
        return tuple(0 for _ in shape), tuple(shape)
    n = shape[split]
    base, extra = divmod(n, tp)
    off = [0] * len(shape)
    ext = list(shape)
    off[split] = t * base + min(t, extra)
    ext[split] = base + (1 if t < extra else 0)
    return tuple(off), tuple(ext)


def zero_slices(n, dp):
    return [(n * d // dp, n * (d + 1) // dp) for d in range(dp)]


def save_counts():
    tp, dp, pp = SAVE["tp"], SAVE["dp"], SAVE["pp"]
    world = tp * dp * pp
    tensors = regions = items = 0
    for name, shape, split, stage, _ in model(tp, pp):
        tensors += 4  # the bf16 parameter, fp32 master, exp_avg, exp_avg_sq
        boxes = {tp_shard(shape, split, tp, t) for t in range(tp)}
        regions += len(boxes)
        for box in boxes:
            regions += 3 * sum(1 for b, e in zero_slices(numel(box[1]), dp) if e > b)
        for t in range(tp):
            for b, e in zero_slices(numel(tp_shard(shape, split, tp, t)[1]), dp):
                items += (1 + (3 if e > b else 0)) * 1  # per DP rank of this stage
    # optimizer/step, loader/replicated, loader shards, extra/global_step, extra/lr_scheduler, RNGs
    extra_tensors = 1 + 1 + dp * LOADER_WORKERS + 2 + world
    items += world * (1 + 1 + LOADER_WORKERS + 3)
    return tensors + extra_tensors, regions + extra_tensors, items


def load_counts():
    tp, dp, pp = LOAD["tp"], LOAD["dp"], LOAD["pp"]
    requests = 0
    groups = set()
    for rank in range(tp * dp * pp):
        t, d, p = rank % tp, (rank // tp) % dp, rank // (tp * dp)
        for name, shape, split, stage, padded in model(tp, pp):
            if stage != p:
                continue
            box = tp_shard(shape, split, tp, t)
            groups.add(("model/" + name, box))
            requests += 1
            b, e = zero_slices(numel(box[1]), dp)[d]
            if e > b:
                requests += 3
                for s in ("fp32_param", "exp_avg", "exp_avg_sq"):
                    groups.add((f"optimizer/{s}/{name}", box, b, e))
        blobs = ["optimizer/step", "loader/replicated", "extra/global_step", "extra/lr_scheduler"]
        blobs += [f"loader/shard/dp{x}/worker{w}" for x in range(SAVE["dp"]) for w in range(LOADER_WORKERS)]
        if t < SAVE["tp"] and d < SAVE["dp"] and p < SAVE["pp"]:  # its RNG was saved
            blobs.append(f"extra/rng/tp{t}_dp{d}_pp{p}")
        requests += len(blobs)
        groups.update(blobs)
    return requests, len(groups)


def main():
    out = subprocess.run([sys.argv[1], "--small"], check=True, capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one JSON line, got {len(lines)}"
    r = json.loads(lines[0])
    tensors, regions, items = save_counts()
    requests, groups = load_counts()
    expect = {"ranks": 18, "load_ranks": 16, "tensors": tensors, "regions": regions, "items": items,
              "load_requests": requests, "load_groups": groups,
              # every region of the small preset is below one verification block (1 MiB)
              "blocks": regions}
    bad = [f"{k}: got {r.get(k)}, expected {v}" for k, v in expect.items() if r.get(k) != v]
    for k in ("plan_s", "plan_save_s", "load_coordinator_s", "load_plan_ms_max", "metadata_bytes", "peak_rss_mb"):
        if not isinstance(r.get(k), (int, float)) or r[k] <= 0:
            bad.append(f"{k}: {r.get(k)} is not a positive number")
    if r.get("save_stage_split") != "first-and-last-one-fewer" or r.get("load_stage_split") != "even":
        bad.append(f"stage splits {r.get('save_stage_split')} / {r.get('load_stage_split')}")
    if not r.get("metadata_encoding"):
        bad.append("no metadata_encoding")
    if r.get("load_plan_slowest_region_hits", 0) < r.get("load_plan_slowest_read_items", 1):
        bad.append("the slowest load rank found fewer saved regions than it reads items")
    if bad:
        print("scale_smoke: " + "; ".join(bad))
        print(lines[0])
        return 1
    print(f"scale_smoke: ok ({tensors} tensors, {regions} regions, {requests} load requests in {groups} groups)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
