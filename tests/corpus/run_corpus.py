#!/usr/bin/env python3
"""Runs `h5ckpt inspect` and `h5ckpt verify` on every case of a corpus (make_corpus.py).

A case passes when each command ends by itself within the timeout with an exit status below 128
(not killed by a signal), and with a non-zero status where the manifest says "error" (zero where
it says "ok"). Prints one line per failure and a summary; exits 1 if any case failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def run(cmd, timeout):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", time.monotonic() - t0
    return p.returncode, (p.stderr or p.stdout).decode(errors="replace").strip(), time.monotonic() - t0


def text_checks(a, c):
    """`inspect` of a checkpoint with hostile attribute text: JSON that parses, and no raw control
    byte on a terminal (the text form), for the checkpoint and for its directory."""
    out = []
    for target in (c["target"], os.path.dirname(c["target"])):
        for args in (["--json"], []):
            cmd = [a.h5ckpt, "inspect"] + args + [target]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=a.timeout)
            what = "inspect %s %s" % (" ".join(args), c["name"] if target == c["target"] else c["name"] + " (directory)")
            found = len(out)
            if p.returncode != 0:
                out.append("%s: status %d: %s" % (what, p.returncode, p.stderr.decode(errors="replace")[-300:]))
                continue
            if args:
                try:
                    json.loads(p.stdout.decode("utf-8"))
                except ValueError as e:
                    out.append("%s: output is not JSON in UTF-8: %s" % (what, e))
            elif any(b in p.stdout for b in (b"\x1b", b"\x07", b"\x00")):
                out.append("%s: raw control characters on the terminal" % what)
            print("%-8s %-45s %s" % ("text", what[:45], "ok" if len(out) == found else "FAILED"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--h5ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--only", default="", help="substring of the case names to run")
    a = ap.parse_args()
    with open(a.corpus + "/manifest.json") as f:
        cases = [c for c in json.load(f) if a.only in c["name"]]
    failures, slowest = [], (0.0, "")
    for c in cases:
        for sub in ("inspect", "verify"):
            rc, msg, secs = run([a.h5ckpt, sub, c["target"]], a.timeout)
            slowest = max(slowest, (secs, "%s %s" % (sub, c["name"])))
            want = c["verify"] if sub == "verify" else ("ok" if c["verify"] == "ok" else "any")
            why = None
            if rc is None:
                why = "hung (no exit within %g s)" % a.timeout
            elif rc < 0 or rc >= 128:
                why = "crashed (status %d)" % rc
            elif want == "error" and rc == 0:
                why = "accepted a corrupt checkpoint"
            elif want == "ok" and rc != 0:
                why = "refused the pristine checkpoint"
            if why:
                failures.append("%s %s: %s: %s" % (sub, c["name"], why, msg[-300:]))
            print("%-8s %-45s rc=%s %.2fs %s" % (sub, c["name"], rc, secs, msg.splitlines()[-1][:100] if msg else ""))
        if c.get("text_checks"):
            failures += text_checks(a, c)
    for f in failures:
        print("FAIL", f)
    print("%d cases x 2 commands, %d failures; slowest %.2f s (%s)" % (len(cases), len(failures), *slowest))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
