#!/usr/bin/env python3
"""Scale figures (docs/benchmarks.md, "Thousands of ranks"): `gradscope merge` and `gradscope report` by rank count.

For each rank count (--ranks, default 64,512,4096), gradscope-synth writes a run of --steps steps (7 calls per
step per rank, two ranks per host), then `gradscope merge DIR -o FILE` and `gradscope report FILE` run
--repeats times. With --baseline, the baseline's merge and report run in the same repeat as the build's,
interleaved, their order swapped every repeat, so that the machine's load falls on both alike; the baseline's
merged file is the one its report reads.

Every figure is one process started by this script: wall = fork to wait4, peak RSS = ru_maxrss taken by
/usr/bin/time -f %M (KiB, shown in MiB). Printed: the medians with the range (min-max) over the repeats,
calls per second of the merge (calls / median wall), CPU time (user + sys, less sensitive to the machine's
load than wall time), the load average at the start and the end; for the build (not the baseline) also
`gradscope report DIR`, the rank files' directory read as it is (merged into a temporary copy); with --split K,
`mpirun -np K gradscope report DIR` (the rank files read across K processes, gradscope-mpi; peak RSS: the
largest process's) and whether its report is byte for byte the one-process one; and, with --check, whether
the baseline's and the build's merged files hold the same rows (every table, row for row).

  /usr/bin/python3 bench/scale_figures.py BUILD_DIR [--baseline DIR] [--ranks 64,512,4096] [--steps 200]
                                          [--repeats 3] [--jobs N] [--split K] [--check] [--markdown]
                                          [--scratch /tmp/scale-figures] [--keep]

BUILD_DIR and --baseline: a build directory (cli/gradscope, tests/support/gradscope-synth) or a directory
with a `gradscope` executable (a copy of a build's, e.g. /tmp/merge-baseline). gradscope-synth comes from
BUILD_DIR. The synthetic runs stay in the scratch directory between invocations (a run is written again when
its file count differs); --keep also keeps the merged files.
"""
import argparse
import hashlib
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time

TIME = "/usr/bin/time"
STEP_TIMEOUT_S = 3600


def executable(directory, name, subdir):
    for candidate in (os.path.join(directory, subdir, name), os.path.join(directory, name)):
        if os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    sys.exit(f"scale_figures: no {name} in {directory} (nor in {directory}/{subdir})")


def load():
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def measure(command, log_path):
    """Runs `command` under /usr/bin/time: (wall seconds, peak RSS KiB, CPU seconds (user + sys), stdout)."""
    rss_path = log_path + ".rss"
    with open(log_path + ".out", "w") as out, open(log_path + ".err", "w") as err:
        start = time.monotonic()
        process = subprocess.Popen([TIME, "-f", "%M %U %S", "-o", rss_path, "--"] + command, stdout=out, stderr=err)
        try:
            rc = process.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            rc = -9
        wall = time.monotonic() - start
    if rc != 0:
        with open(log_path + ".err") as f:
            sys.exit(f"scale_figures: {' '.join(command)} failed ({rc}): {f.read().strip()[-400:]}")
    with open(rss_path) as f:
        rss_kib, user, system = f.read().split()[-3:]
    with open(log_path + ".out") as f:
        return wall, int(rss_kib), float(user) + float(system), f.read()


def synthetic_run(synth, scratch, ranks, steps):
    directory = os.path.join(scratch, f"synth-{ranks}x{steps}")
    if os.path.isdir(directory) and len([f for f in os.listdir(directory) if f.endswith(".db")]) == ranks:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    subprocess.run([synth, "-o", directory, "--ranks", str(ranks), "--steps", str(steps)], check=True,
                   stdout=subprocess.DEVNULL)
    return directory


def table_digest(path):
    """A digest of every row of every table, in stored order (the same rows give the same digest)."""
    digest = hashlib.sha256()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            digest.update(f"table {table}\n".encode())
            for row in db.execute(f'SELECT * FROM "{table}"'):
                digest.update(repr(row).encode())
    return digest.hexdigest()


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build")
    parser.add_argument("--baseline", help="a build (or a directory with gradscope) to compare with")
    parser.add_argument("--ranks", default="64,512,4096", help="rank counts, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, help="gradscope merge --jobs for the build (not the baseline)")
    parser.add_argument("--split", type=int, help="also time mpirun -np SPLIT gradscope report DIR (the build)")
    parser.add_argument("--check", action="store_true", help="compare the merged files' rows")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--scratch", default="/tmp/scale-figures")
    parser.add_argument("--keep", action="store_true", help="keep the merged files")
    options = parser.parse_args()

    binaries = [("new", executable(options.build, "gradscope", "cli"))]
    if options.baseline:
        binaries.insert(0, ("baseline", executable(options.baseline, "gradscope", "cli")))
    synth = executable(options.build, "gradscope-synth", "tests/support")
    os.makedirs(options.scratch, exist_ok=True)
    print(f"load average at the start: {load()}  ({os.cpu_count()} cores)", flush=True)

    rows = []
    for ranks in [int(r) for r in options.ranks.split(",")]:
        inputs = synthetic_run(synth, options.scratch, ranks, options.steps)
        figures = {tag: {"merge": [], "merge_cpu": [], "merge_rss": [], "report": [], "report_cpu": [], "report_rss": [],
                         "dir": [], "dir_rss": [], "split": [], "split_rss": []}
                   for tag, _ in binaries}
        calls = 0
        split_same = True
        for repeat in range(options.repeats):
            order = binaries if repeat % 2 == 0 else list(reversed(binaries))
            for tag, gradscope in order:
                merged = os.path.join(options.scratch, f"merged-{ranks}-{tag}.db")
                log = os.path.join(options.scratch, f"log-{ranks}-{tag}-{repeat}")
                command = [gradscope, "merge", inputs, "-o", merged, "--force"]
                if options.jobs and tag == "new":
                    command += ["--jobs", str(options.jobs)]
                wall, rss, cpu, out = measure(command, log + "-merge")
                found = re.search(r"(\d+) calls", out)
                calls = int(found.group(1)) if found else 0
                figures[tag]["merge"].append(wall)
                figures[tag]["merge_cpu"].append(cpu)
                figures[tag]["merge_rss"].append(rss / 1024)
                wall, rss, cpu, _ = measure([gradscope, "report", merged], log + "-report")
                figures[tag]["report"].append(wall)
                figures[tag]["report_cpu"].append(cpu)
                figures[tag]["report_rss"].append(rss / 1024)
                line = (f"{ranks} ranks, repeat {repeat + 1}, {tag}: merge {figures[tag]['merge'][-1]:.2f} s "
                        f"(CPU {figures[tag]['merge_cpu'][-1]:.1f} s) {figures[tag]['merge_rss'][-1]:.0f} MiB, "
                        f"report {wall:.2f} s (CPU {cpu:.1f} s) {rss / 1024:.0f} MiB")
                if tag == "new":
                    wall, rss, _, out = measure([gradscope, "report", inputs], log + "-report-dir")
                    figures[tag]["dir"].append(wall)
                    figures[tag]["dir_rss"].append(rss / 1024)
                    line += f", report DIR {wall:.2f} s {rss / 1024:.0f} MiB"
                    if options.split:
                        one_report = out
                        wall, rss, _, out = measure(
                            ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np",
                             str(options.split), gradscope, "report", inputs], log + "-report-split")
                        figures[tag]["split"].append(wall)
                        figures[tag]["split_rss"].append(rss / 1024)
                        if out != one_report:
                            split_same = False
                        line += f", {options.split} processes {wall:.2f} s {rss / 1024:.0f} MiB"
                print(f"{line} (load {load()})", flush=True)
        same = ""
        if options.check and len(binaries) == 2:
            digests = {table_digest(os.path.join(options.scratch, f"merged-{ranks}-{tag}.db")) for tag, _ in binaries}
            same = "same rows" if len(digests) == 1 else "ROWS DIFFER"
        for tag, _ in binaries:
            f = figures[tag]
            rows.append([str(ranks), f"{calls:,}", tag,
                         spread(f["merge"], lambda v: f"{v:.1f} s"),
                         f"{calls / statistics.median(f['merge']) / 1000:,.0f} k",
                         spread(f["merge_cpu"], lambda v: f"{v:.1f} s"),
                         spread(f["merge_rss"], lambda v: f"{v:.0f}"),
                         spread(f["report"], lambda v: f"{v:.1f} s"),
                         spread(f["report_cpu"], lambda v: f"{v:.1f} s"),
                         spread(f["report_rss"], lambda v: f"{v:.0f}"),
                         spread(f["dir"], lambda v: f"{v:.1f} s") if f["dir"] else "-",
                         f"{calls / statistics.median(f['dir']) / 1000:,.0f} k" if f["dir"] else "-",
                         spread(f["dir_rss"], lambda v: f"{v:.0f}") if f["dir"] else "-"]
                        + ([spread(f["split"], lambda v: f"{v:.1f} s") if f["split"] else "-",
                            spread(f["split_rss"], lambda v: f"{v:.0f}") if f["split"] else "-",
                            ("same report" if split_same else "REPORT DIFFERS") if f["split"] else "-"]
                           if options.split else [])
                        + [same])
        if not options.keep:
            for tag, _ in binaries:
                os.remove(os.path.join(options.scratch, f"merged-{ranks}-{tag}.db"))

    print(f"load average at the end: {load()}")
    header = ["ranks", "calls", "binary", "merge wall, median (range)", "merge calls/s", "merge CPU (user+sys)",
              "merge peak RSS MiB", "report wall", "report CPU", "report peak RSS MiB", "report DIR wall",
              "report DIR calls/s", "report DIR peak RSS MiB"]
    if options.split:
        header += [f"report DIR, {options.split} processes", f"{options.split} processes' peak RSS MiB",
                   f"{options.split} processes' report"]
    header += ["check"]
    if options.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        for row in [header] + rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))


if __name__ == "__main__":
    main()
