#!/usr/bin/python3
"""The figures of explore and apply modes (docs/benchmarks.md, "Explore and apply").

  bench/shadow_figures.py [--build build/default] [--pairs 3] [explore] [apply-bf16] [apply-adacons]

explore        the sample jobs (C++ mpi_train, the mpi4py job; 2 ranks; a 2 ms sleep per step stands for the
               compute of a real step) under `gradscope run --mode explore`
               with the default budget (10%): per rank, explorations made and refused, the time the agent
               counts as spent exploring against the run's length; and the job's wall time with and
               without explore mode (paired, interleaved runs; medians).
apply-bf16     mpi_train --width 16 --blocking (reductions up to 4 MiB) plain (observed) and under apply mode with a
               recommendation that sends fp32 all-reduces of 64 KiB and more through a bf16-wire strategy
               (--bf16-strategy, default sum/rs_ag/bf16): time in those reductions per step and the whole step,
               paired runs; final loss of each.
apply-adacons  samples/linreg, 8 workers, batch 16, 1000 steps: --aggregator mean plain, the same under
               apply mode with adacons/native replacing its all-reduce, and --aggregator adacons (the
               sample calling the strategy itself): final losses.

Runs as root in a container too (sets Open MPI's run-as-root variables). Prints markdown tables.
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPIRUN = ["mpirun", "--oversubscribe"]


def run(command, timeout=900):
    start = time.monotonic()
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"shadow_figures: {' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout, result.stderr, elapsed


def gradscope_run(build, output, mode_args, job):
    return run([f"{build}/cli/gradscope", "run", "-o", output, "-f"] + mode_args + ["--"] + job)


def final_line(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("final loss")]
    return lines[-1] if lines else "(no final line)"


def trace(output):
    return sqlite3.connect(f"file:{os.path.join(output, 'trace.db')}?mode=ro", uri=True)


def explore_figures(args, work):
    build = args.build
    jobs = {
        "mpi_train (C++), 2 ranks, 2000 steps of 2 ms compute": MPIRUN + [
            "-np", "2", f"{build}/samples/mpi_train/gradscope-sample-mpi-train", "--steps", "2000", "--sleep-ms", "2",
            "--print-every", "0"],
        "train.py (mpi4py), 2 ranks, 1000 steps of 2 ms compute": MPIRUN + [
            "-np", "2", "/usr/bin/python3", "samples/python_mpi4py/train.py", "--steps", "1000", "--sleep-ms", "2",
            "--print-every", "0"],
    }
    print("\n### Explore mode: time spent exploring, default budget (10%)\n")
    print("| job | rank | explored | refused (budget) | exploring | run | share |")
    print("|---|---|---|---|---|---|---|")
    walls = {}
    for name, job in jobs.items():
        observe, explore = [], []
        for pair in range(args.pairs):
            for mode, times in (("observe", observe), ("explore", explore)):
                output = os.path.join(work, f"explore-{len(walls)}-{mode}-{pair}")
                _, _, elapsed = gradscope_run(build, output, ["--mode", mode], job)
                db = trace(output)
                start, end = db.execute("SELECT start_ns, end_ns FROM runs").fetchone()
                times.append((end - start) / 1e9)
                if mode == "explore" and pair == args.pairs - 1:
                    config = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0])
                    for rank in config.get("agent_ranks", []):
                        shadow = rank["shadow"]
                        print(f"| {name} | {rank['rank']} | {shadow['explored']} | {shadow['skipped_budget']} | "
                              f"{shadow['explore_ns'] / 1e6:.0f} ms | {(end - start) / 1e6:.0f} ms | "
                              f"{100 * shadow['explore_ns'] / (end - start):.1f}% |")
                db.close()
        walls[name] = (statistics.median(observe), statistics.median(explore))
    print("\n| job | run, observe (median) | run, explore (median) | explore's cost |")
    print("|---|---|---|---|")
    for name, (observe, explore) in walls.items():
        print(f"| {name} | {observe:.2f} s | {explore:.2f} s | {100 * (explore - observe) / observe:+.1f}% |")


def bf16_plan(strategy):
    return {"format": "gradscope-recommendation", "version": 1, "backend": "mpi", "max_rel_error": 0.01,
            "rules": [{"api": api, "dtype": "fp32", "min_bytes": 65536, "max_bytes": 1 << 40,
                       "strategy": strategy, "error_class": "lossy"}
                      for api in ("MPI_Allreduce", "MPI_Iallreduce")]}


def reduction_time_per_step(db, steps, min_bytes):
    """Mean over ranks of the time per step in fp32 all-reduces of at least min_bytes (nonblocking ones
    from issue to completion)."""
    per_rank = db.execute("SELECT rank_id, sum(end_ns - start_ns) FROM calls WHERE dtype = 7 AND api IN (1, 2) "
                          "AND bytes >= ? GROUP BY rank_id", (min_bytes,)).fetchall()
    return statistics.mean(total for _, total in per_rank) / steps / 1e6


def apply_bf16_figures(args, work):
    build, steps = args.build, 60
    plan = os.path.join(work, "bf16.json")
    with open(plan, "w") as handle:
        json.dump(bf16_plan(args.bf16_strategy), handle)
    # --blocking: every reduction an MPI_Allreduce, so that its time is the reduction's alone (an
    # MPI_Iallreduce's span runs until MPI_Wait, over the computation it overlaps).
    job = MPIRUN + ["-np", "2", f"{build}/samples/mpi_train/gradscope-sample-mpi-train", "--width", "16", "--blocking",
                    "--steps", str(steps), "--print-every", "0"]
    rows = {"observe": [], "apply": []}
    finals = {}
    for pair in range(args.pairs):
        for mode in ("observe", "apply"):
            output = os.path.join(work, f"bf16-{mode}-{pair}")
            mode_args = ["--mode", "apply", "--recommendation", plan] if mode == "apply" else []
            stdout, _, _ = gradscope_run(build, output, mode_args, job)
            finals[mode] = final_line(stdout)
            db = trace(output)
            start, end = db.execute("SELECT start_ns, end_ns FROM runs").fetchone()
            rows[mode].append((reduction_time_per_step(db, steps, 65536), (end - start) / steps / 1e6))
            db.close()
    print(f"\n### Apply mode: {args.bf16_strategy} for fp32 all-reduces >= 64 KiB, mpi_train --width 16 --blocking, "
          "2 ranks\n")
    print("| run | reductions >= 64 KiB per step | whole step | final line |")
    print("|---|---|---|---|")
    medians = {}
    for mode, values in rows.items():
        reductions = statistics.median(v[0] for v in values)
        step = statistics.median(v[1] for v in values)
        medians[mode] = (reductions, step)
        print(f"| {mode} | {reductions:.2f} ms | {step:.2f} ms | `{finals[mode]}` |")
    (r0, s0), (r1, s1) = medians["observe"], medians["apply"]
    print(f"\nspeed-up: reductions {r0 / r1:.2f}x, whole step {s0 / s1:.2f}x ({args.pairs} paired runs, medians)")


def apply_adacons_figures(args, work):
    build = args.build
    sample = f"{build}/samples/linreg/gradscope-sample-linreg"
    common = ["--steps", "1000", "--batch", "16", "--print-every", "0"]
    mpirun8 = MPIRUN + ["--mca", "mpi_yield_when_idle", "1", "-np", "8"]
    plan = os.path.join(work, "adacons.json")
    with open(plan, "w") as handle:
        json.dump({"format": "gradscope-recommendation", "version": 1, "backend": "mpi", "world_size": 8,
                   "allow_semantic_change": True,
                   "rules": [{"api": "MPI_Allreduce", "dtype": "fp32", "min_bytes": 1, "max_bytes": 1 << 30,
                              "strategy": "adacons/native", "error_class": "semantic"}]}, handle)
    results = []
    stdout, _, _ = run(mpirun8 + [sample, "--aggregator", "mean"] + common)
    results.append(("mean (plain MPI_Allreduce)", final_line(stdout)))
    stdout, _, _ = gradscope_run(build, os.path.join(work, "adacons-apply"),
                                 ["--mode", "apply", "--recommendation", plan, "--allow-semantic-change"],
                                 mpirun8 + [sample, "--aggregator", "mean"] + common)
    results.append(("mean, all-reduce replaced by adacons/native (apply mode)", final_line(stdout)))
    stdout, _, _ = run(mpirun8 + [sample, "--aggregator", "adacons"] + common)
    results.append(("adacons (the sample calls the strategy)", final_line(stdout)))
    print("\n### Apply mode: AdaCons on samples/linreg, 8 workers, batch 16, 1000 steps\n")
    print("| run | final line |")
    print("|---|---|")
    for name, line in results:
        print(f"| {name} | `{line}` |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build/default")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--bf16-strategy", default="sum/rs_ag/bf16", help="the bf16-wire strategy apply-bf16 applies")
    parser.add_argument("figures", nargs="*", default=["explore", "apply-bf16", "apply-adacons"])
    args = parser.parse_args()
    functions = {"explore": explore_figures, "apply-bf16": apply_bf16_figures, "apply-adacons": apply_adacons_figures}
    with tempfile.TemporaryDirectory(prefix="gs-figures-") as work:
        for figure in args.figures:
            functions[figure](args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
