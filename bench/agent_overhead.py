#!/usr/bin/env python3
"""Overhead of the agent's observe mode on an MPI_Allreduce loop (docs/benchmarks.md).

First the cost per call in isolation (gradscope_agent_hot_path: one rank, MPI_Allreduce through the
agent's wrapper against PMPI_Allreduce, alternating blocks; every call recorded, and with the default
recording rate limit), then the same comparisons inside one 2-rank job with the agent preloaded (the OSU
loop in alternating blocks through the wrapper and around it, so both sides share the machine's state;
without the agent the ratio is the method's own error), at 8 bytes for MPI_Allreduce, an MPI_Send/MPI_Recv
ping-pong and an MPI_Isend/MPI_Irecv + MPI_Wait ping-pong, and at 64 MiB. Then runs
gradscope_osu_allreduce (the OSU osu_allreduce loop: MPI_Wtime around each call, then a barrier) with 2
ranks, in pairs: bare, then with LD_PRELOAD=libgradscope-agent.so (the order alternates from
pair to pair), and reports per message size the median over pairs of (latency with the agent /
latency without). Then the agent's resident memory: each rank's peak RSS with and without the agent,
for a short and a 10x longer run, to show it does not grow with the run's length.

  bench/agent_overhead.py BUILD_DIR [--pairs 15] [--ranks 2] [--in-job-runs 7] [--small-only]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# Each rank reports its peak resident set through this wrapper (getrusage of its child).
RSS_WRAPPER = ("import resource,subprocess,sys;"
               "rc=subprocess.run(sys.argv[1:]).returncode;"
               "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr);"
               "sys.exit(rc)")


def run(build, ranks, args, agent, out_dir, wrap_rss=False):
    command = ["mpiexec", "-np", str(ranks), "--oversubscribe"]
    # Ranks yield while they wait only when they outnumber the cores; otherwise they spin, as MPI jobs do.
    if ranks > os.cpu_count():
        command += ["--mca", "mpi_yield_when_idle", "1"]
    if agent:
        command += ["-x", "LD_PRELOAD=" + os.path.join(build, "agent", "libgradscope-agent.so"),
                    "-x", "GRADSCOPE_OUTPUT=" + os.path.join(out_dir, "rank%r-%p.db")]
    program = [os.path.join(build, "bench", "gradscope_osu_allreduce")] + args
    if wrap_rss:
        program = [sys.executable, "-c", RSS_WRAPPER] + program
    result = subprocess.run(command + program, env={**os.environ, **MPI_ENV}, capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        sys.exit("run failed: " + " ".join(command + program) + "\n" + result.stderr)
    latencies = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit():
            latencies[int(fields[0])] = float(fields[1])
    rss = [int(v) for v in re.findall(r"maxrss_kib (\d+)", result.stderr)]
    return latencies, rss


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--in-job-runs", type=int, default=9)
    parser.add_argument("--small-only", action="store_true", help="leave out the 64 MiB comparisons")
    options = parser.parse_args()
    # 8 B twice, with the agent's defaults: both loops call far faster than GRADSCOPE_MAX_CALL_RATE, so a
    # rank records 5,000 calls per 100 ms and counts the rest; 200,000 calls last long enough for the
    # background writer to drain while the ranks spin.
    cases = [("8 B, 50,000 calls", ["-n", "8", "-m", "8", "-i", "50000", "-x", "1000", "-p", "4"]),
             ("8 B, 200,000 calls", ["-n", "8", "-m", "8", "-i", "200000", "-x", "1000", "-p", "4"]),
             ("64 MiB", ["-n", str(64 << 20), "-m", str(64 << 20), "-i", "40", "-x", "3", "-p", "2"])]
    if options.small_only:
        cases = cases[:2]
    with tempfile.TemporaryDirectory() as out_dir:
        def hot_path(ranks, blocks, agent, size=None, operation=None, **variables):
            command = ["mpiexec", "-np", str(ranks), "--oversubscribe"]
            if agent:
                command += ["-x", "LD_PRELOAD=" + os.path.join(options.build, "agent", "libgradscope-agent.so"),
                            "-x", "GRADSCOPE_OUTPUT=" + os.path.join(out_dir, "hot%r-%p.db")]
                for name, value in variables.items():
                    command += ["-x", f"{name}={value}"]
            program = [os.path.join(options.build, "bench", "gradscope_agent_hot_path"), str(blocks)]
            if size is not None or operation is not None:
                program.append(str(size if size is not None else 8))
            if operation is not None:
                program.append(operation)
            result = subprocess.run(command + program, env={**os.environ, **MPI_ENV}, capture_output=True,
                                    text=True, timeout=600)
            if result.returncode != 0:
                sys.exit("run failed: " + " ".join(command + program) + "\n" + result.stderr)
            return result.stdout.strip()

        # Every call recorded: no rate limit, and a ring of 256 Ki records (with the default 64 Ki, most calls
        # of the 2-rank loop would find it full). Over the limit: the default configuration, where all but
        # GRADSCOPE_MAX_CALL_RATE calls per second are counted and not timed.
        recorded = {"GRADSCOPE_MAX_CALL_RATE": "0", "GRADSCOPE_BUFFER_CALLS": "262144"}
        kinds = (("without the agent", False, {}, 3), ("with the agent, every call recorded", True, recorded,
                                                      options.in_job_runs),
                 ("with the agent, default (rate limit)", True, {}, options.in_job_runs))
        for label, agent, variables, _ in kinds:
            print(f"hot path, 1 rank, {label}: {hot_path(1, 21, agent, **variables)}", flush=True)
        # Both kinds of call in one job, so that they share the VM's latency mode (gradscope_agent_hot_path):
        # 100 pairs of blocks of 2,000 calls; the 8-byte all-reduce, the MPI_Send/MPI_Recv ping-pong and the
        # MPI_Isend/MPI_Irecv + MPI_Wait ping-pong, the runs of the three interleaved.
        operations = ("allreduce", "pingpong", "isend")
        for label, agent, variables, runs in kinds:
            ratios = {operation: [] for operation in operations}
            for _ in range(runs):
                for operation in operations:
                    line = hot_path(options.ranks, 100, agent, operation=operation, **variables)
                    ratios[operation].append(float(line.rsplit(" ", 1)[1]))
                    print(f"in one job, {label}: {line}", flush=True)
            for operation in operations:
                values = ratios[operation]
                print(f"in one job, {label}, {operation}: median of {runs} runs' ratios "
                      f"{statistics.median(values):.4f} (min {min(values):.4f}, max {max(values):.4f})", flush=True)
        # 64 MiB the same way (blocks of 4 calls; a call takes tens of milliseconds): separate runs differ by
        # several percent with the memory system's state, which both kinds share here.
        for label, agent in () if options.small_only else (("without the agent", False), ("with the agent", True)):
            ratios = []
            for _ in range(5):
                line = hot_path(options.ranks, 21, agent, size=64 << 20)
                ratios.append(float(line.rsplit(" ", 1)[1]))
                print(f"in one job, 64 MiB, {label}: {line}", flush=True)
            print(f"in one job, 64 MiB, {label}: median of 5 runs' ratios {statistics.median(ratios):.4f}", flush=True)
        for name, args in cases:
            ratios, bare_all, agent_all = [], [], []
            for pair in range(options.pairs):
                order = [False, True] if pair % 2 == 0 else [True, False]
                result = {}
                for agent in order:
                    result[agent] = run(options.build, options.ranks, args, agent, out_dir)[0]
                size = next(iter(result[False]))
                bare_all.append(result[False][size])
                agent_all.append(result[True][size])
                ratios.append(result[True][size] / result[False][size])
            print(f"{name}: {options.pairs} pairs, median latency bare {statistics.median(bare_all):.3f} us, "
                  f"with agent {statistics.median(agent_all):.3f} us; median ratio {statistics.median(ratios):.4f} "
                  f"(min {min(ratios):.4f}, max {max(ratios):.4f})", flush=True)
        for iterations in (200000, 2000000):
            args = ["-n", "8", "-m", "8", "-i", str(iterations), "-x", "100"]
            _, bare = run(options.build, options.ranks, args, False, out_dir, wrap_rss=True)
            _, agent = run(options.build, options.ranks, args, True, out_dir, wrap_rss=True)
            print(f"peak RSS per rank, {iterations} calls: bare {max(bare) / 1024:.1f} MiB, "
                  f"with agent {max(agent) / 1024:.1f} MiB (+{(max(agent) - max(bare)) / 1024:.1f} MiB)", flush=True)


if __name__ == "__main__":
    main()
