#!/usr/bin/env python3
"""`gradscope bench` against an independent OSU loop, the same session (docs/benchmarks.md).

Runs gradscope_osu_allreduce (plain C + MPI, osu_allreduce's method: MPI_Wtime around each call, a
barrier after it, the average per rank) and `gradscope bench --backend mpi --strategies sum/native -c 0`
with the same ranks, sizes, iterations and MPI thread level, alternately, `--runs` times, and prints per
size the median latency of each over the runs and the median of the per-run ratios bench / OSU.
Interleaving is what makes the comparison fair on a noisy machine: single runs of either vary by tens of
percent at small sizes, in step with whatever else the machine is doing.

  bench/osu_compare.py BUILD_DIR [--runs 9] [--ranks 2] [--iterations 2000] [--threads single]
"""
import argparse
import os
import statistics
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SIZES = [8 << i for i in range(18)]  # 8 B ... 1 MiB


def launcher(ranks):
    command = ["mpiexec", "-np", str(ranks), "--oversubscribe"]
    # Ranks yield while they wait only when they outnumber the cores; otherwise they spin, as MPI jobs do.
    if ranks > (os.cpu_count() or 1):
        command += ["--mca", "mpi_yield_when_idle", "1"]
    return command


def run(command):
    result = subprocess.run(command, env={**os.environ, **MPI_ENV}, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit("run failed: " + " ".join(command) + "\n" + result.stderr[-2000:])
    return result.stdout


def osu(build, options):
    args = ["-n", "8", "-m", str(SIZES[-1]), "-i", str(options.iterations), "-x", str(options.warmup), "-p", "4"]
    # The OSU loop starts MPI with MPI_Init (single) unless told to ask for funneled.
    if options.threads == "funneled":
        args += ["-t", "funneled"]
    out = run(launcher(options.ranks) + [os.path.join(build, "bench", "gradscope_osu_allreduce")] + args)
    latencies = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit():
            latencies[int(fields[0])] = float(fields[1])
    return latencies


def bench(build, options):
    out = run(launcher(options.ranks) + [
        os.path.join(build, "cli", "gradscope"), "bench", "--backend", "mpi", "--strategies", "sum/native",
        "-b", "8", "-e", str(SIZES[-1]), "-n", str(options.iterations), "-w", str(options.warmup), "-c", "0",
        "--mpi-threads", options.threads, "--csv", "--no-progress"])
    lines = out.splitlines()
    header = lines[0].split(",")
    size, mean = header.index("bytes"), header.index("time_median_us")
    # The OSU loop reports the average over ranks of each rank's average; with 2 ranks the median over ranks
    # that bench reports is the same number.
    return {int(fields[size]): float(fields[mean]) for fields in (line.split(",") for line in lines[1:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--threads", choices=["single", "funneled"], default="single")
    options = parser.parse_args()
    if options.ranks != 2:
        print("note: with more than 2 ranks bench's median over ranks and OSU's average over ranks can differ")

    osu_runs, bench_runs = [], []
    for i in range(options.runs):
        # Alternate which goes first, so that a drift in the machine's load favours neither.
        pair = [("osu", osu), ("bench", bench)]
        if i % 2:
            pair.reverse()
        for name, measure in pair:
            (osu_runs if name == "osu" else bench_runs).append(measure(options.build, options))
        print(f"run {i + 1}/{options.runs} done", file=sys.stderr)

    print(f"# {options.runs} interleaved runs, {options.ranks} ranks, MPI_THREAD_{options.threads.upper()}, "
          f"{options.iterations} timed calls after {options.warmup}; medians over runs (us)")
    print(f"{'size':>10} {'OSU loop':>10} {'bench':>10} {'bench/OSU':>10} {'range':>14}")
    worst = 0.0
    for size in SIZES:
        o = [r[size] for r in osu_runs]
        b = [r[size] for r in bench_runs]
        ratios = [y / x for x, y in zip(o, b)]
        ratio = statistics.median(ratios)
        worst = max(worst, abs(ratio - 1))
        print(f"{size:>10} {statistics.median(o):>10.3f} {statistics.median(b):>10.3f} {ratio:>10.3f} "
              f"{min(ratios):>6.2f}-{max(ratios):<6.2f}")
    print(f"# largest |median ratio - 1|: {worst:.3f}")


if __name__ == "__main__":
    main()
