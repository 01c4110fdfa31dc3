#!/usr/bin/env python3
"""`gradscope recommend --format ompi-rules` checked against Open MPI itself.

For a job of --np ranks:

1. gradscope-synth --bench writes a benchmark trace in which sum/mpi.ring wins from 1 KiB to 16 KiB and
   sum/mpi.recursive_doubling from 256 KiB to 4 MiB (both are Open MPI's own choice at none or few of those
   sizes on 2 to 4 ranks, so the file has something to change); `gradscope recommend` makes the
   recommendation (--format json, the truth the file is checked against) and the rules file (--format
   ompi-rules -o), whose stderr must name the two variables that load it.
2. tests/ompi_rules/allreduce-sizes runs fp32 sums at sizes inside each rule, on their edges, between and
   outside them, on MPI_COMM_WORLD and (3 ranks or more) on a communicator one rank smaller; once without
   the variables (Open MPI's own decisions) and once with them, with algorithm-spy preloaded and
   --mca coll_base_verbose 9.
3. Checked, for every call of every rank:
   - the algorithm that ran (algorithm-spy: the coll_base function coll_tuned called) is the recommendation's
     where a rule covers the call (api, bytes, communicator size = the rule's world size), and otherwise
     the one Open MPI chose without the file for the same communicator size and bytes;
   - a call the file decided was run by that algorithm itself, not handed to another (no fallback line);
   - at least one size of each rule runs another algorithm than Open MPI's own choice (else nothing is shown);
   - every result is exact (the job compares every element);
   - Open MPI's MPI_T control variables, read inside the job, hold the two values the variables set;
   - Open MPI's own output (coll_base_verbose 9): coll/tuned is the enabled component of highest priority
     on every communicator of the job (the all-reduce is tuned's to decide, so the file is consulted).
   With 3 or more ranks the same again with a file made for one rank fewer: there the rules act on the
   smaller communicator and MPI_COMM_WORLD keeps Open MPI's own decisions. And once with a recommendation
   Open MPI cannot express (sum/rs_ag wins): its file changes nothing, says so, and every call runs what
   Open MPI chooses alone.

Open MPI 4.1 release builds say nothing about the rules file (its reader and decision messages are
OPAL_OUTPUT, compiled into --enable-debug builds only, and a file it cannot read is ignored silently), hence
algorithm-spy. Exit status 0 when every check passes, 1 otherwise.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# Inside, on the edges of, between and outside the two rules (fp32: multiples of 4).
SIZES = [256, 1024, 4096, 16384, 16388, 65536, 262144, 1048576, 4194304, 4194308, 8388608]
WINS = ["sum/mpi.ring=1K..16K", "sum/mpi.recursive_doubling=256K..4M"]
VARIABLES = ("OMPI_MCA_coll_tuned_use_dynamic_rules", "OMPI_MCA_coll_tuned_dynamic_rules_filename")

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print(f"check_ompi_rules: FAIL {message}", flush=True)
    return condition


def run(command, env=None, timeout=300):
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return result


def mpirun(args, np, options, env_vars, spy_dir):
    """mpiexec with np ranks on however many cores there are (oversubscribed, yielding while idle)."""
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    command = [args.mpiexec, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", str(np)] + options
    # -x passes a variable to the ranks whatever the launcher's environment handling.
    for name, value in list(env_vars.items()) + [("ALGORITHM_SPY_DIR", spy_dir), ("LD_PRELOAD", args.spy)]:
        command += ["-x", f"{name}={value}"]
    command += [args.job] + [str(size) for size in SIZES]
    return run(command, env=env)


def spy_records(spy_dir):
    """{(rank, comm_size, bytes): [(kind, algorithm), ...]} from algorithm-spy's files."""
    records = {}
    pattern = re.compile(r"^algorithm-spy: rank (\d+) comm_size (\d+) bytes (\d+) (algorithm|fallback) (\w+)$")
    for name in sorted(os.listdir(spy_dir)):
        with open(os.path.join(spy_dir, name)) as file:
            for line in file:
                match = pattern.match(line.strip())
                if not check(match, f"unexpected algorithm-spy line {line.strip()!r}"):
                    continue
                rank, size, nbytes = int(match[1]), int(match[2]), int(match[3])
                records.setdefault((rank, size, nbytes), []).append((match[4], match[5]))
    return records


def expected_calls(np):
    """Every (rank, comm_size, bytes) the job makes."""
    calls = []
    for rank in range(np):
        for nbytes in SIZES:
            calls.append((rank, np, nbytes))
            if np >= 3 and rank < np - 1:
                calls.append((rank, np - 1, nbytes))
    return calls


def run_job(args, np, label, env_vars):
    spy_dir = os.path.join(args.workdir, f"spy-{label}")
    shutil.rmtree(spy_dir, ignore_errors=True)
    os.makedirs(spy_dir)
    result = mpirun(args, np, ["--mca", "coll_base_verbose", "9"], env_vars, spy_dir)
    with open(os.path.join(args.workdir, f"{label}.out"), "w") as file:
        file.write(f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")
    check(result.returncode == 0, f"{label}: the job exited {result.returncode}: {result.stdout[-2000:]} "
                                  f"{result.stderr[-2000:]}")
    check("every result exact" in result.stdout, f"{label}: not every all-reduce result was exact:\n"
                                                 f"{result.stdout[-2000:]}")
    return result, spy_records(spy_dir)


def cvars(stdout):
    return dict(re.findall(r"^cvar (\w+)=(.*)$", stdout, re.MULTILINE))


def check_tuned_selected(label, stderr, np):
    """Open MPI's coll_base_verbose output: coll/tuned is the enabled component of highest priority on every
    communicator of every rank but MPI_COMM_SELF (coll/self's)."""
    current = {}  # process -> communicator being selected
    enabled = {}  # (process, communicator) -> [(priority, component)]
    for line in stderr.splitlines():
        match = re.match(r"^\[([^\]]+)\] coll:base:comm_select: new communicator: (.*) \(cid \d+\)$", line)
        if match:
            current[match[1]] = match[2]
            continue
        match = re.match(r"^\[([^\]]+)\] coll:base:comm_select: selecting\s+(\w+), priority\s+(-?\d+), Enabled$",
                         line)
        if match and match[1] in current:
            enabled.setdefault((match[1], current[match[1]]), []).append((int(match[3]), match[2]))
    checked = 0
    for (process, comm), components in sorted(enabled.items()):
        if comm == "MPI_COMM_SELF":
            continue
        top = max(components)
        check(top[1] == "tuned", f"{label}: on {process} {comm} the all-reduce is {top[1]}'s "
                                 f"(priority {top[0]}), not coll/tuned's: the rules file is not consulted")
        checked += 1
    communicators = np + (np - 1 if np >= 3 else 0)
    check(checked >= communicators, f"{label}: coll_base_verbose showed the selection on {checked} "
                                    f"communicators, expected {communicators}")
    return checked


def make_files(args, world, wins, name):
    """The benchmark trace with these winners, the recommendation and the rules file for `world` ranks."""
    trace = os.path.join(args.workdir, f"bench-{name}.db")
    plan = os.path.join(args.workdir, f"plan-{name}.json")
    rules = os.path.join(args.workdir, f"rules-{name}.conf")
    for path in (trace, plan, rules):
        if os.path.exists(path):
            os.remove(path)
    command = [args.synth, "--bench", trace, "--ranks", str(world)]
    for win in wins:
        command += ["--wins", win]
    result = run(command)
    if not check(result.returncode == 0, f"gradscope-synth failed: {result.stdout} {result.stderr}"):
        return None
    result = run([args.gradscope, "recommend", trace, "--format", "json", "-o", plan, "--no-store"])
    if not check(result.returncode == 0, f"recommend --format json failed: {result.stderr}"):
        return None
    # Run from another directory: the variables must name the file by absolute path.
    result = subprocess.run([args.gradscope, "recommend", os.path.basename(trace), "--format", "ompi-rules", "-o",
                             os.path.basename(rules), "--no-store"], cwd=args.workdir, capture_output=True,
                            text=True, timeout=120)
    if not check(result.returncode == 0, f"recommend --format ompi-rules failed: {result.stderr}"):
        return None
    absolute = os.path.realpath(rules)
    check(f"{VARIABLES[0]}=1\n" in result.stderr and f"{VARIABLES[1]}={absolute}\n" in result.stderr,
          f"recommend's stderr does not name the two variables with {absolute}: {result.stderr!r}")
    with open(plan) as file:
        recommendation = json.load(file)
    strategies = sorted({rule["strategy"] for rule in recommendation["rules"]})
    expected = sorted({win.split("=")[0] for win in wins})
    check(strategies == expected, f"the synthetic benchmark's recommendation has the rules {strategies}, "
                                  f"expected {expected}")
    return recommendation, absolute


def chosen(recommendation, comm_size, nbytes):
    """The Open MPI algorithm the recommendation chose for an MPI_Allreduce, or None (Open MPI's own)."""
    for rule in recommendation["rules"]:
        if (rule["api"] == "MPI_Allreduce" and rule.get("world_size", comm_size) == comm_size
                and rule["min_bytes"] <= nbytes <= rule["max_bytes"] and rule["strategy"].startswith("sum/mpi.")):
            return rule["strategy"][len("sum/mpi."):], rule
    return None, None


def check_rules_run(args, np, world, default, wins=WINS, name=None):
    """The job on np ranks with the file made for `world` ranks from a benchmark with these winners."""
    name = name or f"rules{world}"
    made = make_files(args, world, wins, name)
    if made is None:
        return
    recommendation, rules_path = made
    label = f"np{np}-{name}"
    result, records = run_job(args, np, label, {VARIABLES[0]: "1", VARIABLES[1]: rules_path})
    values = cvars(result.stdout)
    check(values.get("coll_tuned_use_dynamic_rules") == "true",
          f"{label}: MPI_T coll_tuned_use_dynamic_rules is {values.get('coll_tuned_use_dynamic_rules')}")
    check(values.get("coll_tuned_dynamic_rules_filename") == rules_path,
          f"{label}: MPI_T coll_tuned_dynamic_rules_filename is {values.get('coll_tuned_dynamic_rules_filename')}")
    communicators = check_tuned_selected(label, result.stderr, np)

    print(f"\n{label}: {np} ranks, rules file for {world} ranks ({rules_path}); MPI_T: "
          f"coll_tuned_use_dynamic_rules={values.get('coll_tuned_use_dynamic_rules')}, "
          f"coll_tuned_dynamic_rules_filename={values.get('coll_tuned_dynamic_rules_filename')}; "
          f"coll_base_verbose: coll/tuned selected on {communicators} communicators")
    print(f"  {'ranks':>5} {'bytes':>8}  {'Open MPI alone':<20} {'with the file':<20} {'expected':<20} rule")
    differs = {}  # rule index -> whether some size ran another algorithm than Open MPI alone
    for rank, comm_size, nbytes in expected_calls(np):
        entries = records.get((rank, comm_size, nbytes), [])
        ran = [name for kind, name in entries if kind == "algorithm"]
        alone = [name for kind, name in default.get((rank, comm_size, nbytes), []) if kind == "algorithm"]
        if not check(len(ran) == 1 and len(alone) == 1,
                     f"{label}: rank {rank} comm_size {comm_size} bytes {nbytes}: algorithm-spy saw {entries} "
                     f"with the file and {alone} without (one call each expected)"):
            continue
        algorithm, rule = chosen(recommendation, comm_size, nbytes)
        expected = algorithm or alone[0]
        check(ran[0] == expected, f"{label}: rank {rank} comm_size {comm_size} bytes {nbytes} ran {ran[0]}, "
                                  f"expected {expected} ({'the file' if algorithm else 'Open MPI alone'})")
        if algorithm:
            index = recommendation["rules"].index(rule)
            differs[index] = differs.get(index, False) or alone[0] != algorithm
            check(all(kind == "algorithm" for kind, _ in entries),
                  f"{label}: rank {rank} comm_size {comm_size} bytes {nbytes}: {algorithm} handed the call on: "
                  f"{entries}")
        if rank == 0:
            where = (f"{rule['min_bytes']}..{rule['max_bytes']} B -> {rule['strategy']}" if rule else "-")
            print(f"  {comm_size:>5} {nbytes:>8}  {alone[0]:<20} {ran[0]:<20} {expected:<20} {where}")
    # Every rule is for `world` ranks, a communicator size of this job.
    for index, rule in enumerate(recommendation["rules"]):
        if not rule["strategy"].startswith("sum/mpi."):
            continue
        check(differs.get(index, False),
              f"{label}: rule {rule['min_bytes']}..{rule['max_bytes']} -> {rule['strategy']} ran what Open MPI "
              f"chooses alone at every size tested: the test shows nothing for it")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradscope", required=True)
    parser.add_argument("--synth", required=True, help="gradscope-synth")
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--job", required=True, help="allreduce-sizes")
    parser.add_argument("--spy", required=True, help="algorithm-spy.so")
    parser.add_argument("--np", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    args.workdir = os.path.realpath(args.workdir)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)

    result, default = run_job(args, args.np, f"np{args.np}-alone", {})
    values = cvars(result.stdout)
    check(values.get("coll_tuned_use_dynamic_rules") == "false",
          f"without the variables MPI_T coll_tuned_use_dynamic_rules is {values.get('coll_tuned_use_dynamic_rules')}")
    check_rules_run(args, args.np, args.np, default)
    if args.np >= 3:
        check_rules_run(args, args.np, args.np - 1, default)
    # No rule Open MPI can express (sum/rs_ag is gradscope's own): a file that changes nothing, and says so.
    check_rules_run(args, args.np, args.np, default, ["sum/rs_ag=1K..16K"], "nothing")
    with open(os.path.join(args.workdir, "rules-nothing.conf")) as file:
        check("this file changes nothing" in file.read(), "the file without Open MPI rules does not say so")

    if failures:
        print(f"\ncheck_ompi_rules: {len(failures)} failures (outputs in {args.workdir})")
        return 1
    print(f"\ncheck_ompi_rules: OK ({args.np} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
