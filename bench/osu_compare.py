#!/usr/bin/env python3
"""`gradscope bench` against an independent OSU loop, the same session (docs/benchmarks.md).

Runs gradscope_osu_allreduce (plain C + MPI, osu_allreduce's method: MPI_Wtime around each call, a
barrier after it, the average per rank) and `gradscope bench --backend mpi --strategies sum/native -c 0`
with the same ranks, sizes, iterations and MPI thread level, alternately, `--runs` times, and prints per
size the median latency of each over the runs and the median of the per-run ratios bench / OSU.
Interleaving is what makes the comparison fair on a noisy machine: single runs of either vary by tens of
percent at small sizes, in step with whatever else the machine is doing.

With --per-size, each run is a pair per size instead of a pair of sweeps: the OSU loop and bench are
started for one size at a time, back to back, so the two sides of each ratio are a second apart rather
than a whole sweep (tens of seconds at 20,000 calls), and a VM that switches latency modes every few
seconds (docs/benchmarks.md) puts the switch inside one pair less often.

  bench/osu_compare.py BUILD_DIR [--runs 9] [--ranks 2] [--iterations 2000] [--threads single] [--per-size]
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


def osu(build, options, sizes=(SIZES[0], SIZES[-1])):
    args = ["-n", str(sizes[0]), "-m", str(sizes[1]), "-i", str(options.iterations), "-x", str(options.warmup),
            "-p", "4"]
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


def bench(build, options, sizes=(SIZES[0], SIZES[-1])):
    out = run(launcher(options.ranks) + [
        os.path.join(build, "cli", "gradscope"), "bench", "--backend", "mpi", "--strategies", "sum/native",
        "-b", str(sizes[0]), "-e", str(sizes[1]), "-n", str(options.iterations), "-w", str(options.warmup),
        "-c", "0",
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
    parser.add_argument("--per-size", action="store_true", help="one pair of runs per size (see above)")
    parser.add_argument("--sizes", help="with --per-size: only these sizes in bytes, comma-separated (e.g. 8,16)")
    options = parser.parse_args()
    sizes = SIZES
    if options.sizes:
        if not options.per_size:
            parser.error("--sizes needs --per-size")
        sizes = [int(size) for size in options.sizes.split(",")]
        if any(size not in SIZES for size in sizes):
            parser.error(f"--sizes: each size must be a power of two from {SIZES[0]} to {SIZES[-1]}")
    if options.ranks != 2:
        print("note: with more than 2 ranks bench's median over ranks and OSU's average over ranks can differ")

    osu_runs, bench_runs = [], []
    for i in range(options.runs):
        osu_run, bench_run = {}, {}
        # One sweep each, or one pair per size; alternate which goes first, so that a drift in the
        # machine's load favours neither.
        for k, pair_sizes in enumerate([(s, s) for s in sizes] if options.per_size else [(SIZES[0], SIZES[-1])]):
            pair = [(osu, osu_run), (bench, bench_run)]
            if (i + k) % 2:
                pair.reverse()
            for measure, into in pair:
                into.update(measure(options.build, options, pair_sizes))
        osu_runs.append(osu_run)
        bench_runs.append(bench_run)
        print(f"run {i + 1}/{options.runs} done", file=sys.stderr)

    print(f"# {options.runs} interleaved runs{' (a pair per size)' if options.per_size else ''}, "
          f"{options.ranks} ranks, MPI_THREAD_{options.threads.upper()}, "
          f"{options.iterations} timed calls after {options.warmup}; medians over runs (us)")
    print(f"{'size':>10} {'OSU loop':>10} {'bench':>10} {'bench/OSU':>10} {'range':>14}")
    worst = 0.0
    for size in sizes:
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
