#!/usr/bin/python3
"""Jobs across several hosts made on this machine (scripts/cluster.sh: network namespaces joined by
shaped veth links, Open MPI launching through them as through ssh). Each case brings up its own cluster
under a name and subnet of its own and removes it at the end, whatever happened.

  hosts  2 hosts x 2 ranks, host 1's clock 5 ms ahead and host 0's 1.5 ms behind (the agent's test
         setting, per host): samples/mpi_train under `gradscope run`. Checks that every rank of the other
         host was recorded (the agent reached it through the launcher's -x, its environment otherwise bare
         as over ssh), that the ranks carry their real hosts, that merge estimated host 1's offset to within
         10 us of the 6.5 ms injected, and that the report lists the ranks with their hosts and groups them
         by host, with the offset removed. The rank files reported with one gradscope-mpi process per host
         (mpirun -np 2 --map-by node gradscope report DIR) read as one process reads them.
  wire   2 hosts x 2 ranks, 1 Gbit/s links: `gradscope bench` of sum/native, sum/native/bf16 and sum/hier
         at 16 MiB: the native sum bit-exact, and the bf16 wire at least 1.4x faster than the native sum
         (half the bytes on a link that is the limit; docs/benchmarks.md has the 64 MiB figures); in a
         sanitizer build, where the CPU is the limit, the results only.
  links  3 hosts x 1 rank, host 2's link at 100 Mbit/s and the others at 1 Gbit/s: samples/mpi_train under
         `gradscope run --mode explore`. The links explore timed at start name host 2 as the slow one in the
         report, and the step analysis points at it.

Exit 77 (skipped) where namespaces cannot be made (not root, no iproute2, a container without
CAP_SYS_ADMIN): cluster.sh check says why.
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys

SKIP = 77

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
from sanitizers import sanitizer_runtime  # noqa: E402


def run(command, **kwargs):
    return subprocess.run(command, text=True, capture_output=True, **kwargs)


class Cluster:
    def __init__(self, script, name, subnet, hosts, slots, offsets=(), rate="1gbit", slow=None):
        self.script, self.name = script, name
        environment = dict(os.environ, GRADSCOPE_CLUSTER_SLOTS=str(slots))
        command = [script, "up", str(hosts), "--name", name, "--subnet", subnet, "--rate", rate]
        for host, offset in offsets:
            command += ["--clock-offset", f"{host}={offset}"]
        # A cluster of the same name left by a killed run of this test.
        run([script, "down", "--name", name])
        up = run(command, env=environment)
        if up.returncode != 0:
            sys.exit(f"cluster.sh up failed: {up.stderr.strip()}")
        if slow is not None:
            host, slow_rate = slow
            shaped = run([script, "shape", str(host), "--name", name, "--rate", slow_rate])
            if shaped.returncode != 0:
                run([script, "down", "--name", name])
                sys.exit(f"cluster.sh shape failed: {shaped.stderr.strip()}")

    def exec(self, host, command, timeout=300, env=None):
        return run([self.script, "exec", str(host), "--name", self.name, "--", *command], timeout=timeout, env=env)

    def __enter__(self):
        return self

    def __exit__(self, *error):
        down = run([self.script, "down", "--name", self.name])
        if down.returncode != 0:
            print(f"cluster.sh down failed: {down.stderr.strip()}", file=sys.stderr)


def fail(message):
    sys.exit(f"FAIL: {message}")


def run_environment(args):
    """`gradscope run`'s environment: as tests/agent/check_agent.py does, an ASan build's agent gets its
    runtime first in LD_PRELOAD (gradscope run keeps it ahead of the agent for the ranks), and Open MPI's
    leaks by design are not reported."""
    env = dict(os.environ)
    runtime = sanitizer_runtime(args.agent)
    if runtime and "libasan" in runtime:
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return env


def check_split_report(args, cluster, work):
    """The run's rank files reported by one gradscope-mpi process on each host (mpirun -np 2 --map-by node
    gradscope report DIR: host 1's process reads its share and sends it over the TCP link), against one
    process: the same report."""
    ranks = os.path.join(work, "ranks-only")
    os.makedirs(ranks, exist_ok=True)
    for name in os.listdir(work):
        if name.endswith(".db") and name != "trace.db":
            shutil.copy2(os.path.join(work, name), ranks)
    one = run([args.gradscope, "report", ranks])
    if one.returncode != 0:
        fail(f"gradscope report DIR exited {one.returncode}: {one.stderr}")
    # The hosts' processes start with the launcher's environment only (as over ssh): the sanitizers'
    # settings go with -x.
    forwarded = [option for name in ("ASAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS", "OMPI_MCA_mca_base_component_disable_dlclose")
                 if name in os.environ for option in ("-x", name)]
    split = cluster.exec(0, ["mpirun", "-np", "2", "--map-by", "node", *forwarded, args.gradscope, "report", ranks])
    if split.returncode != 0:
        fail(f"mpirun -np 2 gradscope report DIR across the hosts exited {split.returncode}: {split.stderr[-2000:]}")
    if split.stdout != one.stdout:
        fail(f"the report of the rank files split across the two hosts differs from one process's:\n{split.stdout}")
    print(f"mpirun -np 2 --map-by node gradscope report DIR: the report of one process ({len(os.listdir(ranks))} rank files)")


def check_hosts(args):
    work = os.path.join(args.workdir, "run")
    offsets = [(0, -1_500_000), (1, 5_000_000)]
    with Cluster(args.cluster, args.name, args.subnet, hosts=2, slots=2, offsets=offsets) as cluster:
        job = cluster.exec(0, [args.gradscope, "run", "-o", work, "--", "mpirun", "-np", "4", args.sample,
                               "--steps", "1000", "--blocking", "--print-every", "0"], env=run_environment(args))
        if job.returncode != 0:
            fail(f"gradscope run exited {job.returncode}: {job.stderr[-2000:]}")
        check_split_report(args, cluster, work)
    trace = os.path.join(work, "trace.db")
    with sqlite3.connect(trace) as db:
        ranks = db.execute("SELECT rank, host, clock_offset_ns FROM ranks ORDER BY rank").fetchall()
        calls = dict(db.execute("SELECT rank_id, count(*) FROM calls GROUP BY rank_id").fetchall())
    hosts = [host for _, host, _ in ranks]
    if hosts != [f"{args.name}-h0"] * 2 + [f"{args.name}-h1"] * 2:
        fail(f"ranks' hosts {hosts}: expected two on each host, in rank order")
    if len(calls) != 4 or min(calls.values()) < 300:
        fail(f"calls per rank {calls}: every rank, the other host's included, should be recorded")
    injected = offsets[1][1] - offsets[0][1]
    # The estimate is as tight as the all-reduces' causal intervals: 10 us is the issue's figure, checked in
    # an optimised build. A sanitizer build's ranks, beside other tests, left 73 us once: there the check is
    # that the offset was removed (to 1 ms of 6.5), not how precisely.
    bound = 1_000_000 if sanitizer_runtime(args.agent) else 10_000
    for rank, host, offset in ranks:
        expected = 0 if host.endswith("-h0") else -injected
        if offset is None or abs(offset - expected) > bound:
            fail(f"rank {rank} on {host}: clock offset {offset} ns, expected {expected} ns within {bound // 1000} us")
    print(f"host 1's clock offset estimated at {ranks[2][2]} ns (injected {-injected} ns)")
    report = run([args.gradscope, "report", trace])
    if report.returncode != 0:
        fail(f"gradscope report exited {report.returncode}: {report.stderr}")
    for rank, host, _ in ranks:
        if not any(line.split()[:2] == [str(rank), host] for line in report.stdout.splitlines()):
            fail(f"the report has no per-rank line for rank {rank} on {host}:\n{report.stdout}")
    lines = report.stdout.splitlines()
    # The offset column has three significant digits: host 1's line must read the injected offset within the
    # bound above (6.5 ms within 10 us reads -6.49, -6.50 or -6.51 ms), plus the rounding.
    def shows_offset(line, host, members, want_ns):
        fields = line.split()
        if fields[:2] != [host, members]:
            return False
        if want_ns == 0:
            return line.endswith("0 ns")
        if len(fields) < 2 or fields[-1] != "ms":
            return False
        try:
            shown_ns = float(fields[-2]) * 1e6
        except ValueError:
            return False
        return abs(shown_ns - want_ns) <= bound + 5_000
    for host, members, want_ns in ((f"{args.name}-h0", "0-1", 0), (f"{args.name}-h1", "2-3", -injected)):
        if not any(shows_offset(line, host, members, want_ns) for line in lines):
            fail(f"the report's per-host table has no line for {host} with ranks {members} and an offset of "
                 f"{want_ns / 1e6:.2f} ms within {bound // 1000} us:\n{report.stdout}")


def check_wire(args):
    with Cluster(args.cluster, args.name, args.subnet, hosts=2, slots=2) as cluster:
        bench = cluster.exec(0, ["mpirun", "-np", "4", args.bench, "--backend", "mpi", "-b", "16M", "-e", "16M",
                                 "-n", "3", "-w", "1", "--no-progress", "--json", "--strategies",
                                 "sum/native,sum/native/bf16,sum/hier"])
    if bench.returncode != 0:
        fail(f"gradscope-bench exited {bench.returncode}: {bench.stderr[-2000:]}")
    points = {point["strategy"]: point for point in json.loads(bench.stdout)["points"]}
    for strategy in ("sum/native", "sum/native/bf16", "sum/hier"):
        if strategy not in points:
            fail(f"no point for {strategy}: {sorted(points)}")
    for strategy in ("sum/native", "sum/hier"):
        if points[strategy].get("wrong") != 0:
            fail(f"{strategy}: {points[strategy].get('wrong')} elements differ from the exact sum")
    native = points["sum/native"]["time_us"]["median"]
    bf16 = points["sum/native/bf16"]["time_us"]["median"]
    print(f"16 MiB across 2 hosts at 1 Gbit/s: sum/native {native:.0f} us, sum/native/bf16 {bf16:.0f} us "
          f"({native / bf16:.2f}x)")
    # A sanitizer build is unoptimised and instrumented: its CPU, not the link, sets the time there.
    if sanitizer_runtime(args.bench):
        print("an instrumented build: the speed-up is not checked")
    elif native < 1.4 * bf16:
        fail(f"the bf16 wire ({bf16:.0f} us) is not 1.4x faster than the native sum ({native:.0f} us)")


def check_links(args):
    work = os.path.join(args.workdir, "run")
    with Cluster(args.cluster, args.name, args.subnet, hosts=3, slots=1, slow=(2, "100mbit")) as cluster:
        job = cluster.exec(0, [args.gradscope, "run", "-o", work, "--mode", "explore", "--", "mpirun", "-np", "3",
                               args.sample, "--steps", "40", "--blocking", "--print-every", "0"],
                           env=run_environment(args))
        if job.returncode != 0:
            fail(f"gradscope run exited {job.returncode}: {job.stderr[-2000:]}")
    report = run([args.gradscope, "report", os.path.join(work, "trace.db")])
    if report.returncode != 0:
        fail(f"gradscope report exited {report.returncode}: {report.stderr}")
    text = report.stdout
    section = text.split("\nLinks between hosts", 1)
    if len(section) != 2:
        fail(f"the report has no section on the links between hosts:\n{text}")
    pairs = [line.split() for line in section[1].splitlines()[2:5]]
    if len(pairs) != 3 or any(len(pair) < 4 for pair in pairs):
        fail(f"expected three pairs of hosts, slowest first:\n{section[1]}")
    slow = f"{args.name}-h2"
    if slow not in pairs[0][:2] or slow not in pairs[1][:2] or slow in pairs[2][:2]:
        fail(f"the two slowest exchanges should be {slow}'s, the fastest not:\n{section[1]}")
    if f"host {slow}'s link is slow:" not in section[1]:
        fail(f"the links section does not name {slow}:\n{section[1]}")
    print(next(line.strip() for line in section[1].splitlines() if "link is slow" in line))
    if "stragglers: none" not in text and f"host {slow}'s link is slow (see" not in text:
        fail(f"the step analysis found stragglers but does not point at {slow}'s link:\n{text}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", required=True, help="scripts/cluster.sh")
    parser.add_argument("--gradscope", required=True)
    parser.add_argument("--agent", required=True, help="libgradscope-agent.so (gradscope run finds it itself)")
    parser.add_argument("--bench", required=True, help="gradscope-bench")
    parser.add_argument("--sample", required=True, help="gradscope-sample-mpi-train")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--name", required=True, help="the cluster's name (hosts NAME-h0, ...)")
    parser.add_argument("--subnet", required=True, help="three numbers, e.g. 10.213.21")
    parser.add_argument("case", choices=["hosts", "wire", "links"])
    args = parser.parse_args()
    check = run([args.cluster, "check"])
    if check.returncode != 0:
        print(check.stderr.strip() or "cannot make network namespaces here", file=sys.stderr)
        sys.exit(SKIP)
    subprocess.run(["rm", "-rf", args.workdir], check=True)
    os.makedirs(args.workdir)
    {"hosts": check_hosts, "wire": check_wire, "links": check_links}[args.case](args)
    print("OK")


if __name__ == "__main__":
    main()
