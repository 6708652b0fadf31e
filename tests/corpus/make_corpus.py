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

Metadata lies are re-signed (index_xxh3 recomputed as in docs/format.md section 4.2), so they
reach the validation behind the self-checksum. Needs only the standard library and libxxhash.
"""
import argparse
import ctypes
import json
import os
import random
import shutil

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
        self.data_size = os.path.getsize(os.path.join(self.src, "step-20", "data.h5"))

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
        meta = json.loads(self.meta_text)
        edit(meta)
        d = self.ckpt_case(name, load, verify)
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(sign(meta))

    def raw_metadata(self, name, text, load="error", verify="error"):
        d = self.ckpt_case(name, load, verify)
        with open(os.path.join(d, "metadata.json"), "wb") as f:
            f.write(text)

    def write_manifest(self):
        with open(os.path.join(self.out, "manifest.json"), "w") as f:
            json.dump(self.cases, f, indent=1)


def tensor(meta, key):
    return next(t for t in meta["tensors"] if t["key"] == key)


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
    tensors = [t for t in c.meta["tensors"] if t["nbytes"] > 0]
    # Flips inside tensor bytes: a verified load and verify must catch every one (region checksums).
    for t in tensors:
        for where, pos in (("first", t["file_offset"]), ("last", t["file_offset"] + t["nbytes"] - 1)):
            d = c.ckpt_case("data_flip_%s_%s" % (t["key"].replace("/", "_"), where))
            flip(os.path.join(d, "data.h5"), pos, 0x01)
    # Flips elsewhere (HDF5 superblock, object headers, /meta, padding): the loader never parses
    # them, so "any" -- but if it loads, the data must be the original.
    owned = [(t["file_offset"], t["file_offset"] + t["nbytes"]) for t in tensors]
    others = [p for p in range(c.data_size) if not any(b <= p < e for b, e in owned)]
    for pos in sorted(set([0, 1, 8, 9] + rng.sample(others, min(20, len(others))))):
        d = c.ckpt_case("data_flip_other_%d" % pos, load="any", verify="any")
        flip(os.path.join(d, "data.h5"), pos, 0xff)
    last_end = max(e for _, e in owned)
    for size in (0, 8, c.data_size // 2, last_end - 1):
        d = c.ckpt_case("data_truncate_%d" % size)
        truncate(os.path.join(d, "data.h5"), size)
    for size in (last_end, c.data_size - 1):  # only HDF5 structures after the last tensor lost
        d = c.ckpt_case("data_truncate_tail_%d" % size, load="any", verify="any")
        truncate(os.path.join(d, "data.h5"), size)
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


def lie_cases(c):
    m = c.meta
    keys = [t["key"] for t in m["tensors"] if t["nbytes"] > 0]
    k0, k1 = keys[0], keys[1]
    multi = next(t["key"] for t in m["tensors"] if len(t["regions"]) > 1)

    c.lie("offset_past_end", lambda j: tensor(j, k0).update(file_offset=c.data_size + 1000))
    c.lie("offset_end_past_file", lambda j: tensor(j, k0).update(file_offset=c.data_size - 1))
    c.lie("offset_negative", lambda j: tensor(j, k0).update(file_offset=-1))
    c.lie("offset_overlap", lambda j: tensor(j, k1).update(file_offset=tensor(j, k0)["file_offset"]))
    c.lie("offset_huge", lambda j: tensor(j, k0).update(file_offset=2**63 - 8))
    c.lie("shape_overflow", lambda j: tensor(j, k0).update(shape=[2**31, 2**31, 2**31]))
    c.lie("shape_overflow_nbytes", lambda j: tensor(j, k0).update(shape=[2**61, 4], nbytes=2**63 - 1))
    c.lie("shape_u64", lambda j: tensor(j, k0).update(shape=[2**64 - 1]))
    c.lie("shape_negative", lambda j: tensor(j, k0).update(shape=[-1] + tensor(j, k0)["shape"][1:]))
    c.lie("shape_33_dims", lambda j: tensor(j, k0).update(shape=[1] * 33))
    c.lie("shape_float", lambda j: tensor(j, k0).update(shape=[float(s) for s in tensor(j, k0)["shape"]]))
    c.lie("nbytes_plus_4", lambda j: tensor(j, k0).update(nbytes=tensor(j, k0)["nbytes"] + 4))
    c.lie("nbytes_u64max", lambda j: tensor(j, k0).update(nbytes=2**64 - 1))

    def box_outside(j):
        r = tensor(j, multi)["regions"][-1]
        r["offset"] = [o + s for o, s in zip(r["offset"], tensor(j, multi)["shape"])]

    c.lie("box_outside_shape", box_outside)
    c.lie("box_negative_offset", lambda j: tensor(j, multi)["regions"][0].update(
        offset=[-1] * len(tensor(j, multi)["shape"])))
    c.lie("box_rank_mismatch", lambda j: tensor(j, multi)["regions"][0].update(
        offset=tensor(j, multi)["regions"][0]["offset"] + [0]))
    c.lie("flat_beyond_box", lambda j: tensor(j, multi)["regions"][0].update(flat=[0, 2**40]))
    c.lie("flat_reversed", lambda j: tensor(j, multi)["regions"][0].update(flat=[3, 1]))
    c.lie("unknown_dtype", lambda j: tensor(j, k0).update(dtype="f128"))
    c.lie("dtype_not_string", lambda j: tensor(j, k0).update(dtype=4))
    # Self-consistent: a same-size dtype the loader cannot convert to what it asks for.
    f32 = next(t["key"] for t in m["tensors"] if t["dtype"] == "f32")
    c.lie("dtype_f32_as_i32", lambda j: tensor(j, f32).update(dtype="i32"), verify="any")
    for name, key in (("key_dotdot", "model/../etc/passwd"), ("key_absolute", "/etc/passwd"),
                      ("key_nul", "model/em\u0000bed"), ("key_meta", "meta/index"),
                      ("key_empty", ""), ("key_long", "model/" + "x" * 2000),
                      ("key_unicode", "model/\u00e9t\u00e9"), ("key_trailing_slash", "model/embed/")):
        c.lie(name, lambda j, key=key: tensor(j, k0).update(key=key))
    # Readers do not check group prefixes (format.md section 3.2); the bytes are intact, but a load
    # of the original keys misses k0.
    c.lie("key_group_prefix", lambda j: tensor(j, k0).update(key="model"), verify="any")
    c.lie("key_duplicate", lambda j: tensor(j, k1).update(key=k0))
    c.lie("key_not_string", lambda j: tensor(j, k0).update(key=7))
    c.lie("regions_empty", lambda j: tensor(j, multi).update(regions=[]))
    c.lie("regions_dropped_one", lambda j: tensor(j, multi)["regions"].pop())
    c.lie("regions_duplicated", lambda j: tensor(j, multi)["regions"].append(tensor(j, multi)["regions"][0]))
    c.lie("regions_not_array", lambda j: tensor(j, multi).update(regions={}))
    c.lie("region_checksum_removed", lambda j: tensor(j, multi)["regions"][0].pop("blocks"))

    def block_sums(j):
        return tensor(j, multi)["regions"][0]["blocks"]["xxh3"]

    c.lie("region_checksum_wrong", lambda j: block_sums(j).__setitem__(0, "0123456789abcdef"),
          load="error", verify="error")
    c.lie("region_checksum_uppercase", lambda j: block_sums(j).__setitem__(0, block_sums(j)[0].upper()))
    c.lie("region_blocks_extra", lambda j: block_sums(j).append(block_sums(j)[0]))
    c.lie("region_blocks_missing", lambda j: block_sums(j).clear())
    c.lie("region_block_bytes_zero", lambda j: tensor(j, multi)["regions"][0]["blocks"].update(bytes=0))
    c.lie("region_block_bytes_odd", lambda j: tensor(j, multi)["regions"][0]["blocks"].update(bytes=3))
    c.lie("region_blocks_not_object", lambda j: tensor(j, multi)["regions"][0].update(blocks=[1, 2]))

    # Consistent lies the checksums must catch because they bind key, dtype, shape and box:
    # two same-shaped regions of one tensor trade places, and a 2-byte float is relabelled.
    def swap_boxes(j):
        for t in j["tensors"]:
            same = [r for r in t["regions"] if r["shape"] == t["regions"][0]["shape"] and "flat" not in r]
            if len(same) >= 2:
                same[0]["offset"], same[1]["offset"] = same[1]["offset"], same[0]["offset"]
                return
        raise AssertionError("the corpus fixture needs a tensor with two same-shaped box regions")

    c.lie("regions_swapped_boxes", swap_boxes, load="error", verify="error")
    half = [t["key"] for t in m["tensors"] if t["dtype"] in ("bf16", "f16")]
    if half:
        other = {"bf16": "f16", "f16": "bf16"}
        c.lie("dtype_half_relabelled", lambda j: tensor(j, half[0]).update(
            dtype=other[tensor(j, half[0])["dtype"]]), load="error", verify="error")
    c.lie("checksums_flag_string", lambda j: j.update(checksums="yes"))
    c.lie("writer_2p32", lambda j: tensor(j, multi)["regions"][0].update(writer=2**32))
    c.lie("writer_negative", lambda j: tensor(j, multi)["regions"][0].update(writer=-1))
    c.lie("writer_past_world", lambda j: tensor(j, multi)["regions"][0].update(writer=len(j["topology"]["coords"])))
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
        c.lie("offsets_swapped", swap)
    c.lie("format_version_2p32p1", lambda j: j.update(format_version=2**32 + 1))
    c.lie("format_version_2", lambda j: j.update(format_version=2))
    c.lie("format_version_string", lambda j: j.update(format_version="1"))
    c.lie("format_name", lambda j: j.update(format="h5ckpt2"))
    c.lie("data_file_parent", lambda j: j.update(data_file="../step-10/data.h5"))
    c.lie("data_file_absolute", lambda j: j.update(data_file="/etc/passwd"))
    c.lie("topology_tp_2p32", lambda j: j["topology"].update(tp=2**32 + 2))
    c.lie("topology_missing", lambda j: j.pop("topology"))
    c.lie("coords_garbage", lambda j: j["topology"].update(coords=[[0, 0], "x"]))
    c.lie("tensors_not_array", lambda j: j.update(tensors={"a": 1}))
    c.lie("tensor_not_object", lambda j: j["tensors"].append(5))
    c.lie("step_2p64", lambda j: j.update(step=2**64 - 1))
    # Not re-signed: the self-checksum itself.
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
    t = next(t for t in c.meta["tensors"] if t["nbytes"] > 0)
    flip(os.path.join(d, "step-20", "data.h5"), t["file_offset"], 0x10)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fixture", required=True, help="output directory of cli_make_fixture")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    c = Corpus(a.fixture, a.out)
    rng = random.Random(20240601)
    byte_cases(c, rng)
    lie_cases(c)
    latest_cases(c)
    # The pristine checkpoint, as a control: must load and verify.
    c.ckpt_case("control_pristine", load="ok", verify="ok")
    c.write_manifest()
    print("corpus: %d cases in %s" % (len(c.cases), a.out))


if __name__ == "__main__":
    main()
