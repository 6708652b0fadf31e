#!/usr/bin/env python3
"""Runs a command and checks how it ends: `check_cmd.py --rc N --expect REGEX [--reject REGEX] -- CMD...`.
Fails on a timeout, a signal, another exit status, or output that lacks REGEX / has --reject."""
import argparse
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--rc", type=int, required=True)
ap.add_argument("--expect", required=True)
ap.add_argument("--reject", default=None)
ap.add_argument("--timeout", type=float, default=120)
ap.add_argument("cmd", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
try:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=a.timeout)
except subprocess.TimeoutExpired:
    sys.exit("FAIL: no exit within %g s: %s" % (a.timeout, " ".join(cmd)))
out = p.stdout.decode(errors="replace")
print(out[-4000:])
if p.returncode != a.rc:
    sys.exit("FAIL: exit status %d, expected %d" % (p.returncode, a.rc))
if not re.search(a.expect, out):
    sys.exit("FAIL: output lacks /%s/" % a.expect)
if a.reject and re.search(a.reject, out):
    sys.exit("FAIL: output has /%s/" % a.reject)
print("ok")
