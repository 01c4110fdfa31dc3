#!/usr/bin/env python3
"""What the agent costs an NCCL job per call, on a GPU (docs/benchmarks.md, "NCCL calls on a GPU").

Runs gradscope_nccl_tests_allreduce (an nccl-tests-style loop: one process, every call enqueued back to
back, one synchronisation, host time over the iterations) at 8 bytes, where each call is launch-bound,
and at 64 MiB, in interleaved rounds (the order rotates from round to round):

  bare     no agent
  agent    LD_PRELOAD=libgradscope-agent.so, defaults: CUPTI's kernel records give the spans, one CUDA
           event without timing per call (GPU spans "cupti")
  events   the same with GRADSCOPE_CUPTI=0: two CUDA timing events per call (GPU spans "events")

and prints, per size and kind, the median time per call over the rounds, the median of the per-round
ratios to bare with their range, and (8 bytes) the host time the agent adds to a call. Each agent run's
trace says where its spans came from (runs.config_json "agent.gpu_spans"), which is printed too.

  bench/nccl_overhead.py BUILD_DIR [--rounds 5] [--iterations 3000] [--out DIR]

Exit status 0, 1 when a run failed or the loop cannot use a GPU.
"""
import argparse
import glob
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile

SIZES = (8, 64 << 20)
KINDS = ("bare", "agent", "events")


def run_loop(build, kind, iterations, out_dir):
    """{bytes: microseconds per call} of one run, and the agent's GPU span source (None when bare)."""
    loop = os.path.join(build, "bench", "gradscope_nccl_tests_allreduce")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSCOPE_") and k != "LD_PRELOAD"}
    trace_dir = None
    if kind != "bare":
        trace_dir = tempfile.mkdtemp(prefix=f"{kind}-", dir=out_dir)
        env.update(LD_PRELOAD=os.path.join(build, "agent", "libgradscope-agent.so"),
                   GRADSCOPE_OUTPUT=os.path.join(trace_dir, "trace-%p.db"))
        if kind == "events":
            env["GRADSCOPE_CUPTI"] = "0"
    # Every power of two from 8 B to 64 MiB in one run (one NCCL set-up); the two ends are reported.
    command = [loop, "-b", str(SIZES[0]), "-e", str(SIZES[1]), "-f", "2", "-n", str(iterations), "-w", "200"]
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=300)
    if result.returncode != 0:
        sys.exit(f"nccl_overhead: {kind}: {' '.join(command)} exited {result.returncode}: {result.stderr[-600:]}")
    times = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit():
            times[int(fields[0])] = float(fields[2])
    spans = None
    if trace_dir is not None:
        traces = glob.glob(os.path.join(trace_dir, "trace-*.db"))
        if traces:
            db = sqlite3.connect(f"file:{traces[0]}?mode=ro", uri=True)
            agent = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0]).get("agent", {})
            db.close()
            spans = f"{agent.get('gpu_spans')} {agent.get('gpu_spans_note', '')}".strip()
    return times, spans


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="the build directory (bench/ and agent/ inside)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3000, help="calls per size and run (default 3000)")
    parser.add_argument("--out", default=None, help="where the agent runs' traces go (default: a temporary folder)")
    args = parser.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="nccl-overhead-")
    os.makedirs(out_dir, exist_ok=True)

    times = {kind: {size: [] for size in SIZES} for kind in KINDS}
    sources = {}
    for round_index in range(args.rounds):
        order = KINDS[round_index % len(KINDS):] + KINDS[:round_index % len(KINDS)]
        for kind in order:
            per_size, spans = run_loop(args.build, kind, args.iterations, out_dir)
            for size in SIZES:
                times[kind][size].append(per_size[size])
            if spans:
                sources.setdefault(kind, set()).add(spans)
        print(f"round {round_index + 1}: " + ", ".join(
            f"{kind} {times[kind][SIZES[0]][-1]:.2f}/{times[kind][SIZES[1]][-1]:.1f} us" for kind in KINDS),
            flush=True)

    print(f"\ngradscope_nccl_tests_allreduce, one rank, {args.iterations} calls per size, {args.rounds} "
          f"interleaved rounds")
    print(f"{'bytes':>10} {'kind':>7} {'us/call':>9} {'ratio to bare (median, min-max)':>34}")
    for size in SIZES:
        for kind in KINDS:
            median = statistics.median(times[kind][size])
            if kind == "bare":
                print(f"{size:>10} {kind:>7} {median:>9.3f}")
                continue
            ratios = [a / b for a, b in zip(times[kind][size], times["bare"][size])]
            print(f"{size:>10} {kind:>7} {median:>9.3f} {statistics.median(ratios):>14.4f} "
                  f"({min(ratios):.4f}-{max(ratios):.4f})")
    for kind in KINDS[1:]:
        added = [a - b for a, b in zip(times[kind][SIZES[0]], times["bare"][SIZES[0]])]
        print(f"host time the agent adds per {SIZES[0]}-byte call ({kind}): median {statistics.median(added):.3f} us "
              f"(range {min(added):.3f} to {max(added):.3f}); GPU spans: {', '.join(sorted(sources.get(kind, {'?'})))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
