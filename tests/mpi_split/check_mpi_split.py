#!/usr/bin/python3
"""`mpirun -np K gradscope report|recommend|export|merge DIR`: gradscope becomes gradscope-mpi, whose K
processes split the reading of the run's rank files (storage/merge.h MergeLink). Checks, for K in
--processes (2, 3 and 4; a sanitizer build 3 alone) against one process:

  same     the report, the recommendation (a directory and a measurements file), the CSV export and the
           merged file's rows are byte for byte those of one process, printed once; every process exits 0
  bad      a file that is not a trace, in a reader's share (not process 0's): one line naming it, the line one
           process gives, a non-zero exit, no merged file and no temporary copy left in TMPDIR
  alone    a gradscope without gradscope-mpi beside it: process 0 reports alone (one line on stderr says
           why), the report printed once
  nested   the ranks of an MPI job (mpi4py) each run `gradscope report DIR` as a child process: the child
           sees the launcher's variables but must not join the job; each reads alone, the whole report
  wrapped  mpirun -np 2 bash -c "gradscope report DIR": a wrapper without MPI between the launcher and
           gradscope still splits, the report printed once
"""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys


def run(command, env=None, timeout=300):
    return subprocess.run(command, text=True, capture_output=True, env=env, timeout=timeout)


def rows(path):
    """Every row of every table, as one process would compare two merged files."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = []
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        out.append(("table", table))
        out.extend(db.execute(f'SELECT * FROM "{table}"').fetchall())
    db.close()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gradscope", required=True)
    parser.add_argument("--synth", required=True)
    parser.add_argument("--mpirun", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--processes", default="2,3,4", help="the K to check, comma-separated")
    args = parser.parse_args()
    counts = [int(k) for k in args.processes.split(",")]

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    tmp = os.path.join(args.work, "tmp")
    os.makedirs(tmp)
    env = dict(os.environ, TMPDIR=tmp, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ranks = os.path.join(args.work, "ranks")
    bench = os.path.join(args.work, "bench.db")
    for command in ([args.synth, "--ranks", "11", "--steps", "30", "-o", ranks],
                    [args.synth, "--bench", bench, "--ranks", "2", "--wins", "sum/mpi.ring=1K..64K"]):
        made = run(command)
        if made.returncode != 0:
            sys.exit(f"gradscope-synth failed: {made.stderr.strip()}")

    failures = []

    def check(condition, message):
        if not condition:
            failures.append(message)
            print("FAIL:", message)

    commands = {
        "report": lambda out: ["report", ranks],
        "recommend": lambda out: ["recommend", ranks, bench, "--no-store"],
        "export": lambda out: ["export", ranks, "--format", "csv", "-o", out],
        "merge": lambda out: ["merge", ranks, "-o", out],
    }

    def launch(processes, arguments, gradscope=args.gradscope):
        if processes == 1:
            return run([gradscope] + arguments, env=env)
        return run([args.mpirun, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np",
                    str(processes), gradscope] + arguments, env=env)

    # same
    expected = {}
    for name, arguments in commands.items():
        out = os.path.join(args.work, f"{name}-1.out")
        done = launch(1, arguments(out))
        check(done.returncode == 0, f"{name}, one process: exit {done.returncode}: {done.stderr.strip()}")
        expected[name] = (done.stdout, rows(out) if name == "merge" else
                          open(out).read() if name == "export" else None)
    for processes in counts:
        for name, arguments in commands.items():
            out = os.path.join(args.work, f"{name}-{processes}.out")
            done = launch(processes, arguments(out))
            what = f"{name}, {processes} processes"
            check(done.returncode == 0, f"{what}: exit {done.returncode}: {done.stderr.strip()}")
            stdout, content = expected[name]
            if name == "merge":
                # The summary line names the output file.
                check(done.stdout.replace(out, "OUT") == stdout.replace(
                    os.path.join(args.work, "merge-1.out"), "OUT"), f"{what}: summary differs")
                check(rows(out) == content, f"{what}: the merged file's rows differ from one process's")
            else:
                check(done.stdout == stdout, f"{what}: standard output differs from one process's")
            if name == "export":
                check(open(out).read() == content, f"{what}: the export differs from one process's")
        print(f"same: {processes} processes: report, recommend, export and merge as one process")

    # bad: rank-6.db, the 8th input in name order (rank-0, rank-1, rank-10, rank-2, ...), read by process
    # 7 % K: a reader for K = 2, 3 and 4.
    bad_dir = os.path.join(args.work, "bad")
    shutil.copytree(ranks, bad_dir)
    with open(os.path.join(bad_dir, "rank-6.db"), "w") as spoiled:
        spoiled.write("not a trace\n")
    one = launch(1, ["report", bad_dir])
    one_line = one.stderr.strip()
    check(one.returncode != 0 and len(one_line.splitlines()) == 1 and "rank-6.db" in one_line,
          f"bad, one process: exit {one.returncode}, stderr {one_line!r}")
    for processes in counts:
        for name in ("report", "merge"):
            out = os.path.join(args.work, f"bad-{processes}.db")
            done = launch(processes, ["report", bad_dir] if name == "report" else ["merge", bad_dir, "-o", out])
            what = f"bad {name}, {processes} processes"
            check(done.returncode != 0, f"{what}: exit 0")
            check(one_line in done.stderr.splitlines(), f"{what}: stderr {done.stderr.strip()!r}")
            check(done.stderr.count("gradscope:") == 1, f"{what}: not one line: {done.stderr.strip()!r}")
            check(done.stdout == "", f"{what}: printed {done.stdout!r}")
            check(not os.path.exists(out), f"{what}: left {out}")
        print(f"bad: {processes} processes: {one_line}")
    check(os.listdir(tmp) == [], f"temporary files left in TMPDIR: {os.listdir(tmp)}")

    # alone
    lone = os.path.join(args.work, "lone")
    os.makedirs(lone)
    shutil.copy2(args.gradscope, lone)
    done = launch(2, ["report", ranks], gradscope=os.path.join(lone, os.path.basename(args.gradscope)))
    check(done.returncode == 0, f"alone: exit {done.returncode}: {done.stderr.strip()}")
    check(done.stdout == expected["report"][0], "alone: the report differs from one process's")
    check(done.stderr.count("gradscope-mpi") == 1 and "not part of this build" in done.stderr,
          f"alone: stderr {done.stderr.strip()!r}")
    print("alone: " + done.stderr.strip())

    # nested. Each rank keeps its child's report in a file of its own: mpirun forwards the two ranks'
    # stdout in chunks, which interleave when the children finish together.
    nested = os.path.join(args.work, "nested")
    os.makedirs(nested)
    child = ("import os, subprocess, sys\n"
             "from mpi4py import MPI\n"
             "done = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=120)\n"
             "with open(os.path.join(sys.argv[1], f'rank-{MPI.COMM_WORLD.Get_rank()}.out'), 'w') as out:\n"
             "    out.write(done.stdout)\n"
             "sys.stderr.write(done.stderr)\n"
             "sys.exit(done.returncode)\n")
    done = run([args.mpirun, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "2",
                "/usr/bin/python3", "-c", child, nested, args.gradscope, "report", ranks], env=env)
    check(done.returncode == 0, f"nested: exit {done.returncode}: {done.stderr.strip()[-600:]}")
    for rank in range(2):
        with open(os.path.join(nested, f"rank-{rank}.out")) as out:
            check(out.read() == expected["report"][0],
                  f"nested: rank {rank}'s child did not print the whole report")
    print("nested: each rank's child read the rank files alone")

    # wrapped
    done = run([args.mpirun, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "2", "bash", "-c",
                '"$0" report "$1"', args.gradscope, ranks], env=env)
    check(done.returncode == 0, f"wrapped: exit {done.returncode}: {done.stderr.strip()[-600:]}")
    check(done.stdout == expected["report"][0], "wrapped: the report differs from one process's")
    print("wrapped: split through bash -c, the report printed once")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
