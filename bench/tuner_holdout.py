#!/usr/bin/env python3
"""How good is `gradscope recommend`'s choice on data it has not seen (docs/benchmarks.md, "The tuner").

Runs the MPI benchmark (2 ranks, 8 B to 1 MiB by 2, 20 iterations, 5 warm-up) RUNS times, then two held-back
tests, lossless strategies only (the recommender's default budget):

- held-out sizes: for each run, every other size is removed from a copy of the trace and the job's
  workload is set to the removed sizes (one call each); `recommend` predicts them from the remaining sizes;
- held-out runs: `recommend` sees one run (all sizes, workload = every size) and is judged on the others.

The truth at a size is each strategy's median time over the runs not given to `recommend`, at that size.
Two choices are judged at every size: the strategy the models predict fastest (`--format predictions`),
and the recommendation's (`--format json`; a strategy replaces sum/native only when its interval beats
the baseline's, so it is conservative; a size no rule covers keeps sum/native). For each: ratio =
truth(choice) / truth(fastest strategy), 1.0 when the choice is the fastest. Prints one table row per test.

  bench/tuner_holdout.py BUILD_DIR [--runs 4] [--keep DIR] [--traces A.db B.db ...]
"""
import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
BENCH_ARGS = ["bench", "--backend", "mpi", "-b", "8", "-e", "1M", "-f", "2", "-n", "20", "-w", "5", "--no-progress"]
MPI_ALLREDUCE = "MPI_Allreduce"


def run(command, **kwargs):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"tuner_holdout: {' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def bench(gradscope, path):
    run(["mpirun", "--oversubscribe", "-np", "2", gradscope] + BENCH_ARGS + ["-o", path],
        env={**os.environ, **MPI_ENV})


def lossless(strategy):
    return strategy.startswith("sum/") and strategy.count("/") == 1


def medians(path):
    """{(strategy, bytes): median_ns} of the lossless all-reduce strategies of a trace."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT strategy, bytes, median_ns FROM measurements").fetchall()
    return {(s, b): t for s, b, t in rows if lossless(s)}


def with_workload(source, out, sizes, drop_sizes):
    """A copy of `source` without the measurements at `drop_sizes`, whose calls are one of each of `sizes`."""
    shutil.copyfile(source, out)
    with sqlite3.connect(out) as db:
        db.executemany("DELETE FROM measurements WHERE bytes = ?", [(b,) for b in drop_sizes])
        db.execute("DELETE FROM recommendations")
        rank_id = db.execute("SELECT min(id) FROM ranks").fetchone()[0]
        api = db.execute("SELECT code FROM names WHERE domain = 'api' AND name = ?", (MPI_ALLREDUCE,)).fetchone()[0]
        fp32 = db.execute("SELECT code FROM names WHERE domain = 'dtype' AND name = 'fp32'").fetchone()[0]
        total = db.execute("SELECT code FROM names WHERE domain = 'op' AND name = 'sum'").fetchone()[0]
        db.executemany(
            "INSERT INTO calls (rank_id, seq, step, api, dtype, op, count, bytes, enqueue_ns, start_ns, end_ns) "
            "VALUES (?, ?, 0, ?, ?, ?, ?, ?, 0, 0, 1)",
            [(rank_id, i, api, fp32, total, b // 4, b) for i, b in enumerate(sizes)])
    return out


def chosen(gradscope, trace, sizes):
    """({bytes: strategy the models predict fastest}, {bytes: strategy the recommendation applies})."""
    predicted = {}
    rows = run([gradscope, "recommend", "--format", "predictions", "--no-store", trace]).splitlines()[1:]
    for line in rows:
        api, dtype, size, strategy, allowed, median = line.split(",")[:6]
        size, median = int(size), float(median)
        if api == MPI_ALLREDUCE and dtype == "fp32" and allowed == "1" and lossless(strategy):
            if size not in predicted or median < predicted[size][1]:
                predicted[size] = (strategy, median)
    rules = json.loads(run([gradscope, "recommend", "--format", "json", "--no-store", trace]))["rules"]
    applied = {}
    for size in sizes:
        applied[size] = "sum/native"
        for rule in rules:
            if rule["api"] == MPI_ALLREDUCE and rule["dtype"] == "fp32" and rule["min_bytes"] <= size <= rule["max_bytes"]:
                applied[size] = rule["strategy"]
                break
    return {size: predicted[size][0] for size in sizes if size in predicted}, applied


def judge(pick, truth_runs):
    """Ratios truth(chosen) / truth(best) per size, the truth being medians over `truth_runs`."""
    ratios = []
    for size, strategy in pick.items():
        truth = {}
        for s in {s for m in truth_runs for (s, b) in m if b == size}:
            times = [m[(s, size)] for m in truth_runs if (s, size) in m]
            truth[s] = statistics.median(times)
        if strategy not in truth or not truth:
            continue
        best = min(truth, key=truth.get)
        ratios.append((size, strategy, best, truth[strategy] / truth[best]))
    return ratios


def summary(ratios):
    values = [r for *_, r in ratios]
    within = sum(r <= 1.03 for r in values)
    return f"{statistics.mean(values):.3f} | {max(values):.3f} | {within} of {len(values)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--keep", help="directory to keep the traces in (default: a temporary one)")
    parser.add_argument("--traces", nargs="+", help="use these bench traces instead of running the benchmark")
    parser.add_argument("--verbose", action="store_true", help="print every prediction")
    args = parser.parse_args()
    gradscope = os.path.join(args.build, "cli", "gradscope")
    work = args.keep or tempfile.mkdtemp(prefix="gradscope-holdout-")
    os.makedirs(work, exist_ok=True)
    traces = args.traces or []
    if not traces:
        for i in range(args.runs):
            traces.append(os.path.join(work, f"run-{i}.db"))
            bench(gradscope, traces[-1])
    if len(traces) < 2:
        sys.exit("tuner_holdout: needs at least two runs (the truth comes from the runs recommend did not see)")
    runs = [medians(t) for t in traces]

    tests = []  # (name, {kind: ratios})
    for i, trace in enumerate(traces):
        sizes = sorted({b for (_, b) in runs[i]})
        test_sizes = sizes[1::2]
        others = runs[:i] + runs[i + 1:]
        # Held-out sizes: trained on this run's other sizes, judged on the sizes it never saw, in all runs.
        copy = with_workload(trace, os.path.join(work, f"sizes-{i}.db"), test_sizes, test_sizes)
        picks = chosen(gradscope, copy, test_sizes)
        tests.append((f"run {i}, held-out sizes", [judge(p, runs) for p in picks]))
        # Held-out runs: trained on this run, judged on the others.
        copy = with_workload(trace, os.path.join(work, f"runs-{i}.db"), sizes, [])
        picks = chosen(gradscope, copy, sizes)
        tests.append((f"run {i}, held-out runs", [judge(p, others) for p in picks]))
        if args.verbose:
            for name, (predicted, applied) in tests[-2:]:
                for p, a in zip(predicted, applied):
                    print(f"  {name}: {p[0]:>8} B predicted {p[1]:<27} {p[3]:.3f}  applied {a[1]:<27} {a[3]:.3f}"
                          f"  best {p[2]}")

    print("| test | sizes | predicted best: mean ratio | worst | within 3% | recommendation: mean ratio | worst |"
          " within 3% |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in ("held-out sizes", "held-out runs"):
        for name, (predicted, applied) in tests:
            if name.endswith(kind):
                print(f"| {name} | {len(predicted)} | {summary(predicted)} | {summary(applied)} |")
        predicted = [r for name, (p, _) in tests if name.endswith(kind) for r in p]
        applied = [r for name, (_, a) in tests if name.endswith(kind) for r in a]
        print(f"| **all, {kind}** | {len(predicted)} | {summary(predicted)} | {summary(applied)} |")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
