#!/usr/bin/env python3
"""`h5ckpt export --max-shard-size SIZE [--rename-map FILE]`: the Hugging Face sharded layout,
checked with an independent parser (struct + json + numpy) against the fixture's formulas
(cli_checks.py: MAIN, expected_bytes)."""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import MAIN, SAFETENSORS, SIZE, expected_bytes  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def run(exe, *args, expect=None):
    p = subprocess.run([exe] + [str(a) for a in args], capture_output=True, text=True, timeout=120)
    if expect is not None and p.returncode != expect:
        check(False, f"{args}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p


def parse(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    return header, blob[8 + n:]


def check_dir(out, specs, names, max_bytes):
    """specs: (key, dtype, shape, seed); names[key]: the exported name."""
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    wm = index["weight_map"]
    total = sum(SIZE[d] * int(__import__("numpy").prod(s)) for _, d, s, _ in specs)
    check(index["metadata"]["total_size"] == total, f"total_size {index['metadata']['total_size']} != {total}")
    check(set(wm) == set(names.values()), f"weight_map names {sorted(wm)}")
    files = sorted(set(wm.values()))
    nfiles = len(files)
    for k, f in enumerate(files):
        check(f == f"model-{k + 1:05d}-of-{nfiles:05d}.safetensors", f"file name {f}")
    on_disk = sorted(x for x in os.listdir(out) if x.endswith(".safetensors"))
    check(on_disk == files, f"files on disk {on_disk} vs index {files}")
    seen = {}
    for f in files:
        header, data = parse(os.path.join(out, f))
        spans = sorted(tuple(v["data_offsets"]) for v in header.values())
        pos = 0
        for b, e in spans:
            check(b == pos, f"{f}: gap at {b}")
            pos = e
        check(pos == len(data), f"{f}: data {len(data)} bytes, offsets end at {pos}")
        check(len(data) <= max_bytes or len(header) == 1, f"{f}: {len(data)} bytes > {max_bytes} with several tensors")
        for name, v in header.items():
            check(wm.get(name) == f, f"{name} is in {f}, the index says {wm.get(name)}")
            seen[name] = (v, data[v["data_offsets"][0]:v["data_offsets"][1]])
    for key, dtype, shape, seed in specs:
        name = names[key]
        check(name in seen, f"{name} missing")
        if name not in seen:
            continue
        v, raw = seen[name]
        check(v["dtype"] == SAFETENSORS[dtype] and tuple(v["shape"]) == shape, f"{name}: {v}")
        check(raw == expected_bytes(dtype, shape, seed), f"{name}: bytes differ from the formula")
    return nfiles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h5ckpt", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    src = os.path.join(a.root, "ckpts/step-20")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    model = [s for s in MAIN if s[0].startswith("model/")]

    out = os.path.join(a.work, "hf")
    run(a.h5ckpt, "export", src, out, "--format", "safetensors", "--prefix", "model/", "--strip-prefix",
        "--max-shard-size", "1000", expect=0)
    n = check_dir(out, model, {k: k[len("model/"):] for k, *_ in model}, 1000)
    check(n > 2, f"1000-byte shards of {len(model)} tensors gave {n} file(s)")
    p = run(a.h5ckpt, "export", src, out, "--format", "safetensors", "--max-shard-size", "1000", expect=2)
    check("exists" in p.stderr, "an existing index is refused without --overwrite")

    # Renames by checkpoint key and by exported name; everything in one file with a large bound.
    rmap = os.path.join(a.work, "rename.json")
    json.dump({"model/embed": "transformer.wte.weight", "layers.0.mlp.fc": "h.0.mlp.c_fc.weight"}, open(rmap, "w"))
    out2 = os.path.join(a.work, "hf2")
    run(a.h5ckpt, "export", src, out2, "--format", "safetensors", "--prefix", "model/", "--strip-prefix",
        "--max-shard-size", "5GB", "--rename-map", rmap, expect=0)
    names = {k: k[len("model/"):] for k, *_ in model}
    names["model/embed"] = "transformer.wte.weight"
    names["model/layers.0.mlp.fc"] = "h.0.mlp.c_fc.weight"
    check(check_dir(out2, model, names, 5 * 10**9) == 1, "one file under 5GB")

    json.dump({"model/embed": "counts"}, open(rmap, "w"))  # collides with model/counts
    p = run(a.h5ckpt, "export", src, os.path.join(a.work, "hf3"), "--format", "safetensors", "--prefix", "model/",
            "--strip-prefix", "--max-shard-size", "1MB", "--rename-map", rmap, expect=2)
    check("both become 'counts'" in p.stderr, f"collision named: {p.stderr}")
    check(not os.path.exists(os.path.join(a.work, "hf3", "model.safetensors.index.json")), "no index after a refusal")
    p = run(a.h5ckpt, "export", src, os.path.join(a.work, "x.safetensors"), "--format", "safetensors",
            "--rename-map", rmap, expect=2)
    check("needs --max-shard-size" in p.stderr, "rename map alone refused")
    p = run(a.h5ckpt, "export", src, os.path.join(a.work, "hf4"), "--format", "safetensors", "--max-shard-size", "0",
            expect=2)
    if failures:
        print(f"export shards: {failures} failure(s)", file=sys.stderr)
        return 1
    print("export shards: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
