#!/usr/bin/env python3
"""False alarms of `gradscope check` (docs/tuner.md "CI gate"): a run checked against repeats of itself.

Runs the same MPI benchmark (2 ranks, 8 B to 1 MiB by 4, 20 iterations, 5 warm-up) once as the baseline and
PAIRS more times (repeats: no change at all), and checks each repeat against the baseline with
`<build>/cli/gradscope check` (exit 1 = a regression reported: here, a false alarm). Then, to show the gate
still sees a real change on the same noisy data, it checks a copy of each repeat with every time multiplied
by 1.2 (a 20% slowdown everywhere) and counts how many of those are caught.

  bench/check_false_alarms.py BUILD_DIR [--pairs 20] [--keep DIR]

Needs `gradscope check` wired into the gradscope command; until then it stops with one line saying so.
"""
import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
BENCH_ARGS = ["bench", "--backend", "mpi", "-b", "8", "-e", "1M", "-f", "4", "-n", "20", "-w", "5", "--no-progress"]


def bench(gradscope, path):
    command = ["mpirun", "--oversubscribe", "-np", "2", gradscope] + BENCH_ARGS + ["-o", path]
    result = subprocess.run(command, env={**os.environ, **MPI_ENV}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"check_false_alarms: {' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")


def check(gradscope, baseline, current):
    result = subprocess.run([gradscope, "check", "--baseline", baseline, current], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode not in (0, 1):
        sys.exit(f"check_false_alarms: gradscope check failed ({result.returncode}): {result.stderr.strip()}")
    regressed = [line for line in result.stdout.splitlines() if line.startswith("regression ")]
    return result.returncode, regressed


def slowed(path, factor, out):
    shutil.copyfile(path, out)
    with sqlite3.connect(out) as db:
        db.execute("UPDATE measurements SET min_ns = min_ns * ?, median_ns = median_ns * ?, p90_ns = p90_ns * ?, "
                   "max_ns = max_ns * ?", (factor,) * 4)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--keep", help="directory to keep the traces in (default: a temporary one)")
    args = parser.parse_args()
    gradscope = os.path.join(args.build, "cli", "gradscope")
    probe = subprocess.run([gradscope, "check", "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        sys.exit(f"check_false_alarms: {gradscope} has no check command yet (build the gradscope target)")

    work = args.keep or tempfile.mkdtemp(prefix="gradscope-check-")
    os.makedirs(work, exist_ok=True)
    baseline = os.path.join(work, "baseline.db")
    bench(gradscope, baseline)
    false_alarms = caught = 0
    for i in range(args.pairs):
        repeat = os.path.join(work, f"repeat-{i:02d}.db")
        bench(gradscope, repeat)
        code, regressed = check(gradscope, baseline, repeat)
        false_alarms += code == 1
        slow_code, slow_regressed = check(gradscope, baseline, slowed(repeat, 1.2, repeat + ".slow.db"))
        caught += slow_code == 1
        print(f"pair {i + 1:2d}: repeat {'REGRESSION' if code else 'ok':10s} ({len(regressed)} keys)   "
              f"repeat x1.2 {'caught' if slow_code else 'missed':6s} ({len(slow_regressed)} keys)", flush=True)
    print(f"false alarms: {false_alarms} of {args.pairs} repeats reported a regression")
    print(f"20% slowdown: caught in {caught} of {args.pairs}")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
