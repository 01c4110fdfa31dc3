#!/usr/bin/env python3
"""False alarms of `gradscope check` (docs/tuner.md "CI gate"): a run checked against repeats of itself.

Runs the same MPI benchmark (2 ranks, 8 B to 1 MiB by 4, 20 iterations, 5 warm-up) once as the baseline and
PAIRS more times (repeats: no change at all), and checks each repeat against the baseline with
`<build>/cli/gradscope check` (exit 1 = a regression reported: here, a false alarm). Then, to show the gate
still sees a real change on the same noisy data, it checks a copy of each repeat with every time multiplied
by each FACTOR (1.2: a 20% slowdown everywhere) and counts how many of those are caught.

With --explore the traces are explore runs of a job instead: the MPI sample (2 ranks, an MLP, 1500 steps,
2 ms of compute per step) under `gradscope run --mode explore`, as scripts/demo.sh runs it; each key then
has three explorations a side, at the job's six gradient sizes.

With --observe they are observe runs of the same sample (400 steps): no measurements, so check compares
the runs step by step (the step's time and breakdown, time per step in each API and size); the slowed
copies have every time of their calls and steps multiplied.

  bench/check_false_alarms.py BUILD_DIR [--pairs 20] [--explore | --observe] [--factors 1.2] [--keep DIR]
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


def explore(build, path, mode="explore", steps=1500):
    gradscope = os.path.join(build, "cli", "gradscope")
    sample = os.path.join(build, "samples", "mpi_train", "gradscope-sample-mpi-train")
    out = path + ".d"
    command = [gradscope, "run", "-o", out, "--mode", mode, "--", "mpirun", "--oversubscribe", "--mca",
               "mpi_yield_when_idle", "1", "-np", "2", sample, "--steps", str(steps), "--sleep-ms", "2",
               "--print-every", "500"]
    result = subprocess.run(command, env={**os.environ, **MPI_ENV}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"check_false_alarms: {' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    shutil.move(os.path.join(out, "trace.db"), path)
    shutil.rmtree(out)


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
        db.execute("UPDATE calls SET enqueue_ns = CAST(enqueue_ns * ? AS INTEGER), start_ns = CAST(start_ns * ? AS "
                   "INTEGER), end_ns = CAST(end_ns * ? AS INTEGER)", (factor,) * 3)
        db.execute("UPDATE steps SET " + ", ".join(f"{column} = CAST({column} * ? AS INTEGER)" for column in STEP_TIMES),
                   (factor,) * len(STEP_TIMES))
    return out


STEP_TIMES = ("start_ns", "end_ns", "compute_ns", "exposed_ns", "waiting_ns", "hidden_ns", "caused_ns")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--explore", action="store_true", help="explore runs of the MPI sample, not bench runs")
    parser.add_argument("--observe", action="store_true", help="observe runs of the MPI sample, compared by step")
    parser.add_argument("--factors", default="1.2", help="slowdowns to check, comma-separated (default 1.2)")
    parser.add_argument("--keep", help="directory to keep the traces in (default: a temporary one)")
    args = parser.parse_args()
    gradscope = os.path.join(args.build, "cli", "gradscope")
    probe = subprocess.run([gradscope, "check", "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        sys.exit(f"check_false_alarms: {gradscope} has no check command yet (build the gradscope target)")

    work = args.keep or tempfile.mkdtemp(prefix="gradscope-check-")
    os.makedirs(work, exist_ok=True)
    if args.observe:
        record = lambda path: explore(args.build, path, mode="observe", steps=400)  # noqa: E731
    elif args.explore:
        record = lambda path: explore(args.build, path)  # noqa: E731
    else:
        record = lambda path: bench(gradscope, path)  # noqa: E731
    factors = [float(f) for f in args.factors.split(",")]
    baseline = os.path.join(work, "baseline.db")
    record(baseline)
    false_alarms = 0
    caught = {factor: 0 for factor in factors}
    for i in range(args.pairs):
        repeat = os.path.join(work, f"repeat-{i:02d}.db")
        record(repeat)
        code, regressed = check(gradscope, baseline, repeat)
        false_alarms += code == 1
        line = f"pair {i + 1:2d}: repeat {'REGRESSION' if code else 'ok':10s} ({len(regressed)} keys)"
        for factor in factors:
            slow_code, slow_regressed = check(gradscope, baseline, slowed(repeat, factor, repeat + ".slow.db"))
            caught[factor] += slow_code == 1
            line += f"   repeat x{factor} {'caught' if slow_code else 'missed':6s} ({len(slow_regressed)} keys)"
        print(line, flush=True)
    print(f"false alarms: {false_alarms} of {args.pairs} repeats reported a regression")
    for factor in factors:
        print(f"x{factor} slowdown: caught in {caught[factor]} of {args.pairs}")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
