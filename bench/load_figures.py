#!/usr/bin/env python3
"""Load figures (docs/benchmarks.md, "Load"): time and memory of gradscope on big jobs and big traces.

Part A, a job of 1,000,000 collectives per rank, on 2 and on 3 ranks: samples/mpi_train (7 collectives
per step: six gradient all-reduces, one of them an MPI_Iallreduce, and the loss's; plus one MPI_Bcast at
setup) with --steps ceil(1,000,000 / 7) --print-every 0, run plain under mpiexec and under
`gradscope run -o DIR -- mpiexec ...` (the agent, observe mode). Every rank runs under a small Python
launcher that runs the sample under /usr/bin/time (without the agent in time itself) and writes the
sample's peak RSS (ru_maxrss) and start/end times to a file, in both runs alike. Reported: the job's wall time plain and under
gradscope, the ranks' own wall time, each rank's peak RSS, calls recorded per rank (the per-rank files
and the merged trace, counted with sqlite3), drops (`drops` table), the per-rank and merged file sizes,
the time gradscope run spent after the job's last rank ended (merge + summary), and, separately, a
`gradscope merge` of the per-rank files and a `gradscope report` of the merged trace.

Part B, a trace of 10,000,000 calls: gradscope-synth writes 4 rank files of 2.5 M calls each, then
`gradscope merge` into one file, `gradscope report`, `gradscope recommend` (with a bench trace from
`mpiexec -np 2 gradscope bench --backend mpi -b 8 -e 1M -f 4 -n 10 -w 3`), `gradscope export` to Chrome
trace JSON and to CSV, and the viewer: gradscope_gui_bench (offscreen, docs/gui.md "Figures") and
`gradscope-gui --screenshots` (open the trace and render every view).

Every figure is one run of a process started by this script: wall = time from fork to wait4, peak
RSS = the wait4 ru_maxrss of that process (KiB, shown in MiB), taken by /usr/bin/time -f %M, which
forks it from a ~1 MiB process (see TIME below for why not from this script). Linux reports the largest
of the process and of the descendants it waited for, so a launcher's figure covers its ranks and
gradscope run's covers the job too; the per-rank figures come from each rank's own /usr/bin/time.
The machine's load average is printed at the start and end of each part.

  /usr/bin/python3 bench/load_figures.py BUILD_DIR [--quick] [--markdown] [--parts AB]
                                         [--scratch /tmp/load-figures] [--keep] [--bench-trace FILE]

--quick: a tenth of the sizes (a smoke check). --markdown: the tables as markdown rows. The scratch
directory's big files are removed at the end (--keep leaves them); results.txt stays.
"""
import argparse
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# tests/agent/check_agent.py's mpiexec(): ranks may outnumber the 2 cores, so they yield while they wait.
MPIEXEC_OPTIONS = ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
SAMPLE_CALLS_PER_STEP = 7  # samples/mpi_train: 6 gradient all-reduces + the loss's, --blocking or not
SAMPLE_SETUP_CALLS = 1  # the MPI_Bcast of the initial weights
SYNTH_CALLS_PER_STEP = 7  # gradscope-synth: calls per step per rank
STEP_TIMEOUT_S = 3600

# Runs one rank: the program under /usr/bin/time (its wait4 rusage of the program: ru_maxrss), then writes
# that and the rank's start/end times to DIR/rank<N>-<pid>.json. The same launcher is used with and without
# the agent; /usr/bin/time itself runs without the agent preloaded (see TIME below).
RANK_LAUNCHER = r"""
import json, os, sys, time
time_tool, out_dir, program = sys.argv[1], sys.argv[2], sys.argv[3:]
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "?"))
rss_file = os.path.join(out_dir, f"rank{rank}-{os.getpid()}.rss")
environment = dict(os.environ)
if time_tool:
    preload = environment.pop("LD_PRELOAD", None)
    command = [time_tool, "-f", "%M", "-o", rss_file, "--"]
    command += (["env", "LD_PRELOAD=" + preload] if preload else []) + program
else:
    command = program
start, start_wall = time.monotonic(), time.time()
pid = os.fork()
if pid == 0:
    try:
        os.execvpe(command[0], command, environment)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
end, end_wall = time.monotonic(), time.time()
maxrss = usage.ru_maxrss
if time_tool:
    with open(rss_file) as f:
        maxrss = int(f.read().split()[-1])
with open(os.path.join(out_dir, f"rank{rank}-{os.getpid()}.json"), "w") as f:
    json.dump({"rank": rank, "maxrss_kib": maxrss, "wall_s": end - start, "start": start_wall,
               "end": end_wall, "status": status}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""

# ru_maxrss of a child counts the memory image it had between fork and exec, i.e. its parent's resident
# set at the fork: a child of this script (tens of MiB after its sqlite3 queries) would report at least
# that. So every measured process is forked by GNU time (about 1-2 MiB), whose -f %M is the ru_maxrss of
# its wait4 of the process; the wall time is taken here around it. Without /usr/bin/time the script's own
# os.wait4 is used and the floor (this script's resident set at the fork) is printed next to the figure.
TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else ""


def own_rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Measured:
    def __init__(self, command, rc, wall_s, maxrss_kib, start_wall, end_wall, stdout, stderr, lines=None):
        self.command, self.rc, self.wall_s, self.maxrss_kib = command, rc, wall_s, maxrss_kib
        self.start_wall, self.end_wall = start_wall, end_wall
        self.stdout, self.stderr = stdout, stderr
        self.lines = lines or []  # (seconds since start, line) as the child printed them (stream=True)

    @property
    def rss_mib(self):
        return self.maxrss_kib / 1024

    def failed(self):
        return self.rc != 0

    def error_tail(self):
        text = self.stderr.strip() or self.stdout.strip()
        return " / ".join(text.splitlines()[-3:])


def measure(command, log_dir, name, env=None, stream=False, timeout=STEP_TIMEOUT_S):
    """Runs `command` as a child, waits for it with os.wait4: wall time and that child's ru_maxrss (KiB)."""
    out_path = os.path.join(log_dir, name + ".out")
    err_path = os.path.join(log_dir, name + ".err")
    environment = {**os.environ, **(env or {})}
    rss_path = os.path.join(log_dir, name + ".rss")
    lines = []
    floor = own_rss_kib()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        start_wall = time.time()
        start = time.monotonic()
        timed = ([TIME, "-f", "%M", "-o", rss_path, "--"] if TIME else []) + command
        process = subprocess.Popen(timed, stdout=subprocess.PIPE if stream else out, stderr=err, env=environment,
                                   start_new_session=True, text=stream)
        timed_out = []

        def kill():
            timed_out.append(True)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        if stream:
            for line in process.stdout:
                lines.append((time.monotonic() - start, line.rstrip("\n")))
                out.write(line)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - start
        end_wall = time.time()
        timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
    with open(out_path) as f:
        stdout = f.read()
    with open(err_path) as f:
        stderr = f.read()
    if timed_out:
        stderr += f"\n(killed after {timeout} s)"
    maxrss = usage.ru_maxrss
    if TIME:
        try:
            with open(rss_path) as f:
                maxrss = int(f.read().split()[-1])
        except (OSError, ValueError, IndexError):
            maxrss = 0
    elif maxrss <= floor * 1.05:
        stderr += f"\n(peak RSS at the floor: this script's {floor / 1024:.1f} MiB when it forked)"
    return Measured(command, process.returncode, wall, maxrss, start_wall, end_wall, stdout, stderr, lines)


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def mib(size):
    return size / (1 << 20)


def file_size(path):
    """Size of a SQLite file with its -wal (a closed trace has none)."""
    total = os.path.getsize(path)
    if os.path.exists(path + "-wal"):
        total += os.path.getsize(path + "-wal")
    return total


def connect(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def calls_per_rank(path):
    with connect(path) as db:
        return dict(db.execute("SELECT r.rank, count(*) FROM calls c JOIN ranks r ON r.id = c.rank_id "
                               "GROUP BY c.rank_id ORDER BY r.rank").fetchall())


def drops_of(path):
    with connect(path) as db:
        return db.execute("SELECT r.rank, d.kind, d.count FROM drops d JOIN ranks r ON r.id = d.rank_id "
                          "ORDER BY r.rank, d.kind").fetchall()


def rank_records(directory):
    records = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                records.append(json.load(f))
    return sorted(records, key=lambda r: str(r["rank"]))


def fmt_count(n):
    return f"{n:,}"


class Table:
    def __init__(self, title):
        self.title = title
        self.rows = []  # (step, wall s, peak RSS MiB, notes)

    def add(self, step, measured=None, notes="", wall=None, rss=None):
        if measured is not None:
            wall = measured.wall_s if wall is None else wall
            rss = measured.rss_mib if rss is None else rss
            if measured.failed():
                notes = f"FAILED (exit {measured.rc}: {measured.error_tail()}); " + notes
        self.rows.append((step, "" if wall is None else f"{wall:.2f}", "" if rss is None else f"{rss:.1f}", notes))

    def text(self):
        header = ("step", "wall s", "peak RSS MiB", "notes")
        width = [max(len(r[i]) for r in self.rows + [header]) for i in range(3)]
        lines = [self.title, ""]
        for row in [header] + self.rows:
            lines.append(f"  {row[0]:<{width[0]}}  {row[1]:>{width[1]}}  {row[2]:>{width[2]}}  {row[3]}")
        return "\n".join(lines)

    def markdown(self):
        lines = [f"**{self.title}**", "", "| step | wall s | peak RSS MiB | notes |", "|---|---|---|---|"]
        for row in self.rows:
            cells = [c.replace("|", "\\|") for c in row]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


# -----------------------------------------------------------------------------------------------------
# Part A: a job of 1,000,000 collectives per rank


def part_a(options, scratch, tables, extra):
    build = options.build
    gradscope = os.path.join(build, "cli", "gradscope")
    sample = os.path.join(build, "samples", "mpi_train", "gradscope-sample-mpi-train")
    target = 100_000 if options.quick else 1_000_000
    steps = math.ceil(target / SAMPLE_CALLS_PER_STEP)
    expected = steps * SAMPLE_CALLS_PER_STEP + SAMPLE_SETUP_CALLS
    for ranks in (2, 3):
        load_start = load()
        base = os.path.join(scratch, f"a-{ranks}ranks")
        os.makedirs(base, exist_ok=True)
        table = Table(f"Part A: samples/mpi_train, {ranks} ranks, {steps:,} steps "
                      f"({fmt_count(expected)} collectives per rank)")

        launcher = os.path.join(base, "rank_launcher.py")
        with open(launcher, "w") as f:
            f.write(RANK_LAUNCHER)

        def job(tag):
            rank_dir = os.path.join(base, "ranks-" + tag)
            os.makedirs(rank_dir, exist_ok=True)
            return (["mpiexec", "-np", str(ranks)] + MPIEXEC_OPTIONS
                    + [sys.executable, launcher, TIME, rank_dir, sample, "--steps", str(steps),
                       "--print-every", "0"]), rank_dir

        def rank_summary(records):
            rss = ", ".join(f"{r['maxrss_kib'] / 1024:.1f}" for r in records)
            walls = ", ".join(f"{r['wall_s']:.1f}" for r in records)
            return rss, walls

        # (1) plain
        command, plain_ranks = job("plain")
        plain = measure(command, base, "plain", env=MPI_ENV)
        plain_records = rank_records(plain_ranks)
        plain_rss, plain_walls = rank_summary(plain_records)
        plain_rank_max = max((r["maxrss_kib"] for r in plain_records), default=0) / 1024
        plain_teardown = plain.end_wall - max((r["end"] for r in plain_records), default=plain.end_wall)
        table.add("job, plain mpiexec", plain, rss=plain_rank_max,
                  notes=f"peak RSS per rank {plain_rss} MiB; ranks' wall {plain_walls} s; "
                        f"mpiexec's tree {plain.rss_mib:.1f} MiB; {plain_teardown:.2f} s from the last rank's "
                        f"end to mpiexec's")

        # (2) under gradscope run
        out_dir = os.path.join(base, "trace")
        command, agent_ranks = job("agent")
        agent = measure([gradscope, "run", "-o", out_dir, "--"] + command, base, "agent", env=MPI_ENV)
        agent_records = rank_records(agent_ranks)
        agent_rss, agent_walls = rank_summary(agent_records)
        agent_rank_max = max((r["maxrss_kib"] for r in agent_records), default=0) / 1024
        job_end = max((r["end"] for r in agent_records), default=agent.end_wall)
        after_job = agent.end_wall - job_end
        job_wall = job_end - agent.start_wall
        rank_files = sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)
                            if f.endswith(".db") and f != "trace.db") if os.path.isdir(out_dir) else []
        merged = os.path.join(out_dir, "trace.db")
        per_file = []
        for path in rank_files:
            counts = calls_per_rank(path)
            per_file.append((counts, file_size(path)))
        file_calls = "; ".join(f"rank {r}: {fmt_count(n)}" for counts, _ in per_file for r, n in counts.items())
        file_sizes = ", ".join(f"{mib(size):.1f}" for _, size in per_file)
        bytes_per_call = [size / max(1, sum(c.values())) for c, size in per_file]
        merged_calls = calls_per_rank(merged) if os.path.exists(merged) else {}
        merged_drops = drops_of(merged) if os.path.exists(merged) else []
        merged_size = file_size(merged) if os.path.exists(merged) else 0
        drops_text = ("none" if not merged_drops else
                      "; ".join(f"rank {r} {kind} {fmt_count(n)}" for r, kind, n in merged_drops))
        ratio = agent.wall_s / plain.wall_s if plain.wall_s else float("nan")
        job_ratio = job_wall / plain.wall_s if plain.wall_s else float("nan")
        table.add("job, under gradscope run (observe)", agent, rss=agent_rank_max,
                  notes=f"{ratio:.2f}x plain; peak RSS per rank {agent_rss} MiB "
                        f"(+{agent_rank_max - plain_rank_max:.1f} MiB); ranks' wall {agent_walls} s; "
                        f"gradscope run's tree {agent.rss_mib:.1f} MiB (job + merge + summary)")
        table.add("  of which the job (start to the last rank's end)", wall=job_wall,
                  notes=f"{job_ratio:.2f}x plain")
        table.add("  of which merge + summary after the job", wall=after_job,
                  notes=f"plain mpiexec's own teardown: {plain_teardown:.2f} s")
        table.add("  calls recorded", notes=f"expected {fmt_count(expected)} per rank; per-rank files: "
                                            f"{file_calls}; merged trace: "
                                            + "; ".join(f"rank {r}: {fmt_count(n)}"
                                                        for r, n in merged_calls.items())
                                            + f"; drops: {drops_text}")
        table.add("  trace sizes", notes=f"per-rank files {file_sizes} MiB ("
                                         + ", ".join(f"{b:.1f}" for b in bytes_per_call)
                                         + f" B/call); merged {mib(merged_size):.1f} MiB")

        # The finish step again, separately: merge of the per-rank files, then the summary.
        if rank_files:
            remerged = os.path.join(base, "remerged.db")
            merge = measure([gradscope, "merge", "-f", "-o", remerged] + rank_files, base, "merge")
            table.add("gradscope merge of the per-rank files", merge,
                      notes=f"{mib(file_size(remerged)) if os.path.exists(remerged) else 0:.1f} MiB")
            report = measure([gradscope, "report", remerged], base, "report")
            table.add("gradscope report of the merged trace", report,
                      notes=f"{len(report.stdout.splitlines())} lines")
        extra.append(f"gradscope run's output ({ranks} ranks), last lines:\n"
                     + "\n".join("    " + l for l in (agent.stdout + agent.stderr).strip().splitlines()[-14:]))
        table.title += f" — load average {load_start} at start, {load()} at end"
        tables.append(table)
        print(table.text() + "\n", flush=True)
        if not options.keep:
            shutil.rmtree(base, ignore_errors=True)


# -----------------------------------------------------------------------------------------------------
# Part B: a trace of 10,000,000 calls


def part_b(options, scratch, tables, extra):
    build = options.build
    gradscope = os.path.join(build, "cli", "gradscope")
    load_start = load()
    base = os.path.join(scratch, "b")
    os.makedirs(base, exist_ok=True)
    ranks = 4
    total = 1_000_000 if options.quick else 10_000_000
    steps = math.ceil(total / ranks / SYNTH_CALLS_PER_STEP)
    table = Table(f"Part B: a trace of {fmt_count(steps * SYNTH_CALLS_PER_STEP * ranks)} calls "
                  f"(gradscope-synth, {ranks} ranks x {steps:,} steps)")

    synth_dir = os.path.join(base, "synth")
    shutil.rmtree(synth_dir, ignore_errors=True)
    synth = measure([os.path.join(build, "tests", "support", "gradscope-synth"), "--ranks", str(ranks),
                     "--steps", str(steps), "-o", synth_dir], base, "synth")
    rank_files = sorted(os.path.join(synth_dir, f) for f in os.listdir(synth_dir) if f.endswith(".db")) \
        if os.path.isdir(synth_dir) else []
    sizes = [file_size(f) for f in rank_files]
    table.add("(setup) gradscope-synth writes the rank files", synth,
              notes=f"{len(rank_files)} files, {', '.join(f'{mib(s):.1f}' for s in sizes)} MiB")

    if options.bench_trace:
        bench = options.bench_trace
        with connect(bench) as db:
            n = db.execute("SELECT count(*) FROM measurements").fetchone()[0]
        table.add("(setup) bench trace", notes=f"given: {bench}, {n} measurements")
    else:
        bench = os.path.join(base, "bench.db")
        if os.path.exists(bench):
            os.remove(bench)
        made = measure(["mpiexec", "-np", "2"] + MPIEXEC_OPTIONS
                       + [gradscope, "bench", "--backend", "mpi", "-b", "8", "-e", "1M", "-f", "4", "-n", "10",
                          "-w", "3", "--no-progress", "-o", bench], base, "bench", env=MPI_ENV)
        n = 0
        if os.path.exists(bench):
            with connect(bench) as db:
                n = db.execute("SELECT count(*) FROM measurements").fetchone()[0]
        table.add("(setup) gradscope bench, 2 ranks, for recommend", made, notes=f"{n} measurements")

    big = os.path.join(base, "big.db")
    merge = measure([gradscope, "merge", "-f", "-o", big] + rank_files, base, "merge")
    big_calls = sum(calls_per_rank(big).values()) if os.path.exists(big) else 0
    input_size = sum(sizes)
    table.add("gradscope merge into one file", merge,
              notes=f"{fmt_count(big_calls)} calls, {mib(file_size(big)) if os.path.exists(big) else 0:.1f} MiB "
                    f"({file_size(big) / max(1, big_calls) if os.path.exists(big) else 0:.1f} B/call) "
                    f"from {mib(input_size):.1f} MiB of rank files")

    report = measure([gradscope, "report", big], base, "report")
    table.add("gradscope report", report, notes=f"{len(report.stdout.splitlines())} lines")

    recommend = measure([gradscope, "recommend", big, bench, "--no-store"], base, "recommend")
    table.add("gradscope recommend (+ bench trace, --no-store)", recommend,
              notes=f"{len(recommend.stdout.splitlines())} lines")

    for fmt, suffix in (("chrome-trace", "json"), ("csv", "csv")):
        out = os.path.join(base, "big." + suffix)
        export = measure([gradscope, "export", big, "--format", fmt, "-f", "-o", out], base, "export-" + suffix)
        size = os.path.getsize(out) if os.path.exists(out) else 0
        table.add(f"gradscope export --format {fmt}", export,
                  notes=f"{mib(size):.1f} MiB ({size / max(1, big_calls):.1f} B/call)")
        if os.path.exists(out) and not options.keep:
            os.remove(out)

    gui_env = {"QT_QPA_PLATFORM": "offscreen"}
    gui_bench = measure([os.path.join(build, "gui", "gradscope_gui_bench"), big, "10"], base, "gui-bench",
                        env=gui_env)
    figures = []
    for line in gui_bench.stdout.splitlines():
        words = [w for w in line.split() if not w.startswith("(n=")]
        numbers = []
        while words and words[-1].replace(".", "", 1).isdigit():
            numbers.insert(0, words.pop())
        if numbers and not line.startswith(("trace:", "detailed window")):
            figures.append(f"{' '.join(words)} {numbers[1] if len(numbers) == 3 else numbers[0]}")
    table.add("gradscope_gui_bench FILE 10 (timeline, offscreen)", gui_bench,
              notes="ms (median of 10 where repeated): " + "; ".join(figures))
    extra.append("gradscope_gui_bench output (ms: min, median, max):\n"
                 + "\n".join("    " + l for l in gui_bench.stdout.strip().splitlines()))

    shots_dir = os.path.join(base, "screenshots")
    shutil.rmtree(shots_dir, ignore_errors=True)
    shots = measure([os.path.join(build, "gui", "gradscope-gui"), "--screenshots", shots_dir, big], base,
                    "gui-screenshots", env=gui_env, stream=True)
    previous = 0.0
    per_view = []
    for at, line in shots.lines:
        if line.startswith("wrote "):
            per_view.append(f"{os.path.splitext(os.path.basename(line[6:]))[0]} {at - previous:.1f}")
            previous = at
    table.add("gradscope-gui --screenshots (open + every view)", shots,
              notes="s until each view was written: " + ", ".join(per_view))

    table.title += f" — load average {load_start} at start, {load()} at end"
    tables.append(table)
    print(table.text() + "\n", flush=True)
    if not options.keep:
        shutil.rmtree(base, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown at the end")
    parser.add_argument("--parts", default="AB", help="A, B or AB (default)")
    parser.add_argument("--scratch", default="/tmp/load-figures")
    parser.add_argument("--keep", action="store_true", help="keep the traces and exports in the scratch dir")
    parser.add_argument("--bench-trace", help="a trace with measurements for recommend (default: run bench)")
    options = parser.parse_args()
    options.build = os.path.abspath(options.build)
    for tool in ("cli/gradscope", "agent/libgradscope-agent.so", "samples/mpi_train/gradscope-sample-mpi-train",
                 "tests/support/gradscope-synth", "gui/gradscope-gui", "gui/gradscope_gui_bench"):
        if not os.path.exists(os.path.join(options.build, tool)):
            sys.exit(f"load_figures: {os.path.join(options.build, tool)} is missing; build it first")
    os.makedirs(options.scratch, exist_ok=True)
    mpi_version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout.splitlines()
    header = (f"# load_figures {'--quick ' if options.quick else ''}on {os.uname().nodename}, "
              f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}; build {options.build}; "
              f"{mpi_version[0] if mpi_version else 'mpiexec ?'}; load average {load()}")
    if TIME:
        floor = measure(["true"], options.scratch, "floor")
        for suffix in (".out", ".err", ".rss"):
            os.remove(os.path.join(options.scratch, "floor" + suffix))
        header += f"; RSS by /usr/bin/time (wait4), floor {floor.rss_mib:.1f} MiB (/bin/true)"
    else:
        header += "; RSS by os.wait4 in this script (no /usr/bin/time)"
    print(header + "\n", flush=True)
    started = time.monotonic()
    tables, extra = [], []
    if "A" in options.parts.upper():
        part_a(options, options.scratch, tables, extra)
    if "B" in options.parts.upper():
        part_b(options, options.scratch, tables, extra)
    for text in extra:
        print(text + "\n")
    if options.markdown:
        for table in tables:
            print(table.markdown() + "\n")
    print(f"# done in {time.monotonic() - started:.0f} s; load average {load()}")
    with open(os.path.join(options.scratch, "results.txt"), "w") as f:
        f.write(header + "\n\n" + "\n\n".join(t.text() for t in tables) + "\n\n" + "\n\n".join(extra) + "\n\n"
                + "\n\n".join(t.markdown() for t in tables) + "\n")


if __name__ == "__main__":
    main()
