#!/usr/bin/env python3
"""Builds the corrupt-checkpoint corpus from a real checkpoint directory tree.

Input: the CLI fixture (tests/cli/make_fixture.cpp): FIXTURE/ckpts/{step-10,step-20,latest,...}.
Output: OUT/cases/<name>/... and OUT/manifest.json, a list of
  {"name", "target" (path to load / verify / inspect), "kind" ("ckpt" or "latest"),
   "load": "error" | "any" | "ok", "verify": "error" | "any" | "ok"}
"error": every reader must refuse it; "any": a clean error, or (load) exactly the original data;
"ok": the control, which must load and verify.
Every case must give a clean error or correct data, never a crash, hang or wrong data: that is
checked by run_corpus.py (CLI) and corpus_load (MPI load).

The checkpoints are format v2 (docs/format.md section 4): metadata.json is a signed summary and
the index is a set of binary tables in data.h5. Lies about the summary are re-signed (index_xxh3
recomputed as in section 4.3); lies about the index are made on a decoded copy of the tables,
which is encoded again, appended to data.h5 and pointed at by a re-signed summary (with the
tables' new xxh3), so they reach the validation behind every checksum. Needs only the standard
library and libxxhash.
"""
import argparse
import ctypes
import json
import os
import random
import shutil
import struct

_xx = ctypes.CDLL("libxxhash.so.0")
_xx.XXH3_64bits.restype = ctypes.c_uint64
_xx.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return "%016x" % _xx.XXH3_64bits(b, len(b))


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def sign(meta):
    body = dict(meta)
    body.pop("index_xxh3", None)
    body["index_xxh3"] = xxh3(dumps(body).encode())
    return dumps(body).encode()


# ---- the format-v2 index tables (docs/format.md section 4.2), decoded and encoded here ---------

TABLES = ["tensors", "regions", "extents", "blocks", "coords", "names", "attributes", "saved_coords"]
RECORD = {"tensors": 64, "regions": 8, "extents": 40, "blocks": 8, "coords": 8, "names": 1, "attributes": 24,
          "saved_coords": 12}
TENSOR = struct.Struct("<QIBBHQQQQQQ")  # file_offset packed unsigned: any lie fits its 8 bytes
REGION = struct.Struct("<II")
EXTENT = struct.Struct("<QQQQII")
ATTRIBUTE = struct.Struct("<QQII")
SAVED = struct.Struct("<III")
DTYPE_SIZE = {1: 4, 2: 8, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 1, 12: 1}
DTYPE_CODE = {"f32": 1, "f64": 2, "f16": 3, "bf16": 4, "f8e4m3": 5, "f8e5m2": 6, "i8": 7, "i16": 8, "i32": 9,
              "i64": 10, "u8": 11, "bool": 12}


def signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def u(v, bits=64):
    return v & ((1 << bits) - 1)


def read_tables(summary, data):
    return {n: bytes(data[t["offset"]:t["offset"] + t["bytes"]]) if t["bytes"] else b""
            for n, t in summary["tables"].items()}


def decode_index(summary, data):
    """The index as plain Python: tensors with their regions and block sums, attributes, coords."""
    tb = read_tables(summary, data)
    coords = [signed(v) for v in struct.unpack("<%dQ" % (len(tb["coords"]) // 8), tb["coords"])]
    blocks = list(struct.unpack("<%dQ" % (len(tb["blocks"]) // 8), tb["blocks"]))
    names = tb["names"]
    extents = [EXTENT.unpack_from(tb["extents"], 40 * i) for i in range(len(tb["extents"]) // 40)]
    regions = [REGION.unpack_from(tb["regions"], 8 * i) for i in range(len(tb["regions"]) // 8)]
    tensors = []
    for i in range(len(tb["tensors"]) // 64):
        key_at, key_len, dtype, ndim, _, shape_at, nbytes, offset, first_region, count, block = \
            TENSOR.unpack_from(tb["tensors"], 64 * i)
        t = {"key": names[key_at:key_at + key_len].decode("utf-8", "surrogateescape"), "dtype": dtype,
             "shape": coords[shape_at:shape_at + ndim], "nbytes": nbytes, "file_offset": signed(offset), "regions": []}
        for writer, e in regions[first_region:first_region + count]:
            box_at, fb, fe, block_bytes, xndim, flat = extents[e]
            shape = coords[box_at + xndim:box_at + 2 * xndim]
            numel = (signed(fe) - signed(fb)) if flat else prod(shape)
            n = -(-numel * DTYPE_SIZE[dtype] // block_bytes) if block_bytes else 0
            t["regions"].append({"writer": writer, "offset": coords[box_at:box_at + xndim], "shape": shape,
                                 "flat": [signed(fb), signed(fe)] if flat else None, "block_bytes": block_bytes,
                                 "blocks": blocks[block:block + n]})
            block += n
        tensors.append(t)
    attributes = []
    for i in range(len(tb["attributes"]) // 24):
        ka, va, kl, vl = ATTRIBUTE.unpack_from(tb["attributes"], 24 * i)
        attributes.append((names[ka:ka + kl], names[va:va + vl]))
    saved = [SAVED.unpack_from(tb["saved_coords"], 12 * i) for i in range(len(tb["saved_coords"]) // 12)]
    return {"tensors": tensors, "attributes": attributes, "saved_coords": saved}


def prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def encode_index(model):
    """Tables of a decoded index, tensors sorted by key as writers sort them; each region gets its
    own extent (sharing extents is the writer's choice, not a rule)."""
    tb = {n: bytearray() for n in TABLES}

    def name(b):
        at = len(tb["names"])
        tb["names"] += b
        return at

    def coords(values):
        at = len(tb["coords"]) // 8
        for v in values:
            tb["coords"] += struct.pack("<Q", u(v))
        return at

    n_regions = n_blocks = 0
    for t in sorted(model["tensors"], key=lambda t: t["key"].encode("utf-8", "surrogateescape")):
        key = t["key"].encode("utf-8", "surrogateescape")
        rec = [name(key), len(key), u(t["dtype"], 8), u(len(t["shape"]), 8), 0, coords(t["shape"]), u(t["nbytes"]),
               u(t["file_offset"]), n_regions, len(t["regions"]), n_blocks]
        tb["tensors"] += TENSOR.pack(*rec)
        for r in t["regions"]:
            box = coords(list(r["offset"]) + list(r["shape"]))
            flat = r["flat"] or [0, 0]
            tb["extents"] += EXTENT.pack(box, u(flat[0]), u(flat[1]), u(r["block_bytes"]), len(r["offset"]),
                                         1 if r["flat"] else 0)
            tb["regions"] += REGION.pack(u(r["writer"], 32), len(tb["extents"]) // 40 - 1)
            for b in r["blocks"]:
                tb["blocks"] += struct.pack("<Q", b)
            n_regions += 1
            n_blocks += len(r["blocks"])
    for k, v in model["attributes"]:
        tb["attributes"] += ATTRIBUTE.pack(name(k), name(v), len(k), len(v))
    for c in model["saved_coords"]:
        tb["saved_coords"] += SAVED.pack(*c)
    return tb


def place_tables(summary, data_path, tables):
    """Appends `tables` to the data file and points the summary at them (records, xxh3, counts)."""
    with open(data_path, "r+b") as f:
        f.seek(0, 2)
        at = (f.tell() + 7) // 8 * 8
        for n in TABLES:
            t, b = summary["tables"][n], bytes(tables[n])
            t.update(bytes=len(b), records=len(b) // RECORD[n], xxh3=xxh3(b), offset=at if b else -1)
            if b:
                f.seek(at)
                f.write(b)
                at += len(b)
    summary["counts"] = {n: summary["tables"][n]["records"] for n in ("tensors", "regions", "blocks")}


class Corpus:
    def __init__(self, fixture, out):
        self.src = os.path.join(fixture, "ckpts")
        self.out = out
        self.cases = []
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(os.path.join(out, "cases"))
        with open(os.path.join(self.src, "step-20", "metadata.json"), "rb") as f:
            self.meta_text = f.read()
        self.meta = json.loads(self.meta_text)
        assert self.meta["format_version"] == 2, "the corpus is made from format-v2 checkpoints"
        with open(os.path.join(self.src, "step-20", "data.h5"), "rb") as f:
            self.data = f.read()
        self.data_size = len(self.data)
        self.index = decode_index(self.meta, self.data)

    def ckpt_case(self, name, load="error", verify="error"):
        """A copy of step-20 as OUT/cases/NAME/ckpt; returns its path for the caller to damage."""
        d = os.path.join(self.out, "cases", name, "ckpt")
        shutil.copytree(os.path.join(self.src, "step-20"), d, symlinks=True)
        self.cases.append({"name": name, "target": d, "kind": "ckpt", "load": load, "verify": verify})
        return d

    def latest_case(self, name, load="any", verify="any"):
        """A copy of the directory of checkpoints (step-10, step-15, step-20, ...) without `latest`."""
        d = os.path.join(self.out, "cases", name, "root")
        os.makedirs(d)
        for e in os.listdir(self.src):
            p = os.path.join(self.src, e)
            if os.path.isdir(p):
                shutil.copytree(p, os.path.join(d, e), symlinks=True)
        self.cases.append({"name": name, "target": d, "kind": "latest", "load": load, "verify": verify})
        return d

    def lie(self, name, edit, load="error", verify="error"):
        """A re-signed summary edited by `edit`; the tables stay as they are."""
        meta = json.loads(self.meta_text)
        edit(meta)
        d = self.ckpt_case(name, load, verify)
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(sign(meta))

    def index_lie(self, name, edit=None, patch=None, load="error", verify="error"):
        """The index decoded, edited by `edit` (on the decoded form) and/or `patch` (on the encoded
        tables, for what the decoded form cannot say), encoded, appended to data.h5 and signed."""
        model = decode_index(self.meta, self.data)
        if edit:
            edit(model)
        tables = encode_index(model)
        if patch:
            patch(tables)
        d = self.ckpt_case(name, load, verify)
        meta = json.loads(self.meta_text)
        place_tables(meta, os.path.join(d, "data.h5"), tables)
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(sign(meta))

    def raw_metadata(self, name, text, load="error", verify="error"):
        d = self.ckpt_case(name, load, verify)
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(text)

    def write_manifest(self):
        with open(os.path.join(self.out, "manifest.json"), "w") as f:
            json.dump(self.cases, f, indent=1)


def tensor(index, key):
    return next(t for t in index["tensors"] if t["key"] == key)


def flip(path, pos, mask):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def byte_cases(c, rng):
    tensors = [t for t in c.index["tensors"] if t["nbytes"] > 0]
    tables = [(n, t) for n, t in c.meta["tables"].items() if t["bytes"] > 0]
    # Flips inside tensor bytes: a verified load and verify must catch every one (block checksums).
    for t in tensors:
        for where, pos in (("first", t["file_offset"]), ("last", t["file_offset"] + t["nbytes"] - 1)):
            d = c.ckpt_case("data_flip_%s_%s" % (t["key"].replace("/", "_"), where))
            flip(os.path.join(d, "data.h5"), pos, 0x01)
    # Flips inside the index tables: every one fails the table's checksum.
    for n, t in tables:
        for where, pos in (("first", t["offset"]), ("last", t["offset"] + t["bytes"] - 1)):
            d = c.ckpt_case("table_flip_%s_%s" % (n, where))
            flip(os.path.join(d, "data.h5"), pos, 0x40)
    # Flips elsewhere (HDF5 superblock, object headers, padding): the loader never parses them, so
    # "any" -- but if it loads, the data must be the original.
    owned = [(t["file_offset"], t["file_offset"] + t["nbytes"]) for t in tensors]
    owned += [(t["offset"], t["offset"] + t["bytes"]) for _, t in tables]
    others = [p for p in range(c.data_size) if not any(b <= p < e for b, e in owned)]
    for pos in sorted(set([0, 1, 8, 9] + rng.sample(others, min(20, len(others))))):
        d = c.ckpt_case("data_flip_other_%d" % pos, load="any", verify="any")
        flip(os.path.join(d, "data.h5"), pos, 0xff)
    last_end = max(e for _, e in owned)
    for size in (0, 8, c.data_size // 2, last_end - 1):
        d = c.ckpt_case("data_truncate_%d" % size)
        truncate(os.path.join(d, "data.h5"), size)
    # The file ending inside each table.
    for n, t in tables:
        d = c.ckpt_case("table_truncate_%s" % n)
        truncate(os.path.join(d, "data.h5"), t["offset"] + t["bytes"] // 2)
    if last_end < c.data_size:  # only HDF5 structures after the last tensor and table lost
        d = c.ckpt_case("data_truncate_tail_%d" % last_end, load="any", verify="any")
        truncate(os.path.join(d, "data.h5"), last_end)
    # metadata.json: any changed byte breaks the JSON or its self-checksum.
    n = len(c.meta_text)
    for pos in sorted(set([0, 1, n // 3, n // 2, n - 2, n - 1] + rng.sample(range(n), 18))):
        for mask in (0x01, 0x80):
            d = c.ckpt_case("meta_flip_%d_%02x" % (pos, mask))
            flip(os.path.join(d, "metadata.json"), pos, mask)
    for size in (0, 1, n // 2, n - 1):
        d = c.ckpt_case("meta_truncate_%d" % size)
        truncate(os.path.join(d, "metadata.json"), size)
    # Missing, empty, or not a regular file.
    d = c.ckpt_case("meta_missing")
    os.remove(os.path.join(d, "metadata.json"))
    d = c.ckpt_case("data_missing")
    os.remove(os.path.join(d, "data.h5"))
    c.cases[-1]["refuse_not_found"] = True  # damaged, not absent: "not found" starts a trainer fresh
    d = c.ckpt_case("data_is_dir")
    os.remove(os.path.join(d, "data.h5"))
    os.mkdir(os.path.join(d, "data.h5"))
    d = c.ckpt_case("meta_is_dir")
    os.remove(os.path.join(d, "metadata.json"))
    os.mkdir(os.path.join(d, "metadata.json"))
    d = c.ckpt_case("data_symlink_dev_zero")
    os.remove(os.path.join(d, "data.h5"))
    os.symlink("/dev/zero", os.path.join(d, "data.h5"))
    d = c.ckpt_case("meta_symlink_loop")
    os.remove(os.path.join(d, "metadata.json"))
    os.symlink("metadata.json", os.path.join(d, "metadata.json"))
    d = c.ckpt_case("meta_huge_garbage")
    with open(os.path.join(d, "metadata.json"), "wb") as f:
        f.write(b"{\"a\":\"" + b"x" * (8 << 20))  # 8 MiB unterminated string


def index_lie_cases(c):
    """Lies inside the index tables (format v2), each behind valid table checksums."""
    m = c.index
    keys = [t["key"] for t in m["tensors"] if t["nbytes"] > 0]
    k0, k1 = keys[0], keys[1]
    multi = next(t["key"] for t in m["tensors"] if len(t["regions"]) > 1)
    lie = c.index_lie

    lie("offset_past_end", lambda j: tensor(j, k0).update(file_offset=c.data_size + 1000))
    lie("offset_end_past_file", lambda j: tensor(j, k0).update(file_offset=c.data_size - 1))
    lie("offset_negative", lambda j: tensor(j, k0).update(file_offset=-1))
    lie("offset_overlap", lambda j: tensor(j, k1).update(file_offset=tensor(j, k0)["file_offset"]))
    lie("offset_huge", lambda j: tensor(j, k0).update(file_offset=2**63 - 8))
    # (the re-encoded tables are appended at the next multiple of 8 past the end of data.h5)
    lie("offset_over_a_table", lambda j: tensor(j, k0).update(file_offset=(c.data_size + 7) // 8 * 8))
    lie("shape_overflow", lambda j: tensor(j, k0).update(shape=[2**31, 2**31, 2**31]))
    lie("shape_overflow_nbytes", lambda j: tensor(j, k0).update(shape=[2**61, 4], nbytes=2**63 - 1))
    lie("shape_u64", lambda j: tensor(j, k0).update(shape=[2**64 - 1]))
    lie("shape_negative", lambda j: tensor(j, k0).update(shape=[-1] + tensor(j, k0)["shape"][1:]))
    lie("shape_33_dims", lambda j: tensor(j, k0).update(shape=[1] * 33))
    lie("shape_0_dims", lambda j: tensor(j, k0).update(shape=[]))
    lie("nbytes_plus_4", lambda j: tensor(j, k0).update(nbytes=tensor(j, k0)["nbytes"] + 4))
    lie("nbytes_u64max", lambda j: tensor(j, k0).update(nbytes=2**64 - 1))

    def box_outside(j):
        r = tensor(j, multi)["regions"][-1]
        r["offset"] = [o + s for o, s in zip(r["offset"], tensor(j, multi)["shape"])]

    lie("box_outside_shape", box_outside)
    lie("box_negative_offset", lambda j: tensor(j, multi)["regions"][0].update(
        offset=[-1] * len(tensor(j, multi)["shape"])))

    def rank_mismatch(j):
        r = tensor(j, multi)["regions"][0]
        r.update(offset=r["offset"] + [0], shape=r["shape"] + [1])

    lie("box_rank_mismatch", rank_mismatch)
    lie("flat_beyond_box", lambda j: tensor(j, multi)["regions"][0].update(flat=[0, 2**40]))
    lie("flat_reversed", lambda j: tensor(j, multi)["regions"][0].update(flat=[3, 1]))
    lie("unknown_dtype", lambda j: tensor(j, k0).update(dtype=99))
    lie("dtype_code_zero", lambda j: tensor(j, k0).update(dtype=0))
    # Self-consistent: a same-size dtype the loader cannot convert to what it asks for.
    f32 = next(t["key"] for t in m["tensors"] if t["dtype"] == DTYPE_CODE["f32"])
    lie("dtype_f32_as_i32", lambda j: tensor(j, f32).update(dtype=DTYPE_CODE["i32"]), verify="any")
    for name, key in (("key_dotdot", "model/../etc/passwd"), ("key_absolute", "/etc/passwd"),
                      ("key_nul", "model/em\u0000bed"), ("key_meta", "meta/index"),
                      ("key_empty", ""), ("key_long", "model/" + "x" * 2000),
                      ("key_unicode", "model/\u00e9t\u00e9"), ("key_trailing_slash", "model/embed/"),
                      ("key_invalid_utf8", "model/\udcff")):
        lie(name, lambda j, key=key: tensor(j, k0).update(key=key))
    # Readers do not check group prefixes (format.md section 3.2); the bytes are intact, but a load
    # of the original keys misses k0.
    lie("key_group_prefix", lambda j: tensor(j, k0).update(key="model"), verify="any")
    lie("key_duplicate", lambda j: tensor(j, k1).update(key=k0))
    lie("regions_empty", lambda j: tensor(j, multi).update(regions=[]))
    lie("regions_dropped_one", lambda j: tensor(j, multi)["regions"].pop())
    lie("regions_duplicated", lambda j: tensor(j, multi)["regions"].append(dict(tensor(j, multi)["regions"][0])))

    def first_region(j):
        return tensor(j, multi)["regions"][0]

    lie("region_checksum_removed", lambda j: first_region(j).update(block_bytes=0, blocks=[]))
    lie("region_checksum_wrong", lambda j: first_region(j)["blocks"].__setitem__(0, 0x0123456789abcdef),
        load="error", verify="error")
    lie("region_blocks_extra", lambda j: first_region(j)["blocks"].append(first_region(j)["blocks"][0]))
    lie("region_blocks_missing", lambda j: first_region(j)["blocks"].clear())
    lie("region_block_bytes_zero", lambda j: first_region(j).update(block_bytes=0))
    lie("region_block_bytes_odd", lambda j: first_region(j).update(block_bytes=3))

    # Consistent lies the checksums must catch because they bind key, dtype, shape and box:
    # two same-shaped regions of one tensor trade places, and a 2-byte float is relabelled.
    def swap_boxes(j):
        for t in j["tensors"]:
            same = [r for r in t["regions"] if r["shape"] == t["regions"][0]["shape"] and not r["flat"]]
            if len(same) >= 2:
                same[0]["offset"], same[1]["offset"] = same[1]["offset"], same[0]["offset"]
                return
        raise AssertionError("the corpus fixture needs a tensor with two same-shaped box regions")

    lie("regions_swapped_boxes", swap_boxes, load="error", verify="error")
    half = [t["key"] for t in m["tensors"] if t["dtype"] in (DTYPE_CODE["bf16"], DTYPE_CODE["f16"])]
    if half:
        other = {DTYPE_CODE["bf16"]: DTYPE_CODE["f16"], DTYPE_CODE["f16"]: DTYPE_CODE["bf16"]}
        lie("dtype_half_relabelled", lambda j: tensor(j, half[0]).update(dtype=other[tensor(j, half[0])["dtype"]]),
            load="error", verify="error")
    lie("writer_u32max", lambda j: first_region(j).update(writer=2**32 - 1))
    lie("writer_past_world", lambda j: first_region(j).update(writer=len(j["saved_coords"])))
    # Two same-size tensors' offsets swapped: valid metadata pointing at the wrong bytes.
    by_size = {}
    for t in m["tensors"]:
        if t["nbytes"] > 0:
            by_size.setdefault(t["nbytes"], []).append(t["key"])
    pair = next((v for v in by_size.values() if len(v) >= 2), None)
    if pair:
        def swap(j):
            a, b = tensor(j, pair[0]), tensor(j, pair[1])
            a["file_offset"], b["file_offset"] = b["file_offset"], a["file_offset"]
        lie("offsets_swapped", swap)
    lie("attributes_unsorted", lambda j: j["attributes"].reverse() if len(j["attributes"]) > 1 else
        j["attributes"].append(j["attributes"][0]))
    lie("saved_coords_dropped", lambda j: j["saved_coords"].pop())

    # Record-level damage the decoded form cannot express.
    def put(tables, name, at, fmt, value):
        struct.pack_into(fmt, tables[name], at, value)

    lie("record_extent_missing", patch=lambda tb: put(tb, "regions", 4, "<I", 2**31))
    lie("record_extent_rank_zero", patch=lambda tb: put(tb, "extents", 32, "<I", 0))
    lie("record_extent_box_past_coords", patch=lambda tb: put(tb, "extents", 0, "<Q", 2**40))
    lie("record_extent_flat_flag", patch=lambda tb: put(tb, "extents", 36, "<I", 7))
    lie("record_key_past_names", patch=lambda tb: put(tb, "tensors", 8, "<I", 2**31))
    lie("record_shape_past_coords", patch=lambda tb: put(tb, "tensors", 16, "<Q", 2**63))
    lie("record_first_region", patch=lambda tb: put(tb, "tensors", 64 + 40, "<Q", 0))
    lie("record_first_block", patch=lambda tb: put(tb, "tensors", 64 + 56, "<Q", 2**40))
    lie("record_region_count", patch=lambda tb: put(tb, "tensors", 48, "<Q", 2**40))
    lie("record_attribute_past_names", patch=lambda tb: put(tb, "attributes", 8, "<Q", 2**40))
    lie("record_blocks_extra", patch=lambda tb: tb["blocks"].extend(b"\0" * 8))
    lie("record_region_extra", patch=lambda tb: tb["regions"].extend(REGION.pack(0, 0)))
    lie("record_names_empty", patch=lambda tb: tb["names"].clear())


def summary_lie_cases(c):
    """Lies in metadata.json (format-v2 summary), re-signed."""
    lie = c.lie
    tables = c.meta["tables"]

    def table(name, **fields):
        return lambda j: j["tables"][name].update(**fields)

    lie("table_offset_past_end", table("blocks", offset=c.data_size + 100))
    lie("table_offset_end_past_file", table("tensors", offset=c.data_size - 8))
    lie("table_offset_shifted", table("regions", offset=tables["regions"]["offset"] + 8))
    lie("table_offset_huge", table("coords", offset=2**63 - 8))
    lie("table_offset_negative", table("names", offset=-2))
    lie("table_offset_missing_for_data", table("names", offset=-1))
    lie("table_over_tensor", table("names", offset=c.index["tensors"][0]["file_offset"] if
                                   c.index["tensors"][0]["file_offset"] >= 0 else 0))
    lie("tables_overlap", table("coords", offset=tables["blocks"]["offset"]))
    lie("table_bytes_larger", lambda j: j["tables"]["blocks"].update(
        bytes=tables["blocks"]["bytes"] + 8, records=tables["blocks"]["records"] + 1))
    lie("table_bytes_huge", table("names", bytes=2**62, records=2**62))
    lie("table_records_mismatch", table("regions", records=tables["regions"]["records"] + 1))
    lie("table_record_bytes", table("tensors", record_bytes=48))
    lie("table_xxh3_wrong", table("extents", xxh3="0123456789abcdef"))
    lie("table_xxh3_uppercase", table("extents", xxh3=tables["extents"]["xxh3"].upper()))
    lie("table_dataset_name", table("blocks", dataset="/model/embed"))
    lie("table_missing", lambda j: j["tables"].pop("saved_coords"))
    lie("tables_not_object", lambda j: j.update(tables=[1, 2]))
    lie("counts_wrong", lambda j: j["counts"].update(regions=j["counts"]["regions"] + 1))
    lie("counts_missing", lambda j: j.pop("counts"))
    lie("checksums_flag_string", lambda j: j.update(checksums="yes"))
    lie("checksums_flag_missing", lambda j: j.pop("checksums"))
    lie("format_version_2p32p1", lambda j: j.update(format_version=2**32 + 1))
    lie("format_version_3", lambda j: j.update(format_version=3))
    lie("format_version_1", lambda j: j.update(format_version=1))  # read as a v1 index it has no tensors
    lie("format_version_string", lambda j: j.update(format_version="2"))
    lie("format_name", lambda j: j.update(format="h5ckpt2"))
    lie("data_file_parent", lambda j: j.update(data_file="../step-10/data.h5"))
    lie("data_file_absolute", lambda j: j.update(data_file="/etc/passwd"))
    lie("topology_tp_2p32", lambda j: j["topology"].update(tp=2**32 + 2))
    lie("topology_missing", lambda j: j.pop("topology"))
    lie("topology_world_wrong", lambda j: j["topology"].update(world=j["topology"]["world"] + 1))
    lie("step_2p64", lambda j: j.update(step=2**64 - 1))
    # Not re-signed: the self-checksum itself.
    m = c.meta
    edited = json.loads(c.meta_text)
    edited["step"] = 21
    c.raw_metadata("unsigned_edit", dumps(edited).encode())
    c.raw_metadata("index_missing", dumps({k: v for k, v in edited.items() if k != "index_xxh3"}).encode())
    c.raw_metadata("not_an_object", b"[1,2,3]")
    c.raw_metadata("nul_bytes", c.meta_text[:100] + b"\x00" * 16 + c.meta_text[116:])
    # 100k-deep nesting in an extra member ("zzz" sorts last), signed: python's json cannot
    # encode it, so the text is built by hand.
    nest = b"[" * 100000 + b"]" * 100000
    body = dumps({k: v for k, v in m.items() if k != "index_xxh3"}).encode()
    body = body[:-1] + b',"zzz":' + nest + b"}"
    full = dumps(m).encode()[:-1]
    full = full.replace(b'"index_xxh3":"%s"' % m["index_xxh3"].encode(),
                        b'"index_xxh3":"%s"' % xxh3(body).encode()) + b',"zzz":' + nest + b"}"
    c.raw_metadata("nesting_100k", full)
    c.raw_metadata("nesting_100k_unsigned", b'{"a":' + nest + b"}")


def latest_cases(c):
    bad_latest = {
        "latest_dotdot": b"../..\n",
        "latest_dot": b".\n",
        "latest_absolute": b"/etc\n",
        "latest_absolute_valid": (os.path.abspath(os.path.join(c.src, "step-20")) + "\n").encode(),
        "latest_traversal": b"step-20/../step-10\n",
        "latest_garbage": bytes(random.Random(5).getrandbits(8) for _ in range(64)),
        "latest_empty": b"",
        "latest_whitespace": b" \r\n",
        "latest_missing_target": b"step-99\n",
        "latest_nul": b"step-20\x00junk\n",
        "latest_inprogress": b".step-30.inprogress-deadbeef\n",
        "latest_uncommitted": b"step-25\n",
        "latest_bad_metadata": b"step-15\n",
        "latest_huge": b"a" * (4 << 20),
        "latest_valid_with_spaces": b"step-20 \r\n",
    }
    for name, text in bad_latest.items():
        d = c.latest_case(name)
        with open(os.path.join(d, "latest"), "wb") as f:
            f.write(text)
    d = c.latest_case("latest_symlink_loop")
    os.symlink("latest", os.path.join(d, "latest"))
    d = c.latest_case("latest_symlink_pair")
    os.symlink("latest2", os.path.join(d, "latest"))
    os.symlink("latest", os.path.join(d, "latest2"))
    d = c.latest_case("latest_symlink_passwd")
    os.symlink("/etc/passwd", os.path.join(d, "latest"))
    d = c.latest_case("latest_is_dir")
    os.mkdir(os.path.join(d, "latest"))
    d = c.latest_case("latest_missing")
    # latest names a valid checkpoint whose data file was damaged.
    d = c.latest_case("latest_target_corrupt")
    with open(os.path.join(d, "latest"), "wb") as f:
        f.write(b"step-20\n")
    t = next(t for t in c.index["tensors"] if t["nbytes"] > 0)
    flip(os.path.join(d, "step-20", "data.h5"), t["file_offset"], 0x10)


def verification_off_cases(c):
    """Index lies that would switch verification off (issue 25), each with a byte of the region
    they describe flipped: a reader that believes the lie delivers the flipped byte."""
    m = c.index
    # The largest first region in box form: the wrap needs region bytes above one slab.
    t = max((t for t in m["tensors"] if t["nbytes"] > 0 and t["regions"] and not t["regions"][0]["flat"]),
            key=lambda t: prod(t["regions"][0]["shape"]) * DTYPE_SIZE[t["dtype"]])
    r0 = t["regions"][0]
    es = DTYPE_SIZE[t["dtype"]]
    assert prod(r0["shape"]) * es > es * prod(r0["shape"][1:]), "the fixture needs a region of several rows"
    slab = es * prod(r0["shape"][1:])
    # The byte of the region's first element in the row-major data set.
    pos = t["file_offset"] + es * sum(o * prod(t["shape"][d + 1:]) for d, o in enumerate(r0["offset"]))

    def region(j):
        return tensor(j, t["key"])["regions"][0]

    cases = {
        # (region + block - 1) wraps: zero blocks for a region that has bytes.
        "verify_off_block_bytes_wrap": lambda j: region(j).update(block_bytes=(2**64 - 1) // slab * slab, blocks=[]),
        # 2^63 and above: negative as a signed element count.
        "verify_off_block_bytes_2p63": lambda j: region(j).update(block_bytes=(2**63 // slab) * slab,
                                                                   blocks=region(j)["blocks"][:1]),
        "verify_off_block_bytes_2p62": lambda j: region(j).update(block_bytes=(2**62 // slab) * slab,
                                                                   blocks=region(j)["blocks"][:1]),
    }
    for name, edit in cases.items():
        c.index_lie(name, edit)
        flip(os.path.join(c.out, "cases", name, "ckpt", "data.h5"), pos, 0x01)
    # Readers must not block on a non-regular file (issue 25): the data file is a FIFO.
    d = c.ckpt_case("data_is_fifo")
    os.unlink(os.path.join(d, "data.h5"))
    os.mkfifo(os.path.join(d, "data.h5"))


def hostile_text_cases(c):
    """Attribute bytes that are not UTF-8 and control characters (issue 25): a valid checkpoint
    whose text `inspect` must escape (text and --json, the checkpoint and its directory)."""
    hostile = b"\xff\xfe not utf-8 \x1b[31m escape \x07 bell \x00 nul"
    if not c.index["attributes"]:
        return

    def value(j):
        k, _ = j["attributes"][0]
        j["attributes"][0] = (k, hostile)

    def key(j):
        k, v = j["attributes"][-1]
        j["attributes"][-1] = (k + b"\xe9\x1b", v)  # still sorted last
    for name, edit in (("attribute_value_hostile", value), ("attribute_key_hostile", key)):
        c.index_lie(name, edit, load="ok", verify="ok")
        c.cases[-1]["text_checks"] = True


def nothing_valid_cases(c):
    """Directories that hold checkpoints of which none validates: an error that is not "not found"
    (issue 25: a trainer took that for an empty directory, started at step 0 and overwrote them)."""
    def damage_all(d):
        for e in os.listdir(d):
            meta = os.path.join(d, e, "metadata.json")
            if os.path.isfile(meta):
                with open(meta, "wb") as f:
                    f.write(b"{not json")
    d = c.latest_case("nothing_valid_no_latest", load="error", verify="error")
    damage_all(d)
    c.cases[-1]["refuse_not_found"] = True
    d = c.latest_case("nothing_valid_latest_missing_target", load="error", verify="error")
    damage_all(d)
    with open(os.path.join(d, "latest"), "wb") as f:
        f.write(b"step-99\n")
    c.cases[-1]["refuse_not_found"] = True
    d = c.latest_case("nothing_valid_latest_empty_dir", load="error", verify="error")
    damage_all(d)
    os.mkdir(os.path.join(d, "step-99"))
    with open(os.path.join(d, "latest"), "wb") as f:
        f.write(b"step-99\n")
    c.cases[-1]["refuse_not_found"] = True
    d = c.latest_case("nothing_valid_data_missing", load="error", verify="error")
    for e in os.listdir(d):
        if os.path.isfile(os.path.join(d, e, "data.h5")):
            os.unlink(os.path.join(d, e, "data.h5"))
    c.cases[-1]["refuse_not_found"] = True


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fixture", required=True, help="output directory of cli_make_fixture")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    c = Corpus(a.fixture, a.out)
    rng = random.Random(20240601)
    byte_cases(c, rng)
    index_lie_cases(c)
    summary_lie_cases(c)
    latest_cases(c)
    verification_off_cases(c)
    nothing_valid_cases(c)
    hostile_text_cases(c)
    # The pristine checkpoint, as a control: must load and verify.
    c.ckpt_case("control_pristine", load="ok", verify="ok")
    c.write_manifest()
    print("corpus: %d cases in %s" % (len(c.cases), a.out))


if __name__ == "__main__":
    main()
