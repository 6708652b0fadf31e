#!/usr/bin/env python3
"""`h5ckpt report` end to end: renders tests/report/metrics.json placed beside a fake checkpoint
directory and checks the HTML with an independent parse (xml.etree on the inline SVG, medians
recomputed here). Usage: check_report_cli.py H5CKPT METRICS_JSON WORKDIR. Exit 77: `report` is
not registered in this build of the CLI."""
import json
import shutil
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

exe, fixture, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


# `h5ckpt report --help` succeeds even when `report` is unknown (--help wins): ask the top level.
probe = subprocess.run([exe, "--help"], capture_output=True, text=True)
if not any(line.split()[:1] == ["report"] for line in probe.stdout.splitlines()):
    print("`h5ckpt report` is not registered in this build (src/tools/main.cpp): skipped")
    sys.exit(77)

shutil.rmtree(work, ignore_errors=True)
(work / "ckpt" / "step-00000010").mkdir(parents=True)
(work / "ckpt" / "latest").write_text("step-00000010")
shutil.copy(fixture, work / "ckpt" / "step-00000010.save.json")
doc = json.loads(fixture.read_text())
out = work / "out.html"

run = subprocess.run([exe, "report", str(work / "ckpt"), "--out", str(out)], capture_output=True, text=True)
if run.returncode != 0:
    fail(f"exit {run.returncode}: {run.stdout}{run.stderr}")

# Expected stragglers, computed here: slowest >= 1.5x median and >= 0.01 s above it.
phases = doc["phase_order"]
secs = {(r["rank"], p): r["phases"][p] for r in doc["ranks"] for p in phases}
expected = set()
for p in phases:
    vals = [secs[(r["rank"], p)] for r in doc["ranks"]]
    med, top = statistics.median(vals), max(vals)
    if top >= 1.5 * med and top - med >= 0.01:
        slow = min(r["rank"] for r in doc["ranks"] if secs[(r["rank"], p)] == top)
        expected.add((slow, p))
        line = f"straggler: rank {slow} in {p} ({top:.3f} s vs median {med:.3f} s"
        if line not in run.stdout:
            fail(f"stdout lacks '{line}':\n{run.stdout}")
if expected != {(2, "write")}:
    fail(f"fixture no longer has exactly one straggler: {expected}")

html = out.read_text()
start, end = html.index("<svg"), html.index("</svg>") + len("</svg>")
svg = ET.fromstring(html[start:end])
ns = "{http://www.w3.org/2000/svg}"
cells = [e for e in svg.iter(ns + "rect") if e.get("class", "").split()[:1] == ["cell"]]
if len(cells) != len(doc["ranks"]) * len(phases):
    fail(f"{len(cells)} cells, expected {len(doc['ranks'])} x {len(phases)}")
seen = set()
labels = [t for t in svg.iter(ns + "text") if t.get("class") == "cell-label"]
if len(labels) != len(cells):
    fail(f"{len(labels)} cell labels for {len(cells)} cells")
for cell, label in zip(cells, labels):
    key = (int(cell.get("data-rank")), cell.get("data-phase"))
    seen.add(key)
    want = secs[key]
    if abs(float(cell.get("data-seconds")) - want) > 1e-12:
        fail(f"cell {key}: data-seconds {cell.get('data-seconds')} != {want}")
    if label.text != f"{want:.3f}":
        fail(f"cell {key}: label {label.text!r} != {want:.3f}")
    flagged = "straggler" in cell.get("class").split()
    if flagged != (key in expected):
        fail(f"cell {key}: straggler mark {flagged}, expected {key in expected}")
if seen != set(secs):
    fail(f"cells cover {sorted(seen)}, expected {sorted(secs)}")

# A missing checkpoint is an error with a non-zero exit status and a message.
bad = subprocess.run([exe, "report", str(work / "nope")], capture_output=True, text=True)
if bad.returncode == 0 or "nope" not in bad.stderr:
    fail(f"missing path: exit {bad.returncode}, stderr {bad.stderr!r}")
print(f"report_cli OK: {len(cells)} cells, straggler rank 2 in write, {out}")
