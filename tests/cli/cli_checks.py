#!/usr/bin/env python3
"""CLI tests for `h5ckpt` on the checkpoints written by make_fixture.

usage: cli_checks.py --h5ckpt EXE --root FIXTURE_ROOT --work DIR [--mpiexec M --mpiflags "F..."] CHECK

Expected values come from this file alone: the closed formula below (the same one the fixture
writes), raw bytes read from data.h5 at the recorded offsets, and h5py where it can map the type.
Nothing is taken from h5ckpt's own output without an independent comparison.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np

try:
    import h5py  # python3-h5py: an independent reader of the HDF5 datasets
except ImportError:  # still check everything else, and say so
    h5py = None

# key, dtype, shape, seed: mirrors make_fixture.cpp's main_specs() / old_specs().
MAIN = [
    ("model/embed", "f32", (37, 16), 1),
    ("model/layers.0.attn.qkv", "bf16", (12, 24), 2),
    ("model/layers.0.attn.bias", "f16", (24,), 3),
    ("model/layers.0.mlp.fc", "f64", (5, 3, 4), 4),
    ("model/mask", "bool", (5, 5), 5),
    ("model/counts", "i32", (9,), 6),
    ("model/small", "i8", (3, 7), 7),
    ("model/mid", "i16", (4, 4), 8),
    ("model/bytes", "u8", (33,), 9),
    ("model/fp8a", "f8e4m3", (16,), 10),
    ("model/fp8b", "f8e5m2", (2, 8), 11),
    ("optimizer/exp_avg/model/embed", "f32", (37, 16), 12),
    ("optimizer/step", "i64", (1,), 13),
    ("loader/replicated", "u8", (20,), 14),
    ("extra/global_step", "i64", (1,), 15),
]
OLD = [
    ("model/embed", "f32", (37, 16), 101),
    ("model/old_only", "f32", (4,), 102),
    ("model/counts", "i64", (9,), 6),
    ("model/mid", "i16", (4, 5), 8),
]
PERTURB_KEY, PERTURB_INDEX, PERTURB_DELTA = "model/embed", 123, 0.25

SIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "f8e4m3": 1, "f8e5m2": 1, "i8": 1, "i16": 2, "i32": 4,
        "i64": 8, "u8": 1, "bool": 1}
SAFETENSORS = {"f32": "F32", "f64": "F64", "f16": "F16", "bf16": "BF16", "f8e4m3": "F8_E4M3",
               "f8e5m2": "F8_E5M2", "i8": "I8", "i16": "I16", "i32": "I32", "i64": "I64", "u8": "U8",
               "bool": "BOOL"}


def expected_values(dtype, seed, n):
    """Global elements 0..n-1 as a numpy array of the stored representation (bf16 as uint16 bits)."""
    i = np.arange(n, dtype=np.int64)
    half = ((i * 7 + seed * 13) % 61 - 30) * 0.5
    iv = (i * 13 + seed * 7) % 200 - 100
    if dtype == "f32":
        return half.astype(np.float32)
    if dtype == "f64":
        return half.astype(np.float64)
    if dtype == "f16":
        return half.astype(np.float16)
    if dtype == "bf16":  # bfloat16 = top half of the float32 bits (exact for these values)
        return (half.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype in ("f8e4m3", "f8e5m2", "u8"):
        return ((i * 29 + seed * 11) % 256).astype(np.uint8)
    if dtype == "bool":
        return ((i * 5 + seed) % 3 == 0).astype(np.uint8)
    if dtype == "i8":
        return iv.astype(np.int8)
    if dtype == "i16":
        return (iv * 300).astype(np.int16)
    if dtype == "i32":
        return (iv * 1000003).astype(np.int32)
    if dtype == "i64":
        return (iv * 1000000007).astype(np.int64)
    raise ValueError(dtype)


def expected_bytes(dtype, shape, seed, perturb=False, key=None):
    v = expected_values(dtype, seed, int(np.prod(shape))).copy()
    if perturb and key == PERTURB_KEY:
        v[PERTURB_INDEX] += np.float32(PERTURB_DELTA)
    return v.astype(v.dtype.newbyteorder("<")).tobytes()


class Ctx:
    def __init__(self, a):
        self.exe, self.root, self.work = a.h5ckpt, a.root, a.work
        self.mpiexec = a.mpiexec
        self.mpiflags = a.mpiflags.split() if a.mpiflags else []
        self.failures = 0
        os.makedirs(self.work, exist_ok=True)

    def run(self, *args, ranks=None, expect=None):
        cmd = [self.exe] + [str(x) for x in args]
        if ranks is not None:
            cmd = [self.mpiexec, "-n", str(ranks)] + self.mpiflags + ["--timeout", "120"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if expect is not None and p.returncode != expect:
            self.fail(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def json(self, *args, ranks=None, expect=0):
        p = self.run(*args, "--json", ranks=ranks, expect=expect)
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError as e:
            self.fail(f"{args}: stdout is not JSON ({e}):\n{p.stdout}\n{p.stderr}")
            raise SystemExit(1)

    def check(self, cond, what):
        if not cond:
            self.fail(what)
        return cond

    def fail(self, what):
        self.failures += 1
        print("FAIL:", what, file=sys.stderr)

    def ckpt(self, name):
        return os.path.join(self.root, name)


def raw_tensor_bytes(data_file, t):
    with open(data_file, "rb") as f:
        f.seek(t["file_offset"])
        return f.read(t["nbytes"])


def check_contents(c, info, specs, perturb=False, label=""):
    """Every tensor of an inspect --json document against the formula, via raw bytes and h5py."""
    by_key = {t["key"]: t for t in info["tensors"]}
    c.check(sorted(by_key) == sorted(k for k, *_ in specs), f"{label}: keys {sorted(by_key)}")
    h5 = h5py.File(info["data_file"], "r") if h5py else None
    for key, dtype, shape, seed in specs:
        t = by_key.get(key)
        if t is None:
            continue
        n = int(np.prod(shape))
        c.check(t["dtype"] == dtype and tuple(t["shape"]) == shape and t["nbytes"] == n * SIZE[dtype],
                f"{label}: {key}: dtype/shape/nbytes {t['dtype']} {t['shape']} {t['nbytes']}")
        want = expected_bytes(dtype, shape, seed, perturb, key)
        c.check(raw_tensor_bytes(info["data_file"], t) == want, f"{label}: {key}: bytes at file_offset differ")
        covered = sum((r["flat"][1] - r["flat"][0]) if r["flat"] else int(np.prod(r["shape"])) for r in t["regions"])
        c.check(covered == n and t["num_regions"] == len(t["regions"]), f"{label}: {key}: regions cover {covered} of {n}")
        if h5 is not None:
            ds = h5["/" + key]
            c.check(ds.shape == shape, f"{label}: {key}: h5py shape {ds.shape}")
            c.check(ds.id.get_offset() == t["file_offset"], f"{label}: {key}: h5py offset {ds.id.get_offset()}")
            if dtype not in ("bf16", "f8e5m2"):  # custom floats h5py cannot map to numpy
                got = ds[...].reshape(-1)
                ref = np.frombuffer(want, dtype=got.dtype.newbyteorder("<"))
                c.check(np.array_equal(got.view(np.uint8), ref.astype(got.dtype).view(np.uint8)),
                        f"{label}: {key}: h5py values differ")
    if h5 is not None:
        h5.close()


# ---- checks --------------------------------------------------------------------------------


def check_help(c):
    p = c.run("--help", expect=0)
    for sub in ("inspect", "verify", "diff", "export", "reshard", "prune"):
        c.check(sub in p.stdout, f"--help lists {sub}")
        q = c.run(sub, "--help", expect=0)
        c.check("Usage:" in q.stdout and sub in q.stdout, f"{sub} --help:\n{q.stdout}")
    p = c.run(expect=2)
    c.check("subcommand" in (p.stdout + p.stderr).lower(), "no subcommand: asks for one")
    p = c.run("inspect", os.path.join(c.work, "does-not-exist"), expect=2)
    c.check("does not exist" in p.stderr, f"missing path message: {p.stderr}")
    p = c.run("verify", os.path.join(c.work, "does-not-exist"), expect=2)
    c.check("does not exist" in p.stderr, f"verify missing path message: {p.stderr}")
    p = c.run("export", c.ckpt("ckpts/step-20"), os.path.join(c.work, "x.onnx"), "--format", "onnx", expect=2)
    c.check("unsupported format 'onnx'" in p.stderr, f"bad format message: {p.stderr}")
    p = c.run("diff", c.ckpt("ckpts/step-20"), c.ckpt("ckpts/step-20"), "--atol", "-1", expect=2)
    c.check(">= 0" in p.stderr, "negative tolerance refused")


def check_inspect_dir(c):
    d = c.ckpt("ckpts")
    j = c.json("inspect", d)
    c.check(j["kind"] == "directory" and j["latest"] == "step-20" and not j["latest_missing"], f"dir json {j}")
    status = {e["name"]: (e["status"], e["latest"]) for e in j["checkpoints"]}
    want = {"step-10": ("committed", False), "step-15": ("broken", False), "step-20": ("committed", True),
            "step-25": ("uncommitted", False), ".step-30.inprogress-deadbeef": ("uncommitted", False)}
    c.check(status == want, f"directory listing {status}")
    names = [e["name"] for e in j["checkpoints"]]
    c.check(names.index("step-10") < names.index("step-15") < names.index("step-20"), f"natural order {names}")
    s20 = next(e for e in j["checkpoints"] if e["name"] == "step-20")
    c.check(s20["step"] == 20 and s20["tensors"] == len(MAIN), f"step-20 entry {s20}")
    c.check(s20["total_bytes"] == sum(int(np.prod(s)) * SIZE[dt] for _, dt, s, _ in MAIN), "step-20 bytes")
    broken = next(e for e in j["checkpoints"] if e["name"] == "step-15")
    c.check("metadata" in broken["error"], f"broken reason: {broken}")

    out = c.run("inspect", d, expect=0).stdout
    c.check("latest -> step-20" in out, f"table names latest:\n{out}")
    c.check(re.search(r"^\s*\*\s+step-20\s+committed\s+20\s", out, re.M) is not None, f"latest marked:\n{out}")
    c.check(re.search(r"^\s+\.step-30\.inprogress-deadbeef\s+uncommitted", out, re.M) is not None, f"in-progress:\n{out}")
    c.check(re.search(r"^\s+step-15\s+broken", out, re.M) is not None, f"broken:\n{out}")
    c.check("logs" not in out, "non-checkpoint directories are not listed")
    j = c.json("inspect", d, "--latest")
    c.check(j["kind"] == "checkpoint" and j["step"] == 20, "--latest follows latest")


def check_inspect_checkpoint(c):
    path = c.ckpt("ckpts/step-20")
    j = c.json("inspect", path)
    c.check(j["format_version"] == 2 and j["step"] == 20, f"format/step {j['format_version']} {j['step']}")
    c.check(j["topology"] == {"tp": 2, "dp": 1, "pp": 1, "world": 2}, f"topology {j['topology']}")
    c.check(j["attributes"].get("fixture") == "cli-tests", f"attributes {j['attributes']}")
    total = sum(int(np.prod(s)) * SIZE[dt] for _, dt, s, _ in MAIN)
    c.check(j["total_bytes"] == total, f"total_bytes {j['total_bytes']} != {total}")
    c.check(j["data_file_bytes"] == os.path.getsize(os.path.join(path, "data.h5")), "data_file_bytes")
    check_contents(c, j, MAIN, label="step-20")
    emb = next(t for t in j["tensors"] if t["key"] == "model/embed")
    c.check([r["offset"] for r in emb["regions"]] == [[0, 0], [19, 0]] and
            [r["shape"] for r in emb["regions"]] == [[19, 16], [18, 16]], f"embed rows split over 2 ranks {emb['regions']}")
    # Other layouts' copies hold the same global values.
    check_contents(c, c.json("inspect", c.ckpt("relayout")), MAIN, label="relayout")
    check_contents(c, c.json("inspect", c.ckpt("perturbed")), MAIN, perturb=True, label="perturbed")
    check_contents(c, c.json("inspect", c.ckpt("ckpts/step-10")), OLD, label="step-10")

    out = c.run("inspect", path, expect=0).stdout
    c.check(re.search(r"^step\s+20$", out, re.M) is not None, f"step line:\n{out}")
    c.check("tp=2 dp=1 pp=1 (world 2)" in out, "topology line")
    c.check(re.search(r"^format version\s+2 ", out, re.M) is not None, "format line")
    main_part, _, aux_part = out.partition("loader/extra items")
    c.check(aux_part != "", f"loader/extra section:\n{out}")
    for key, dtype, shape, _ in MAIN:
        is_aux = key.startswith(("loader/", "extra/"))
        where = aux_part if is_aux else main_part
        row = re.search(r"^\s+" + re.escape(key) + r"\s+" + dtype + r"\s+\[" + ", ".join(map(str, shape)) + r"\]", where, re.M)
        c.check(row is not None, f"table row for {key} in the {'aux' if is_aux else 'tensor'} section")
    c.check(f"({total} bytes)" in out, "total line")
    out = c.run("inspect", path, "--regions", expect=0).stdout
    c.check("saved regions" in out and "writer" in out and "blocks" in out, "--regions table")
    # Small regions: one verification block each (about 1 MiB of whole slabs per block).
    c.check(all(r["verify_blocks"] == 1 and r["block_bytes"] > 0 for t in j["tensors"] for r in t["regions"]),
            "every region has one verification block")
    check_index_tables(c, path, j)


def check_index_tables(c, path, j):
    """The format-v2 index read without h5ckpt: metadata.json's table offsets hold exactly the
    bytes h5py reads from the /meta datasets, and the tensors table agrees with `inspect --json`."""
    with open(os.path.join(path, "metadata.json"), encoding="utf-8") as f:
        summary = json.load(f)
    c.check(summary["format_version"] == 2 and "tensors" not in summary, "metadata.json is a v2 summary")
    with open(os.path.join(path, "data.h5"), "rb") as f:
        raw = f.read()
    tables = {}
    for name, t in summary["tables"].items():
        tables[name] = raw[t["offset"]:t["offset"] + t["bytes"]] if t["bytes"] else b""
        c.check(len(tables[name]) == t["records"] * t["record_bytes"], f"table {name} size")
    names = tables["names"]
    by_key = {}
    for k in range(summary["tables"]["tensors"]["records"]):
        (key_at, key_len, _dtype, _ndim, _res, _shape, nbytes, offset, _first, nregions,
         _block) = struct.unpack_from("<QIBBHQQqQQQ", tables["tensors"], 64 * k)
        by_key[names[key_at:key_at + key_len].decode()] = (nbytes, offset, nregions)
    want = {t["key"]: (t["nbytes"], t["file_offset"], t["num_regions"]) for t in j["tensors"]}
    c.check(by_key == want, f"tensors table vs inspect --json: {by_key} != {want}")
    if h5py is None:  # main() said so already
        return
    with h5py.File(os.path.join(path, "data.h5"), "r") as f:
        for name, data in tables.items():
            c.check(f["meta/" + name][...].tobytes() == data, f"/meta/{name} through h5py equals the bytes at its offset")


def flip_byte(data_file, offset):
    with open(data_file, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def region_of(t, index):
    """Index of the saved region holding global flat element `index` (independent of h5ckpt)."""
    shape = t["shape"]
    coords = list(np.unravel_index(index, shape))
    for r_i, r in enumerate(t["regions"]):
        if r["flat"]:
            # flat range of the region's box: the element must lie in the box and its flat index
            # within the box in [begin, end)
            inside = all(o <= x < o + s for x, o, s in zip(coords, r["offset"], r["shape"]))
            if inside:
                local = int(np.ravel_multi_index([x - o for x, o in zip(coords, r["offset"])], r["shape"]))
                if r["flat"][0] <= local < r["flat"][1]:
                    return r_i
        elif all(o <= x < o + s for x, o, s in zip(coords, r["offset"], r["shape"])):
            return r_i
    raise AssertionError(f"no region holds element {index}")


def check_verify(c):
    good = c.ckpt("ckpts/step-20")
    info = c.json("inspect", good)
    nregions = sum(len(t["regions"]) for t in info["tensors"])
    p = c.run("verify", good, expect=0)
    c.check(p.stdout.startswith("OK:") and f"{nregions} regions" in p.stdout, f"verify output: {p.stdout}")
    for n in (None, 2, 3):
        j = c.json("verify", good, ranks=n)
        c.check(j["ok"] and j["regions_checked"] == nregions and j["errors"] == [] and j["ranks"] == (n or 1),
                f"verify --json at {n} ranks: {j}")
        c.check(j["bytes_checked"] == info["total_bytes"], f"bytes_checked {j['bytes_checked']}")

    # Corrupt one byte inside two tensors of a copy; both must be named with the right region.
    bad = os.path.join(c.work, "corrupt")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(good, bad)
    by_key = {t["key"]: t for t in c.json("inspect", bad)["tensors"]}
    targets = {"model/embed": 400, "optimizer/exp_avg/model/embed": 17}  # regions 1 and 0
    want_region = {}
    for key, elem in targets.items():
        t = by_key[key]
        flip_byte(os.path.join(bad, "data.h5"), t["file_offset"] + elem * SIZE[t["dtype"]] + 1)
        want_region[key] = region_of(t, elem)
    for n in (None, 2):
        p = c.run("verify", bad, ranks=n, expect=1)
        err = p.stderr
        for key, r in want_region.items():
            c.check(re.search(r"tensor '" + re.escape(key) + r"' region " + str(r) + r"\b", err) is not None,
                    f"verify at {n} ranks names {key} region {r}:\n{err}")
        c.check("model/mask" not in err and p.stdout.startswith("FAILED"), f"only the bad tensors named:\n{p.stdout}{err}")
        j = c.json("verify", bad, ranks=n, expect=1)
        c.check(not j["ok"] and len(j["errors"]) == 2, f"json errors at {n} ranks: {j['errors']}")
    # Damaged metadata: a failed check, not a crash.
    p = c.run("verify", c.ckpt("ckpts/step-15"), expect=1)
    c.check("metadata" in p.stderr, f"bad metadata reported: {p.stderr}")


def check_diff(c):
    a, relayout, pert = c.ckpt("ckpts/step-20"), c.ckpt("relayout"), c.ckpt("perturbed")
    p = c.run("diff", a, relayout, expect=0)
    c.check("EQUAL" in p.stdout and "tp=2 dp=1" in p.stdout and "tp=1 dp=2" in p.stdout, f"across layouts:\n{p.stdout}")
    c.run("diff", a, a, expect=0)
    # Expected figures of the perturbation, computed here.
    base = expected_values("f32", 1, 37 * 16)
    b_val = np.float32(base[PERTURB_INDEX] + np.float32(PERTURB_DELTA))
    delta = float(abs(np.float64(b_val) - np.float64(base[PERTURB_INDEX])))
    for chunk in ([], ["--chunk-bytes", "24"], ["--chunk-bytes", "1"]):
        j = c.json("diff", a, pert, *chunk, expect=1)
        c.check(not j["equal"] and j["only_in_a"] == [] and j["only_in_b"] == [], f"perturbed {chunk}: {j}")
        d = j["differences"]
        c.check(len(d) == 1 and d[0]["key"] == PERTURB_KEY and d[0]["differing_elements"] == 1 and
                d[0]["first_differing_index"] == PERTURB_INDEX and abs(d[0]["max_abs_diff"] - delta) < 1e-12 and
                d[0]["problem"] is None, f"perturbed {chunk}: {d}")
    p = c.run("diff", a, pert, expect=1)
    c.check(re.search(r"^\s+model/embed\s+values\s+1\s+0\.25\s+123$", p.stdout, re.M) is not None and "DIFFERENT" in p.stdout,
            f"diff table:\n{p.stdout}")
    c.run("diff", a, pert, "--atol", str(delta * 1.01), expect=0)
    c.run("diff", a, pert, "--atol", str(delta * 0.99), expect=1)
    c.run("diff", a, pert, "--rtol", str(delta / abs(float(b_val)) * 1.01), expect=0)

    # Key sets, dtype and shape differences, value statistics against numpy.
    j = c.json("diff", c.ckpt("ckpts/step-10"), a, expect=1)
    c.check(j["only_in_a"] == ["model/old_only"], f"only in A {j['only_in_a']}")
    common = {"model/embed", "model/counts", "model/mid"}
    c.check(j["only_in_b"] == sorted(k for k, *_ in MAIN if k not in common), f"only in B {j['only_in_b']}")
    d = {x["key"]: x for x in j["differences"]}
    c.check(d["model/counts"]["problem"] == "dtype i64 vs i32" and not d["model/counts"]["values_compared"],
            f"counts {d.get('model/counts')}")
    c.check(d["model/mid"]["problem"] == "shape [4, 5] vs [4, 4]" and not d["model/mid"]["values_compared"],
            f"mid {d.get('model/mid')}")
    x, y = expected_values("f32", 101, 37 * 16).astype(np.float64), base.astype(np.float64)
    e = d["model/embed"]
    c.check(e["differing_elements"] == int(np.count_nonzero(x != y)) and e["max_abs_diff"] == float(np.max(np.abs(x - y)))
            and e["first_differing_index"] == int(np.flatnonzero(x != y)[0]), f"embed stats {e}")


def check_export(c):
    src = c.ckpt("ckpts/step-20")
    out = os.path.join(c.work, "all.safetensors")
    if os.path.exists(out):
        os.remove(out)
    c.run("export", src, out, "--format", "safetensors", expect=0)
    check_safetensors(c, out, MAIN, prefix="", strip=False)
    p = c.run("export", src, out, "--format", "safetensors", expect=2)
    c.check("exists" in p.stderr, "refuses to overwrite")
    out2 = os.path.join(c.work, "model.safetensors")
    c.run("export", src, out2, "--format", "safetensors", "--prefix", "model/", "--strip-prefix",
          "--chunk-bytes", "7", "--overwrite", expect=0)
    check_safetensors(c, out2, [s for s in MAIN if s[0].startswith("model/")], prefix="model/", strip=True)
    p = c.run("export", src, out2 + "x", "--format", "safetensors", "--prefix", "nothing/", expect=2)
    c.check("no tensor key starts with" in p.stderr, "empty selection refused")
    c.check(not os.path.exists(out2 + "x"), "no partial output")


def check_safetensors(c, path, specs, prefix, strip):
    """An independent safetensors parser: struct + json + numpy, nothing from h5ckpt."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    c.check(n % 8 == 0 and 8 + n <= len(blob), f"{path}: header length {n}")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    c.check(meta is not None and meta.get("format") == "pt" and meta.get("h5ckpt_step") == "20" and
            all(isinstance(v, str) for v in meta.values()), f"{path}: metadata {meta}")
    want_names = {(k[len(prefix):] if strip else k) for k, *_ in specs}
    c.check(set(header) == want_names, f"{path}: names {sorted(header)}")
    # Offsets: back to back, starting at 0, ending at the end of the file.
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        c.check(b == pos and e >= b, f"{path}: gap or overlap at {b}")
        pos = e
    c.check(pos == len(data), f"{path}: data section {len(data)} bytes, offsets end at {pos}")
    h5 = h5py.File(os.path.join(c.ckpt("ckpts/step-20"), "data.h5"), "r") if h5py else None
    for key, dtype, shape, seed in specs:
        name = key[len(prefix):] if strip else key
        v = header.get(name)
        if v is None:
            continue
        c.check(v["dtype"] == SAFETENSORS[dtype] and tuple(v["shape"]) == shape, f"{path}: {name}: {v}")
        b, e = v["data_offsets"]
        raw = data[b:e]
        c.check(raw == expected_bytes(dtype, shape, seed), f"{path}: {name}: bytes differ from the formula")
        if h5 is not None and dtype not in ("bf16", "f8e5m2"):
            ref = h5["/" + key][...]
            got = np.frombuffer(raw, dtype=ref.dtype.newbyteorder("<")).reshape(shape)
            c.check(np.array_equal(got.view(np.uint8), ref.view(np.uint8)), f"{path}: {name}: differs from h5py")
    if h5 is not None:
        h5.close()


def check_reshard(c):
    src = c.ckpt("ckpts/step-20")
    out4 = os.path.join(c.work, "tp2dp2")
    shutil.rmtree(out4, ignore_errors=True)
    p = c.run("reshard", src, out4, "--tp", "2", "--pp", "1", "--dp", "2", ranks=4, expect=0)
    c.check("resharded" in p.stdout and p.stdout.count("resharded") == 1, f"one summary line:\n{p.stdout}")
    j = c.json("inspect", out4)
    c.check(j["topology"] == {"tp": 2, "dp": 2, "pp": 1, "world": 4} and j["step"] == 20, f"topology {j['topology']}")
    c.check(j["attributes"].get("fixture") == "cli-tests" and j["attributes"].get("h5ckpt_resharded_from"),
            f"attributes {j['attributes']}")
    emb = next(t for t in j["tensors"] if t["key"] == "model/embed")
    c.check([r["offset"][0] for r in emb["regions"]] == [0, 10, 19, 28] and
            [r["shape"][0] for r in emb["regions"]] == [10, 9, 9, 9], f"embed rows over 4 ranks {emb['regions']}")
    mlp = next(t for t in j["tensors"] if t["key"] == "model/layers.0.mlp.fc")  # 5 rows >= 4: rows
    c.check(len(mlp["regions"]) == 4, f"mlp regions {mlp['regions']}")
    step = next(t for t in j["tensors"] if t["key"] == "optimizer/step")  # 1 element: whole, once
    c.check(len(step["regions"]) == 1, f"optimizer/step regions {step['regions']}")
    check_contents(c, j, MAIN, label="reshard tp2dp2")
    c.run("diff", src, out4, expect=0)
    c.run("verify", out4, expect=0)
    c.check(not os.path.exists(os.path.join(c.work, "latest")), "reshard leaves 'latest' alone by default")

    # A single process, no mpirun (MPI singleton), to a 1-rank layout.
    out1 = os.path.join(c.work, "tp1")
    shutil.rmtree(out1, ignore_errors=True)
    c.run("reshard", out4, out1, "--tp", "1", "--pp", "1", "--dp", "1", expect=0)
    j = c.json("inspect", out1)
    c.check(j["topology"]["world"] == 1 and all(len(t["regions"]) == 1 for t in j["tensors"]), "1-rank layout")
    c.run("diff", src, out1, expect=0)

    # Refusals: wrong rank count, existing output.
    p = c.run("reshard", src, os.path.join(c.work, "never"), "--tp", "3", "--pp", "1", "--dp", "1", ranks=2, expect=2)
    c.check("needs tp*pp*dp ranks" in p.stderr and p.stderr.count("needs tp*pp*dp") == 1, f"rank count message:\n{p.stderr}")
    c.check(not os.path.exists(os.path.join(c.work, "never")), "nothing written")
    p = c.run("reshard", src, out1, "--tp", "1", "--pp", "1", "--dp", "1", expect=2)
    c.check("already exists" in p.stderr, f"existing output: {p.stderr}")


def check_prune(c):
    """Retention by hand on a copy of the fixture directory: what goes, what always stays, the lock."""
    import fcntl

    d = os.path.join(c.work, "ckpts")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(c.ckpt("ckpts"), d, symlinks=True)
    # Same recorded step as step-20, a later name: the newest by (step, name); step-20 stays as latest.
    shutil.copytree(os.path.join(d, "step-20"), os.path.join(d, "step-20b"))
    before = sorted(os.listdir(d))

    j = c.json("prune", d, "--keep-last", "1", "--dry-run")
    c.check(j["dry_run"] and j["deleted"] == ["step-10"], f"dry run deletes step-10 only: {j}")
    c.check(j["kept"] == ["step-20b", "step-20"], f"kept newest first: {j}")
    c.check(sorted(os.listdir(d)) == before, "a dry run deletes nothing")
    p = c.run("prune", d, "--keep-last", "1", "--dry-run", expect=0)
    c.check("would delete step-10" in p.stdout, f"dry run text:\n{p.stdout}")

    # A job saving there holds the lock: prune refuses and names it; a dry run still answers.
    lock_path = os.path.join(d, ".h5ckpt.lock")
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.seek(0)
        lock.truncate()
        lock.write("host=cli-test pid=424242\n")
        lock.flush()
        p = c.run("prune", d, "--keep-last", "1", expect=2)
        c.check("another save into" in p.stderr and "pid=424242" in p.stderr, f"lock holder named:\n{p.stderr}")
        c.check(sorted(os.listdir(d)) == before, "refused prune deletes nothing")
        c.run("prune", d, "--keep-last", "1", "--dry-run", expect=0)

    p = c.run("prune", d, "--keep-last", "1", expect=0)
    c.check("deleted step-10" in p.stdout, f"prune text:\n{p.stdout}")
    after = set(os.listdir(d))
    # Broken (unreadable metadata), uncommitted and in-progress directories are never touched.
    for keep in ("step-15", "step-20", "step-20b", "step-25", ".step-30.inprogress-deadbeef", "logs", "latest"):
        c.check(keep in after, f"{keep} kept: {sorted(after)}")
    c.check("step-10" not in after, f"step-10 deleted: {sorted(after)}")
    c.check(not any(".inprogress-deleting" in n for n in after), f"no deletion leftovers: {sorted(after)}")
    j = c.json("inspect", d, "--latest")
    c.check(j["kind"] == "checkpoint" and j["step"] == 20, "latest still loads")

    # Refusals: a keep-last below 1, a single checkpoint, a missing directory.
    c.run("prune", d, "--keep-last", "0", expect=2)
    p = c.run("prune", os.path.join(d, "step-20"), "--keep-last", "1", expect=2)
    c.check("is one checkpoint" in p.stderr, f"single checkpoint refused:\n{p.stderr}")
    p = c.run("prune", os.path.join(c.work, "nope"), "--keep-last", "1", expect=2)
    c.check("does not exist" in p.stderr, f"missing directory:\n{p.stderr}")


CHECKS = {"help": check_help, "inspect_dir": check_inspect_dir, "inspect_checkpoint": check_inspect_checkpoint,
          "verify": check_verify, "diff": check_diff, "export": check_export, "reshard": check_reshard,
          "prune": check_prune}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h5ckpt", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--mpiflags", default="")
    ap.add_argument("check", choices=sorted(CHECKS))
    a = ap.parse_args()
    c = Ctx(a)
    if h5py is None:
        print("note: h5py not importable; the h5py cross-checks are skipped", file=sys.stderr)
    CHECKS[a.check](c)
    if c.failures:
        print(f"{a.check}: {c.failures} failure(s)", file=sys.stderr)
        return 1
    print(f"{a.check}: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
