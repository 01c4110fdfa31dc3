#!/usr/bin/python3
"""Multi-host figures (docs/benchmarks.md, "Across hosts"): jobs on hosts made on this machine by
scripts/cluster.sh (network namespaces, every link shaped with tc htb), so that bytes cost what a network
makes them cost rather than what shared memory does.

  wire   2 hosts x 2 ranks. `gradscope bench` of 64 MiB fp32 (-n 5 -w 1) with sum/native, its bf16 and
         fp16 wires, sum/rs_ag, sum/hier and their bf16 wires, on links shaped to RATE (1 Gbit/s) and on
         links left unshaped (the CPUs' speed), the two alternating REPEATS times. Per strategy: the median
         over repeats of the bench's median time over ranks, the spread (min-max over repeats), the speed-up
         over sum/native. The unshaped times say what the CPUs alone cost: where they are a small part of
         the shaped times, the link is the limit.
  loop   2 hosts x 2 ranks at RATE: samples/mpi_train --blocking --width 16 under `gradscope run --mode
         explore` (budget 0.5, the strategies above), `gradscope recommend --max-rel-error 1e-2 --format
         json`, then `gradscope run --mode apply --validate 10` with the plan: the plan's rules, the
         prediction and what validation measured on the step.
  slow   3 hosts x 1 rank, one host's link at SLOW_RATE (100 Mbit/s) and the others at RATE, each host
         slowed in turn: samples/mpi_train --blocking under `gradscope run --mode explore`; which rank (and
         host) the step analysis names as the straggler, and which host's link the link probe names.

  /usr/bin/python3 bench/cluster_figures.py BUILD_DIR [--parts wire,loop,slow] [--repeats 3]
                   [--rate 1gbit] [--slow-rate 100mbit] [--scratch /tmp/cluster-figures] [--markdown]

Needs root (scripts/cluster.sh check). The cluster it makes is named gsbench and is removed at the end.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "scripts", "cluster.sh")
NAME = "gsbench"
SUBNET = "10.213.40"
STRATEGIES = ["sum/native", "sum/native/bf16", "sum/native/fp16", "sum/rs_ag", "sum/rs_ag/bf16", "sum/hier",
              "sum/hier/bf16"]


def run(command, check=True, **kwargs):
    result = subprocess.run(command, text=True, capture_output=True, **kwargs)
    if check and result.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def cluster(*args, env=None):
    return run([CLUSTER, *args], env=env)


def up(hosts, slots, rate):
    run([CLUSTER, "down", "--name", NAME], check=False)
    cluster("up", str(hosts), "--name", NAME, "--subnet", SUBNET, "--rate", rate,
            env=dict(os.environ, GRADSCOPE_CLUSTER_SLOTS=str(slots)))


def shape(host, rate):
    cluster("shape", str(host), "--name", NAME, "--rate", rate)


def on_host0(command, check=True):
    return run([CLUSTER, "exec", "0", "--name", NAME, "--", *command], check=check)


def load():
    return open("/proc/loadavg").read().split()[0]


def part_wire(args, build, out):
    up(2, 2, args.rate)
    times = {rate: {s: [] for s in STRATEGIES} for rate in (args.rate, "unlimited")}
    for repeat in range(args.repeats):
        for rate in (args.rate, "unlimited"):
            for host in (0, 1):
                shape(host, rate)
            result = on_host0(["mpirun", "-np", "4", f"{build}/cli/gradscope-bench", "--backend", "mpi", "-b", "64M",
                               "-e", "64M", "-n", "5", "-w", "1", "--no-progress", "--json", "--strategies",
                               ",".join(STRATEGIES)])
            for point in json.loads(result.stdout)["points"]:
                times[rate][point["strategy"]].append(point["time_us"]["median"] / 1e3)
            print(f"  repeat {repeat + 1}, links {rate}: done (load {load()})", file=sys.stderr)
    base = {rate: statistics.median(times[rate]["sum/native"]) for rate in times}
    rows = []
    for strategy in STRATEGIES:
        row = [strategy]
        for rate in (args.rate, "unlimited"):
            values = times[rate][strategy]
            median = statistics.median(values)
            row += [f"{median:.0f} ms ({min(values):.0f}-{max(values):.0f})", f"{base[rate] / median:.2f}x"]
        rows.append(row)
    header = ["strategy", f"{args.rate} links", "speed-up", "unshaped links", "speed-up"]
    out.append(table(f"64 MiB fp32 all-reduce, 2 hosts x 2 ranks, {args.repeats} repeats (median, min-max)",
                     header, rows, args.markdown))


def part_loop(args, build, out):
    up(2, 2, args.rate)
    work = os.path.join(args.scratch, "loop")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    job = ["mpirun", "-np", "4", f"{build}/samples/mpi_train/gradscope-sample-mpi-train", "--blocking", "--width",
           "16", "--print-every", "0"]
    gradscope = f"{build}/cli/gradscope"
    on_host0(["env", "GRADSCOPE_EXPLORE_STRATEGIES=" + ",".join(STRATEGIES), gradscope, "run", "-o",
              f"{work}/explore", "--mode", "explore", "--explore-budget", "0.5", "--", *job, "--steps", "150"])
    plan = f"{work}/plan.json"
    recommendation = run([gradscope, "recommend", f"{work}/explore/trace.db", "--max-rel-error", "1e-2",
                          "--no-store"]).stdout
    run([gradscope, "recommend", f"{work}/explore/trace.db", "--max-rel-error", "1e-2", "--format", "json",
         "-o", plan, "--no-store"])
    on_host0([gradscope, "run", "-o", f"{work}/apply", "--mode", "apply", "--recommendation", plan, "--validate",
              "10", "--", *job, "--steps", "300"])
    applied = run([gradscope, "report", f"{work}/apply/trace.db"]).stdout
    rules = [line.strip() for line in recommendation.splitlines() if "->" in line]
    predicted = [" ".join(line.split()) for line in recommendation.splitlines()
                 if line.strip().startswith(("recommended:", "on the step:"))]
    validation = applied.split("Validation (apply mode, the plan in alternate windows)\n", 1)
    measured = validation[1].splitlines()[0].strip() if len(validation) == 2 else "no validation line"
    out.append("explore -> recommend -> apply on samples/mpi_train --blocking --width 16, 2 hosts x 2 ranks, "
               f"{args.rate} links\n  rules:\n    " + "\n    ".join(rules) + "\n  predicted: " +
               "; ".join(predicted) + "\n  validated in the job: " + measured)


def part_slow(args, build, out):
    up(3, 1, args.rate)
    rows = []
    for slow in range(3):
        for host in range(3):
            shape(host, args.slow_rate if host == slow else args.rate)
        work = os.path.join(args.scratch, f"slow{slow}")
        shutil.rmtree(work, ignore_errors=True)
        on_host0([f"{build}/cli/gradscope", "run", "-o", work, "--mode", "explore", "--", "mpirun", "-np", "3",
                  f"{build}/samples/mpi_train/gradscope-sample-mpi-train", "--blocking", "--width", "4", "--sleep-ms",
                  "10", "--steps", "60", "--print-every", "0"])
        report = run([f"{build}/cli/gradscope", "report", f"{work}/trace.db"]).stdout
        match = re.search(r"rank (\d+) \(host (\S+)\) was last in (\d+) of (\d+) steps", report)
        noise = re.search(r"the last rank changes from step to step[^:]*:(.*)", report)
        named = (f"rank {match[1]} on {match[2]}, last in {match[3]} of {match[4]} steps" if match else
                 f"none persistent:{noise[1]}" if noise else "no straggler")
        verdict = re.search(r"host (\S+)'s link is slow: its exchanges ran at (.*) at best, the others' at (.*) "
                            r"\(median\)", report)
        links = (f"{verdict[1]} ({verdict[2]} at best, the others {verdict[3]})" if verdict else "no host named")
        rows.append([f"{NAME}-h{slow}", named, links])
    out.append(table(f"3 hosts x 1 rank, one host's link at {args.slow_rate}, the others at {args.rate}, explore "
                     "mode: the straggler the step analysis names, and the slow link explore's probe names",
                     ["slowed host", "straggler named", "slow link named"], rows, args.markdown))


def table(title, header, rows, markdown):
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [title] + ["  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths))
                       for row in [header, *rows]]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", help="build directory (cli/gradscope, cli/gradscope-bench, samples/)")
    parser.add_argument("--parts", default="wire,loop,slow")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--slow-rate", default="100mbit")
    parser.add_argument("--scratch", default="/tmp/cluster-figures")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    check = run([CLUSTER, "check"], check=False)
    if check.returncode != 0:
        sys.exit(f"cannot make hosts here: {check.stderr.strip()}")
    os.makedirs(args.scratch, exist_ok=True)
    parts = {"wire": part_wire, "loop": part_loop, "slow": part_slow}
    out = [f"load average at start: {load()}"]
    try:
        for part in args.parts.split(","):
            if part not in parts:
                sys.exit(f"--parts: {part} is not one of {', '.join(parts)}")
            print(f"== {part}", file=sys.stderr)
            parts[part](args, build, out)
    finally:
        run([CLUSTER, "down", "--name", NAME], check=False)
    out.append(f"load average at end: {load()}")
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
