#!/usr/bin/env python3
"""Runs every ptdp command of README.md's shell blocks, as a reader would paste them.

Each ``` block (no language tag) that mentions ./build/ptdp is run line by line (backslash
continuations joined) in one scratch folder that holds links to the binary (build/ptdp), the
scenarios and topologies, and a copy of profiles/, so that one block's files (zb.csv,
profiles/local.yaml) feed the next command. Where a command would take minutes, SMALLER lists
the change that keeps it short (same command, smaller settings). Commands that need hardware
this machine lacks are run too when they can fail cleanly here (`--backend cuda` must exit with
a message naming CUDA, not crash); commands that need a cluster (srun, mpirun -H hosts) are
listed as skipped with the reason.

usage: readme_commands.py README.md PTDP_BINARY
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# (pattern in the command, text appended or replaced): small settings for slow commands.
SMALLER = [
    (r"sweep scenarios/gpt3-175b\.yaml --auto", lambda c: c + " --top 1 --fidelity analytic"),  # 75 s with 10 SimGrid runs
    (r"--steps 20\b", lambda c: re.sub(r"--steps 20\b", "--steps 3", c)),
    (r"validate --suite cpu", lambda c: c + " --steps 2"),
    (r"validate scenarios/tiny-gpt-cpu\.yaml", lambda c: c + " --steps 2"),
    # A DGX node has the cores for 8 ranks; this machine needs --oversubscribe to start them.
    (r"^mpirun -np 8 ", lambda c: c.replace("mpirun -np 8 ", "mpirun --oversubscribe -np 8 ", 1)),
]
SKIP = [
    (r"^srun ", "needs a Slurm cluster"),
    (r"-H dgx", "needs the named hosts"),
]


def blocks(readme):
    """[(first line number, [command lines])] of the shell blocks that run ptdp."""
    out, current, lang, start = [], None, None, 0
    for n, line in enumerate(open(readme, encoding="utf-8"), 1):
        if line.startswith("```"):
            if current is None:
                current, lang, start = [], line[3:].strip(), n
            else:
                if not lang and any("./build/ptdp" in l for l in current):
                    out.append((start, current))
                current = None
            continue
        if current is not None:
            current.append(line.rstrip("\n"))
    return out


def commands(lines):
    joined, buf = [], ""
    for l in lines:
        if l.rstrip().endswith("\\"):
            buf += l.rstrip()[:-1] + " "
            continue
        buf += l
        code = buf.split(" #")[0].strip() if not buf.strip().startswith("#") else ""
        if code:
            joined.append(code)
        buf = ""
    return joined


def main():
    readme, binary = sys.argv[1], os.path.abspath(sys.argv[2])
    root = os.path.dirname(os.path.abspath(readme))
    passed, failed, skipped = 0, 0, 0
    with tempfile.TemporaryDirectory(prefix="ptdp-readme-") as work:
        os.makedirs(os.path.join(work, "build"))
        os.symlink(binary, os.path.join(work, "build", "ptdp"))
        for d in ("scenarios", "topologies", "scripts"):
            os.symlink(os.path.join(root, d), os.path.join(work, d))
        shutil.copytree(os.path.join(root, "profiles"), os.path.join(work, "profiles"))
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   PTDP_CACHE_DIR=os.path.join(work, "cache"))
        for start, lines in blocks(readme):
            for cmd in commands(lines):
                if "ptdp" not in cmd and not cmd.startswith(("printf", "export")):
                    print(f"README.md:{start}: not a ptdp command, not run: {cmd}")
                    continue
                cmd = cmd.replace("./scripts/setup.sh && ", "")  # the build is the one under test
                why = next((w for p, w in SKIP if re.search(p, cmd)), None)
                if why:
                    skipped += 1
                    print(f"SKIP README.md:{start}: {why}: {cmd[:100]}")
                    continue
                for p, change in SMALLER:
                    if re.search(p, cmd):
                        cmd = change(cmd)
                if cmd.startswith("export "):
                    for name, value in re.findall(r"(\w+)=(\S+)", cmd.split("#")[0]):
                        env[name] = value
                    continue
                cuda = "--backend cuda" in cmd
                try:
                    r = subprocess.run(cmd, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=600,
                                       stdin=subprocess.DEVNULL)
                    rc, err = r.returncode, r.stderr
                except subprocess.TimeoutExpired:
                    rc, err = -1, "timed out after 600 s"
                ok = (rc in (1, 2) and "cuda" in err.lower()) if cuda else rc == 0
                tag = "PASS" if ok else "FAIL"
                passed += ok
                failed += not ok
                print(f"{tag} README.md:{start}: exit {rc}{' (expected: no GPU here)' if cuda else ''}: {cmd[:160]}", flush=True)
                if not ok:
                    print("  stderr: " + err[-2000:].replace("\n", "\n  "))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
