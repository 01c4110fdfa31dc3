#!/usr/bin/env python3
"""The agent's hot path and the CPU kernels of two builds, measured in alternation (docs/benchmarks.md).

For a change that must not move them (a refactor): each round runs the same programs of the OLD build
and of the NEW one, the order swapped from round to round, so both see the machine's slow and fast
spells alike. Per round and build:
  - gradscope_agent_hot_path, 1 rank, 21 blocks of 10^6 one-float MPI_Allreduce through the agent against
    PMPI_Allreduce: the cost per recorded call (GRADSCOPE_MAX_CALL_RATE=0, a ring of 256 Ki records) and
    per call over the rate limit (the defaults);
  - gradscope_agent_hot_path 100 on 2 ranks: the 8-byte OSU loop through the agent / around it, one job;
  - gradscope_methods_bench on a few local sums and wire conversions.
Prints, per figure, the median over the rounds and the range for each build, and new / old.

  bench/compare_builds.py OLD_BUILD NEW_BUILD [--rounds 4]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
KERNELS = r"BM_LocalSum/(add_n|kahan)/fp32/K:4|BM_LocalSum/tree/fp16/K:4|BM_Wire(Encode|Decode)/(fp16|bf16|fp8e4m3)/"
UNITS_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def run(command, env=None):
    result = subprocess.run(command, env={**os.environ, **MPI_ENV, **(env or {})}, capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        sys.exit("failed: " + " ".join(command) + "\n" + result.stderr[-2000:])
    return result.stdout


def measure(build, out_dir):
    """{figure: value} for one build: ns per call for the hot path, the in-job ratio, µs per kernel run."""
    agent = ["-x", "LD_PRELOAD=" + os.path.join(build, "agent", "libgradscope-agent.so"),
             "-x", "GRADSCOPE_OUTPUT=" + os.path.join(out_dir, "rank%r-%p.db")]
    hot_path = os.path.join(build, "bench", "gradscope_agent_hot_path")
    figures = {}
    for label, variables in (("cost per recorded call, ns", ["-x", "GRADSCOPE_MAX_CALL_RATE=0",
                                                              "-x", "GRADSCOPE_BUFFER_CALLS=262144"]),
                             ("cost per call over the rate limit, ns", [])):
        text = run(["mpiexec", "-np", "1"] + agent + variables + [hot_path, "21"])
        figures[label] = float(re.search(r"difference (-?[\d.]+) ns/call", text).group(1))
    text = run(["mpiexec", "-np", "2", "--oversubscribe"] + agent + [hot_path, "100"])
    figures["8 B in one job, through / around the agent"] = float(re.search(r"median ratio ([\d.]+)", text).group(1))
    text = run([os.path.join(build, "bench", "gradscope_methods_bench"), f"--benchmark_filter={KERNELS}",
                "--benchmark_min_time=0.3"])
    for line in text.splitlines():
        match = re.match(r"(BM_\S+)/manual_time\s+([\d.]+) (ns|us|ms|s)\b", line)
        if match:
            figures[match.group(1) + ", us"] = float(match.group(2)) * UNITS_US[match.group(3)]
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    results = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as out_dir:
        for round_number in range(options.rounds):
            order = ("old", "new") if round_number % 2 == 0 else ("new", "old")
            for side in order:
                figures = measure(getattr(options, side), out_dir)
                results[side].append(figures)
                print(f"round {round_number + 1} {side}: " +
                      ", ".join(f"{name} {value:.4g}" for name, value in figures.items()), flush=True)
    print(f"\n| figure | old: median (range) | new: median (range) | new / old |\n|---|---|---|---|")
    for name in results["old"][0]:
        old = [figures[name] for figures in results["old"]]
        new = [figures[name] for figures in results["new"]]
        print(f"| {name} | {statistics.median(old):.4g} ({min(old):.4g}–{max(old):.4g}) | "
              f"{statistics.median(new):.4g} ({min(new):.4g}–{max(new):.4g}) | "
              f"{statistics.median(new) / statistics.median(old):.3f} |")


if __name__ == "__main__":
    main()
