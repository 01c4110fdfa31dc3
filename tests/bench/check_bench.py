#!/usr/bin/python3
"""End-to-end checks of `gradscope bench` (the installed command, not the library).

  check_bench.py --gradscope G --mpiexec M --np N --workdir DIR mpi   # CSV, JSON and trace of an N-rank run
  check_bench.py --gradscope G --workdir DIR local                    # local sums, count-0 row, fp16
  check_bench.py --gradscope G [--mpiexec M] --workdir DIR errors     # bad arguments: exit 2, one line

Bounds on rel_err follow docs/methods.md: an N-term sum rounds at most N times per element in the
precision it adds in (unit roundoff u: fp32 2^-24, fp16 2^-11, bf16 2^-8, fp8 e4m3 2^-4, e5m2 2^-3), each
rounding at most u times the magnitude of a partial sum, which is at most Σ|x|; bench's random inputs
(0.5·shared + own, uniform) have ||Σ|x| ||/||Σx|| < 1.6 for up to 8 terms, so rel_err <= 2·N·u.
Exits 0 when every check passes, 1 with one "check_bench: FAIL: ..." line per failed check.
"""

import argparse
import csv
import io
import json
import math
import os
import pty
import shutil
import sqlite3
import subprocess
import sys

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp8e4m3": 2.0**-4, "fp8e5m2": 2.0**-3}
WIRES = ("fp16", "bf16", "fp8e4m3", "fp8e5m2")
ELEMENT_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2}
# The sweep every run here uses: -b 8 -e 64K -f 8.
SWEEP = ["-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1"]
SWEEP_SIZES = [8, 64, 512, 4096, 32768]
TERMS_LOCAL = 8  # -k's default: the inputs a local sum adds

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    return result.returncode, result.stdout, result.stderr


def mpi_command(args, np, gradscope_args):
    return [args.mpiexec, "--quiet", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", str(np),
            args.gradscope, "bench"] + gradscope_args


def must_succeed(command):
    code, out, err = run(command)
    if not check(code == 0, f"exit {code} from {' '.join(command)}: {err.strip()[-2000:]}"):
        return None
    return out


def lossless(strategy):
    """sum/<transport> without a wire part is bit-exact on verifiable inputs (strategy.h)."""
    parts = strategy.split("/")
    return parts[0] in ("sum", "local") and (len(parts) < 3 or parts[2] not in WIRES)


def rel_err_bound(strategy, terms):
    parts = strategy.split("/")
    if parts[0] == "adasum":
        return 0.0  # bit-identical to methods::adasum, the reference (strategy.h)
    wire = parts[2] if len(parts) == 3 and parts[2] in WIRES else "fp32"
    return 2.0 * terms * UNIT_ROUNDOFF[wire]


def check_points(rows, ranks, dtype, label):
    """Properties every CSV row must have; returns {(strategy, bytes): row}."""
    points = {}
    element = ELEMENT_BYTES[dtype]
    for row in rows:
        key = (row["strategy"], int(row["bytes"]))
        where = f"{label}: {key[0]} {key[1]} B"
        check(key not in points, f"{where}: measured twice")
        points[key] = row
        check(int(row["ranks"]) == ranks, f"{where}: ranks {row['ranks']}, expected {ranks}")
        check(row["dtype"] == dtype, f"{where}: dtype {row['dtype']}, expected {dtype}")
        check(int(row["count"]) * element == int(row["bytes"]), f"{where}: count {row['count']} is not bytes/{element}")
        tmin, tmed, tmax = (float(row[f"time_{k}_us"]) for k in ("min", "median", "max"))
        check(0 < tmin <= tmed <= tmax, f"{where}: times min {tmin} median {tmed} max {tmax} out of order")
        algbw, busbw = float(row["algbw_gbs"]), float(row["busbw_gbs"])
        check(math.isclose(algbw, int(row["bytes"]) / (tmed * 1e3), rel_tol=1e-9, abs_tol=1e-12),
              f"{where}: algbw {algbw} is not bytes / median time")
        if not row["strategy"].startswith("local/"):
            factor = 2.0 * (ranks - 1) / ranks
            check(math.isclose(busbw, algbw * factor, rel_tol=1e-9, abs_tol=1e-12),
                  f"{where}: busbw {busbw} is not algbw·2(n-1)/n = {algbw * factor}")
        if lossless(row["strategy"]):
            check(row["wrong"] == "0", f"{where}: #wrong is '{row['wrong']}', expected 0 (bit-exact)")
        else:
            check(row["wrong"] == "", f"{where}: #wrong is '{row['wrong']}' for a lossy strategy, expected empty")
        terms = ranks if not row["strategy"].startswith("local/") else TERMS_LOCAL
        bound = rel_err_bound(row["strategy"], terms)
        rel_err = float(row["rel_err"])
        check(rel_err <= bound, f"{where}: rel_err {rel_err} above its bound {bound}")
        check(row["overflow"] == "0" and row["nan"] == "0", f"{where}: overflow {row['overflow']}, nan {row['nan']}")
    return points


def check_full_grid(points, sizes, label, expected=None):
    strategies = sorted({strategy for strategy, _ in points})
    if expected is not None:
        check(set(expected) <= set(strategies), f"{label}: missing strategies {sorted(set(expected) - set(strategies))}")
    for strategy in strategies:
        for size in sizes:
            check((strategy, size) in points, f"{label}: no row for {strategy} at {size} B")
    check(len(points) == len(strategies) * len(sizes), f"{label}: {len(points)} rows, expected strategies × sizes")
    return strategies


def parse_csv(text):
    return list(csv.DictReader(io.StringIO(text)))


def check_mpi(args):
    ranks = args.np
    label = f"mpi np={ranks}"
    out = must_succeed(mpi_command(args, ranks, ["--backend", "mpi", "--csv"] + SWEEP))
    if out is None:
        return
    csv_points = check_points(parse_csv(out), ranks, "float", label)
    strategies = check_full_grid(csv_points, SWEEP_SIZES, label,
                                 ["sum/native", "sum/rs_ag", "sum/reduce_bcast", "adacons/native", "adacons/rs_ag",
                                  "adasum/native"])

    # JSON and the trace file of one run carry the same points as the CSV run.
    trace = os.path.join(args.workdir, f"bench-np{ranks}.db")
    if os.path.exists(trace):
        os.remove(trace)
    out = must_succeed(mpi_command(args, ranks, ["--backend", "mpi", "--json", "-o", trace] + SWEEP))
    if out is None:
        return
    document = json.loads(out)
    check(document["world_size"] == ranks and document["backend"] == "mpi", f"{label}: JSON header {document}")
    json_points = {(p["strategy"], p["bytes"]): p for p in document["points"]}
    check(set(json_points) == set(csv_points), f"{label}: JSON points differ from the CSV run's")
    for key, point in json_points.items():
        check(math.isclose(point["busbw_gbs"], point["algbw_gbs"] * 2.0 * (ranks - 1) / ranks, rel_tol=1e-9,
                           abs_tol=1e-12), f"{label}: JSON {key}: busbw")
        check((point["wrong"] == 0) == lossless(key[0]), f"{label}: JSON {key}: wrong {point['wrong']}")

    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    runs = db.execute("SELECT mode, world_size, command, tool_version FROM runs").fetchall()
    check(len(runs) == 1 and runs[0][0] == "bench" and runs[0][1] == ranks, f"{label}: runs table {runs}")
    check(db.execute("SELECT COUNT(*) FROM ranks").fetchone()[0] == ranks, f"{label}: not {ranks} rank rows")
    rows = db.execute("SELECT strategy, bytes, world, reps, min_ns, median_ns, max_ns, busbw_gbs, rel_l2_error "
                      "FROM measurements").fetchall()
    trace_points = {(r[0], r[1]): r for r in rows}
    check(set(trace_points) == set(json_points), f"{label}: trace measurements differ from the JSON points")
    for key, r in trace_points.items():
        point = json_points.get(key)
        if point is None:
            continue
        check(r[2] == ranks and r[3] == 3, f"{label}: trace {key}: world {r[2]}, reps {r[3]}")
        # The trace holds each rank's median call (the table and time_us: each rank's average call).
        check(math.isclose(r[5], point["median_call_us"]["median"] * 1e3, rel_tol=1e-9),
              f"{label}: trace {key}: median")
        check(r[4] <= r[5] <= r[6], f"{label}: trace {key}: min/median/max {r[4:7]}")
        check(math.isclose(r[7], point["busbw_gbs"], rel_tol=1e-9, abs_tol=1e-12), f"{label}: trace {key}: busbw")
    db.close()

    # The trace is a normal gradscope file: report reads it, export lists its measurements.
    must_succeed([args.gradscope, "report", trace])
    out = must_succeed([args.gradscope, "export", trace, "--format", "csv", "--table", "measurements", "-o", "-"])
    if out is not None:
        check(len(parse_csv(out)) == len(json_points), f"{label}: export lists {len(parse_csv(out))} measurements")
    print(f"check_bench: {label}: {len(strategies)} strategies × {len(SWEEP_SIZES)} sizes checked")
    if ranks == 2:
        check_progress(args)


def run_on_terminal(command):
    """Runs `command` with a pseudo-terminal as stdout and a pipe as stderr, as a user at a terminal runs
    mpirun; returns (exit code, what reached the terminal, stderr)."""
    main, secondary = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=secondary, stderr=subprocess.PIPE)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    err = process.stderr.read().decode(errors="replace")
    process.wait(timeout=300)
    return process.returncode, b"".join(chunks).decode(errors="replace"), err


def check_progress(args):
    """Under mpirun at a terminal the progress line shows (Open MPI gives a rank's stdout a pty but its
    stderr a pipe), reaches every point, and is erased before each table line; --no-progress draws none."""
    label = "mpi progress"
    sweep = ["--backend", "mpi", "--strategies", "sum/native,sum/rs_ag", "-b", "8", "-e", "64", "-f", "8",
             "-n", "2", "-w", "1"]
    code, shown, err = run_on_terminal(mpi_command(args, 2, sweep))
    if not check(code == 0, f"{label}: exit {code}: {err.strip()[-2000:]}"):
        return
    erase = "\r\x1b[K"
    check(erase in shown and "] 4/4 sum/rs_ag 64 B" in shown,
          f"{label}: no progress line reaching 4/4 on the terminal: {shown!r}")
    # What stays on the screen: each erase sequence wipes the progress drawn before it.
    screen = []
    for line in shown.replace("\r\n", "\n").split("\n"):
        screen.append(line.split(erase)[-1])
    rows = [line for line in screen if line.lstrip().startswith(("sum/native ", "sum/rs_ag "))]
    check(len(rows) == 4 and not any("[" in row for row in rows), f"{label}: table rows on the screen {rows}")
    code, shown, err = run_on_terminal(mpi_command(args, 2, sweep + ["--no-progress"]))
    check(code == 0 and erase not in shown and "] 4/4" not in shown,
          f"{label}: --no-progress: exit {code}, progress drawn anyway: {shown!r}")


def check_local(args):
    # -b 1: the first size holds no whole element, a count-0 row (nccl-tests prints it too).
    out = must_succeed([args.gradscope, "bench", "--backend", "local", "--csv", "-b", "1", "-e", "64K", "-f", "8",
                        "-n", "3", "-w", "1"])
    if out is not None:
        rows = parse_csv(out)
        zero = [row for row in rows if row["bytes"] == "0"]
        check(len(zero) == 4 and all(row["count"] == "0" and row["wrong"] == "0" for row in zero),
              f"local: count-0 rows {zero}")
        timed = [row for row in rows if row["bytes"] != "0"]
        points = check_points(timed, 1, "float", "local")
        check_full_grid(points, SWEEP_SIZES, "local", ["local/add_n", "local/tree", "local/accumulate_n", "local/kahan"])
    # fp16: verifiable inputs stay exact; the JSON document parses.
    out = must_succeed([args.gradscope, "bench", "--backend", "local", "--json", "-d", "half"] + SWEEP)
    if out is not None:
        document = json.loads(out)
        check(document["dtype"] == "half", "local half: dtype")
        for point in document["points"]:
            check(point["wrong"] == 0 and point["count"] * 2 == point["bytes"], f"local half: {point}")
    print("check_bench: local checked")


def check_errors(args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))}
    # (name, command, a fragment the line must hold, or None)
    cases = [
        ("unknown strategy", [args.gradscope, "bench", "--backend", "local", "--strategies", "sum/bogus"], None),
        ("unknown local sum", [args.gradscope, "bench", "--backend", "local", "--strategies", "local/bogus"], None),
        ("inverted sizes", [args.gradscope, "bench", "--backend", "local", "-b", "1M", "-e", "64K"], None),
        ("unknown dtype", [args.gradscope, "bench", "--backend", "local", "-d", "int8"], None),
        ("-f and -i", [args.gradscope, "bench", "--backend", "local", "-f", "4", "-i", "8"], None),
        # Without MPI in the build, the line says that instead of how to launch.
        ("no launcher", [args.gradscope, "bench", "--backend", "mpi"],
         "mpirun -np N gradscope bench --backend mpi" if args.mpiexec else None),
        # The name's fault comes first, not the launcher or the GPU it would need.
        ("unknown strategy, no launcher", [args.gradscope, "bench", "--backend", "mpi", "--strategies",
                                           "sum/native,sum/bogus"], "'sum/bogus'"),
        ("local sum on mpi, no launcher", [args.gradscope, "bench", "--backend", "mpi", "--strategies",
                                           "local/add_n"], "local/add_n is a local sum"),
        ("unknown strategy, nccl", [args.gradscope, "bench", "--backend", "nccl", "--strategies", "sum/bogus"],
         "'sum/bogus'"),
    ]
    if args.mpiexec:
        cases += [
            ("fp16 wire on double", mpi_command(args, 2, ["--backend", "mpi", "-d", "double", "--strategies",
                                                          "sum/native/fp16", "-b", "8", "-e", "8"]), None),
            ("unknown strategy, 2 ranks",
             mpi_command(args, 2, ["--backend", "mpi", "--strategies", "sum/bogus"]), None),
        ]
    for name, command, fragment in cases:
        code, out, err = run(command, env)
        if fragment is not None:
            check(fragment in err, f"errors: {name}: the line does not say {fragment!r}: {err}")
        lines = err.splitlines()
        check(code == 2, f"errors: {name}: exit {code}, expected 2")
        check(len(lines) == 1 and lines[0].startswith("gradscope bench: "),
              f"errors: {name}: stderr is not one 'gradscope bench: ' line: {lines}")
        check(out == "", f"errors: {name}: wrote to stdout: {out[:200]}")

    # NCCL: a sweep where a GPU is, else one line with the reason.
    code, out, err = run([args.gradscope, "bench", "--backend", "nccl", "-b", "8", "-e", "8", "-n", "1", "-w", "0"],
                         env)
    check(code == 0 or (code == 2 and len(err.splitlines()) == 1 and err.startswith("gradscope bench: --backend nccl")),
          f"errors: --backend nccl: exit {code}, stderr {err!r}")

    # gradscope without gradscope-bench next to it: one line, exit 2.
    lonely = os.path.join(args.workdir, "lonely")
    os.makedirs(lonely, exist_ok=True)
    shutil.copy2(args.gradscope, os.path.join(lonely, "gradscope"))
    code, out, err = run([os.path.join(lonely, "gradscope"), "bench"], env)
    check(code == 2 and len(err.splitlines()) == 1 and "gradscope-bench" in err,
          f"errors: missing gradscope-bench: exit {code}, stderr {err!r}")
    print(f"check_bench: {len(cases) + 2} error cases checked")


SKIP = 77  # ctest SKIP_RETURN_CODE


def check_nccl(args):
    """One NCCL rank: every NCCL strategy checked like the MPI ones; skipped (77) without a usable GPU."""
    code, out, err = run([args.gradscope, "bench", "--backend", "nccl", "--csv"] + SWEEP)
    # Only the absence of a GPU skips (every such reason starts "no usable GPU", methods/src/cuda/runtime.cu):
    # an NCCL or CUDA failure on a machine with one is a failure, whatever its line names.
    if code == 2 and len(err.strip().splitlines()) == 1 and "no usable GPU" in err:
        print(f"check_bench: SKIP: {err.strip()}")
        return SKIP
    if not check(code == 0, f"exit {code} from gradscope bench --backend nccl: {err.strip()[-2000:]}"):
        return None
    points = check_points(parse_csv(out), 1, "float", "nccl np=1")
    strategies = ["sum/native", "sum/rs_ag", "adacons/native", "adasum/native"]
    check_full_grid(points, SWEEP_SIZES, "nccl np=1", strategies)
    if not failures:
        print(f"check_bench: nccl np=1: {len(points)} points of {len(strategies)} strategies × {len(SWEEP_SIZES)} "
              "sizes checked")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradscope", required=True)
    parser.add_argument("--mpiexec")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("mode", choices=["mpi", "local", "errors", "nccl"])
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    status = {"mpi": check_mpi, "local": check_local, "errors": check_errors, "nccl": check_nccl}[args.mode](args)
    if status == SKIP and not failures:
        return SKIP
    for failure in failures:
        print(f"check_bench: FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
