#!/usr/bin/env python3
"""`gradscope bench --backend nccl` against an independent nccl-tests-style loop, the same session
(docs/benchmarks.md).

Runs gradscope_nccl_tests_allreduce (CUDA runtime + NCCL only, all_reduce_perf's method: n calls enqueued
back to back, one stream synchronisation, the average) and `gradscope bench --backend nccl --strategies
sum/native -c 0` over the same GPUs, sizes, iterations and warm-up, alternately, `--runs` times, and prints
per size the median time and bus bandwidth of each over the runs and the median of the per-run ratios
bench / loop. Both run out-of-place on float data.

With one GPU NCCL's all-reduce is a device-to-device copy of the buffer and busbw is 0 (2(n-1)/n = 0):
the comparison is then of times and algbw.

  bench/nccl_compare.py --gradscope GRADSCOPE --loop gradscope_nccl_tests_allreduce [--runs 5]
                        [-b 8] [-e 256M] [-n 50] [-w 10]
"""
import argparse
import statistics
import subprocess
import sys


def run(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit("run failed: " + " ".join(command) + "\n" + result.stderr[-2000:])
    return result.stdout


def loop(options):
    out = run([options.loop, "-b", options.b, "-e", options.e, "-f", "2", "-n", str(options.n),
               "-w", str(options.w)])
    times = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[0].isdigit():
            times[int(fields[0])] = (float(fields[2]), float(fields[4]))
    return times


def bench(options):
    out = run([options.gradscope, "bench", "--backend", "nccl", "--strategies", "sum/native", "-b", options.b,
               "-e", options.e, "-f", "2", "-n", str(options.n), "-w", str(options.w), "-c", "0", "--csv",
               "--no-progress"])
    lines = out.splitlines()
    header = lines[0].split(",")
    size, time, busbw = header.index("bytes"), header.index("time_median_us"), header.index("busbw_gbs")
    rows = (line.split(",") for line in lines[1:])
    return {int(fields[size]): (float(fields[time]), float(fields[busbw])) for fields in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gradscope", required=True)
    parser.add_argument("--loop", required=True, help="gradscope_nccl_tests_allreduce")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-b", default="8")
    parser.add_argument("-e", default="256M")
    parser.add_argument("-n", type=int, default=50)
    parser.add_argument("-w", type=int, default=10)
    options = parser.parse_args()

    loop_runs, bench_runs = [], []
    for i in range(options.runs):
        # Alternate which goes first, so that a drift in the machine's state favours neither.
        pair = [(loop_runs, loop), (bench_runs, bench)]
        if i % 2:
            pair.reverse()
        for runs, measure in pair:
            runs.append(measure(options))
        print(f"run {i + 1}/{options.runs} done", file=sys.stderr)

    sizes = sorted(set(loop_runs[0]) & set(bench_runs[0]))
    print(f"# {options.runs} interleaved runs, {options.n} timed calls after {options.w}; medians over runs")
    print(f"{'bytes':>11} {'loop_us':>10} {'bench_us':>10} {'bench/loop':>10} {'range':>13} "
          f"{'loop_busbw':>10} {'bench_busbw':>11}")
    worst = 0.0
    for size in sizes:
        lt = [r[size][0] for r in loop_runs]
        bt = [r[size][0] for r in bench_runs]
        ratios = [b / a for a, b in zip(lt, bt)]
        ratio = statistics.median(ratios)
        worst = max(worst, abs(ratio - 1))
        print(f"{size:>11} {statistics.median(lt):>10.2f} {statistics.median(bt):>10.2f} {ratio:>10.3f} "
              f"{min(ratios):>6.2f}-{max(ratios):<6.2f} {statistics.median(r[size][1] for r in loop_runs):>10.2f} "
              f"{statistics.median(r[size][1] for r in bench_runs):>11.2f}")
    print(f"# largest |median ratio - 1|: {worst:.3f}")


if __name__ == "__main__":
    main()
