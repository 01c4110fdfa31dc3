#!/usr/bin/python3
"""The synchronous-or-asynchronous experiment of docs/async.md.

  bench/async_experiment.py --build build/ci --out /tmp/async [--reps 3] [--ranks 4]

For samples/linreg and samples/mpi_train with 4 ranks, with no straggler, a persistent one (the last rank
slowed by half its compute) and a drifting one (a rank drawn per step, slowed the same), it runs
  1. the job under explore mode (budget 1): the async strategies' measured errors on its gradients;
  2. the job under observe mode: the synchronous baseline, whose steps `gradscope report` replays with each
     async strategy (the prediction of the step time);
  3. the job under apply mode with async/stale1, async/stale2 and async/dga1 for every fp32 reduction (the
     gradients; mpi_train's logged loss is an fp64 sum and stays synchronous);
observe and apply runs interleaved `--reps` times (this VM's timings move by 2x between runs: paired runs,
medians, spreads). It measures the mean step (the training loop's time on rank 0 over the steps, from the
sample's --loss-csv), the final held-out loss and the replicas' spread (--check-replicas), and writes
  results.json       every run's figures
  results.md         the tables docs/async.md shows (medians, [min, max] over the repetitions)
  loss-<sample>-<straggler>.png   loss curves of the first repetition (scripts/plot_loss.py)
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

STRATEGIES = ["async/stale1", "async/stale2", "async/dga1"]
SAMPLES = {
    "linreg": ("samples/linreg/gradscope-sample-linreg", ["--steps", "1000", "--batch", "128", "--print-every", "20"]),
    "mpi_train": ("samples/mpi_train/gradscope-sample-mpi-train",
                  ["--steps", "300", "--width", "4", "--print-every", "10"]),
}
STRAGGLERS = {"none": [], "persistent": ["--straggler", "LAST:0.5"], "drifting": ["--straggler", "any:0.5"]}
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run(command, cwd):
    done = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"async_experiment: {' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout, done.stderr


def plan(path, strategy, ranks):
    rules = [{"api": api, "dtype": dtype, "min_bytes": 0, "max_bytes": 1 << 40, "strategy": strategy,
              "error_class": "semantic"}
             for api in ("MPI_Allreduce", "MPI_Iallreduce") for dtype in ("fp32",)]
    with open(path, "w") as handle:
        json.dump({"format": "gradscope-recommendation", "version": 1, "created": "2026-12-02T00:00:00Z",
                   "tool_version": "experiment", "source_runs": [], "backend": "mpi", "world_size": ranks,
                   "max_rel_error": 0, "allow_semantic_change": True, "rules": rules}, handle)


def curve(path):
    with open(path) as handle:
        rows = [line.strip().split(",") for line in handle.readlines()[1:] if line.strip()]
    return [(int(step), float(loss), float(seconds)) for step, loss, seconds in rows]


def replicas(text):
    match = re.search(r"replicas: max \|w_r - w_0\| = (\S+), relative (\S+)", text)
    return (float(match.group(1).rstrip(",")), float(match.group(2))) if match else (None, None)


def async_section(report):
    """The report's replayed steps and measured errors: strategy -> (step ns, error or None)."""
    units = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
    rows, inside, sync = {}, False, None
    for line in report.splitlines():
        if line.startswith("Synchronous or asynchronous"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            break
        if not inside:
            continue
        match = re.match(r"\s+replayed synchronous step: ([\d.]+) (\w+)", line)
        if match:
            sync = float(match.group(1)) * units[match.group(2)]
        match = re.match(r"\s+(async/\w+)\s+([\d.]+) (\w+)\s+\S+ \[[^]]*\]\s+(\S+)", line)
        if match:
            error = None if match.group(4) == "-" else float(match.group(4))
            rows[match.group(1)] = (float(match.group(2)) * units[match.group(3)], error)
    return sync, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--samples", default="linreg,mpi_train")
    parser.add_argument("--stragglers", default=",".join(STRAGGLERS))
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    gradscope = os.path.join(build, "cli", "gradscope")
    mpiexec = ["mpiexec", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", str(args.ranks)]
    for strategy in STRATEGIES:
        plan(os.path.join(out, strategy.replace("/", "_") + ".json"), strategy, args.ranks)
    results = []
    for sample in args.samples.split(","):
        binary, base = SAMPLES[sample]
        for straggler in args.stragglers.split(","):
            extra = [value.replace("LAST", str(args.ranks - 1)) for value in STRAGGLERS[straggler]]
            job = mpiexec + [os.path.join(build, binary)] + base + extra + ["--check-replicas"]
            key = f"{sample}-{straggler}"
            # 1. explore: the errors (and its own replay, slowed by the explorations).
            trace = os.path.join(out, key, "explore")
            run([gradscope, "run", "-f", "-o", trace, "--mode", "explore", "--explore-budget", "1", "--"] + job, out)
            report, _ = run([gradscope, "report", os.path.join(trace, "trace.db")], out)
            _, explored = async_section(report)
            for rep in range(args.reps):
                for mode in ["sync"] + STRATEGIES:
                    tag = mode.replace("/", "_")
                    trace = os.path.join(out, key, f"{tag}.{rep}")
                    csv = os.path.join(out, key, f"{tag}.{rep}.csv")
                    command = [gradscope, "run", "-f", "-o", trace]
                    if mode != "sync":
                        command += ["--mode", "apply", "--allow-semantic-change", "--recommendation",
                                    os.path.join(out, tag + ".json")]
                    stdout, _ = run(command + ["--"] + job + ["--loss-csv", csv], out)
                    points = curve(csv)
                    steps = points[-1][0]
                    row = {"sample": sample, "straggler": straggler, "mode": mode, "rep": rep,
                           "step_ms": 1e3 * points[-1][2] / max(steps, 1), "final_loss": points[-1][1],
                           "replicas_abs": replicas(stdout)[0], "replicas_rel": replicas(stdout)[1], "csv": csv}
                    if mode == "sync":
                        report, _ = run([gradscope, "report", os.path.join(trace, "trace.db")], out)
                        sync_replay, replayed = async_section(report)
                        row["replay_sync_ms"] = sync_replay / 1e6 if sync_replay else None
                        row["predicted_ms"] = {name: step / 1e6 for name, (step, _) in replayed.items()}
                    else:
                        row["explored_error"] = explored.get(mode, (None, None))[1]
                    results.append(row)
                    print(f"{key} {mode} rep {rep}: step {row['step_ms']:.3f} ms, loss {row['final_loss']:.6g}, "
                          f"replicas {row['replicas_abs']}", flush=True)
            curves = [f"{mode}={os.path.join(out, key, mode.replace('/', '_') + '.0.csv')}"
                      for mode in ["sync"] + STRATEGIES]
            run(["/usr/bin/python3", os.path.join(os.path.dirname(__file__), "..", "scripts", "plot_loss.py"),
                 "--out", os.path.join(out, f"loss-{key}.png"), "--title",
                 f"{sample}, {args.ranks} ranks, straggler: {straggler}"] + curves, out)
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)

    # The tables: medians and [min, max] over the repetitions.
    def spread(values):
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        return f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"

    lines = ["| sample | straggler | mode | step (ms) | measured vs sync | predicted vs sync | final loss | "
             "replicas max abs | explored error |", "|---|---|---|---|---|---|---|---|---|"]
    for sample in args.samples.split(","):
        for straggler in args.stragglers.split(","):
            rows = [r for r in results if r["sample"] == sample and r["straggler"] == straggler]
            sync = [r for r in rows if r["mode"] == "sync"]
            for mode in ["sync"] + STRATEGIES:
                mine = [r for r in rows if r["mode"] == mode]
                ratios = [m["step_ms"] / s["step_ms"] - 1 for m, s in zip(mine, sync)]  # paired by repetition
                predicted = [] if mode == "sync" else [
                    100 * (s["predicted_ms"][mode] / s["replay_sync_ms"] - 1) for s in sync
                    if s.get("replay_sync_ms") and mode in s["predicted_ms"]]
                lines.append(
                    f"| {sample} | {straggler} | {mode} | {spread([r['step_ms'] for r in mine])} | "
                    f"{'-' if mode == 'sync' else spread([100 * x for x in ratios]) + ' %'} | "
                    f"{'-' if mode == 'sync' else spread(predicted) + ' %'} | "
                    f"{spread([r['final_loss'] for r in mine])} | {spread([r['replicas_abs'] for r in mine])} | "
                    f"{spread([r.get('explored_error') for r in mine])} |")
    with open(os.path.join(out, "results.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
