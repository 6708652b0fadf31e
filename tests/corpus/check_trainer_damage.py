#!/usr/bin/env python3
"""A directory of damaged checkpoints must never send the trainer back to step 0 silently, nor be
overwritten (issue 25). `check_trainer_damage.py --work DIR -- TRAINER_CMD...` (the trainer command
with mpiexec and a small model; --ckpt-dir, --steps and --save-every are added here):

1. the trainer saves steps 1 and 2; every metadata.json is then damaged and `latest` removed;
2. a restart fails (status 1), names the damaged checkpoints and changes no file;
3. a restart naming them through a `latest` that points to a missing checkpoint: the same;
4. --start-fresh whose saves would land on a damaged step: refused at that save, nothing changed;
5. --start-fresh whose saves land elsewhere: trains from step 0, and the damaged ones are intact.
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys


def snapshot(root, skip=()):
    """Path -> sha256 of every file under root (FIFOs and other specials by type)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            if any(rel.split(os.sep)[0].startswith(s) for s in skip):
                continue
            with open(p, "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def run(cmd, timeout=240):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    trainer = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    shutil.rmtree(a.work, ignore_errors=True)
    ckpt = os.path.join(a.work, "ckpt")
    failures = []

    def check(cond, what, out=""):
        print(("ok    " if cond else "FAIL  ") + what)
        if not cond:
            failures.append(what)
            print(out[-3000:])

    rc, out = run(trainer + ["--ckpt-dir", ckpt, "--steps", "2", "--save-every", "1"])
    if rc != 0:
        print(out)
        sys.exit("FAIL: the first run did not save (status %d)" % rc)
    steps = sorted(e for e in os.listdir(ckpt) if e.startswith("step-") and os.path.isdir(os.path.join(ckpt, e)))
    check(len(steps) == 2, "the first run committed two checkpoints (%s)" % steps)
    for s in steps:
        with open(os.path.join(ckpt, s, "metadata.json"), "wb") as f:
            f.write(b"{damaged")
    os.unlink(os.path.join(ckpt, "latest"))
    before = snapshot(ckpt)

    # 2. No `latest`, nothing valid: an error naming each, no file changed.
    rc, out = run(trainer + ["--ckpt-dir", ckpt, "--steps", "3", "--save-every", "1"])
    check(rc == 1, "restart over damaged checkpoints fails (status %d)" % rc, out)
    check(all(s in out for s in steps) and "none validates" in out, "the error names each damaged checkpoint", out)
    check(not re.search(r"starting from step 0", out), "no fresh start", out)
    check(snapshot(ckpt) == before, "no file changed")

    # 3. `latest` names a checkpoint that does not exist, nothing else valid: the same.
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write("step-00000099\n")
    before = snapshot(ckpt)
    rc, out = run(trainer + ["--ckpt-dir", ckpt, "--steps", "3", "--save-every", "1"])
    check(rc == 1 and "does not exist" in out, "a `latest` naming a missing checkpoint fails (status %d)" % rc, out)
    check(snapshot(ckpt) == before, "no file changed")

    # 4. --start-fresh, but step 1 would overwrite a damaged checkpoint: refused there.
    rc, out = run(trainer + ["--ckpt-dir", ckpt, "--steps", "3", "--save-every", "1", "--start-fresh"])
    check(rc == 1 and "refusing to overwrite" in out, "--start-fresh never overwrites a damaged step (status %d)" % rc,
          out)
    check(snapshot(ckpt) == before, "no file changed")

    # 5. --start-fresh with saves at steps 3 and 4 only: trains from 0, the damaged ones intact.
    rc, out = run(trainer + ["--ckpt-dir", ckpt, "--steps", "4", "--save-every", "3", "--start-fresh"])
    check(rc == 0 and "--start-fresh: starting from step 0" in out, "--start-fresh trains from step 0 (status %d)" % rc,
          out)
    after = snapshot(ckpt, skip=("latest", ".h5ckpt", "step-00000003", "step-00000004"))
    kept = {k: v for k, v in before.items() if not k.startswith("latest") and k != ".h5ckpt.lock"}
    changed = sorted(k for k in set(kept) | set(after) if kept.get(k) != after.get(k))
    check(not changed, "the damaged checkpoints are unchanged after a fresh run (changed: %s)" % changed)
    check(os.path.isdir(os.path.join(ckpt, "step-00000004")), "the fresh run committed step 4", out)

    print("%d failures" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
