#!/usr/bin/python3
"""The agent never breaks the job: the adversarial job (adversarial.c, adversarial.py) under every mode.

  check_adversarial.py TOOLS --workdir DIR --np N c [--level LEVEL]   the C job (MPI_Init_thread at LEVEL,
                                                                       multiple by default)
  check_adversarial.py TOOLS --workdir DIR --np N python               the mpi4py job
  [--modes observe,explore,apply-native,...]                           a subset of the modes (all by default;
                                                                       under a sanitizer four of them)

TOOLS: --agent SO --gradscope EXE --mpiexec EXE --adversarial EXE --python /usr/bin/python3
--adversarial-py PY.

The job runs once plain, then under the agent in each mode: observe; explore (--explore-budget 1, every
size explored at its first call); apply with a plan that covers every MPI all-reduce of fp32 and fp64 (all
sizes) with each lossless strategy family: sum/native, sum/rs_ag, sum/reduce_bcast, sum/hier and
sum/mpi.ring. Each run must
  - end with the plain run's exit code, within the timeout (a hang fails);
  - print the plain run's output, byte for byte (its lines sorted: ranks write concurrently), which
    includes the thread level MPI reports before and after and every result;
  - leave a trace whose calls per rank and API are the ones the job says it made (its last line), with
    nothing lost ("Dropped events": none of the kinds that lose calls), readable by gradscope report; the
    C job's spawned process (MPI_Comm_spawn) in a run of its own that names the job's run;
  - count, in explore and apply, the all-reduces left untouched (runs.config_json agent.shadow.untouched):
    on intercommunicators, with invalid arguments, on communicators of one rank (single_rank), and at
    MPI_THREAD_MULTIPLE on the duplicate MPI_Comm_idup made (not prepared: the agent does not see it made),
    as many as the job made;
  - apply: have replaced the job's sums on MPI_COMM_WORLD (applied_calls);
  - print gradscope's lines, if any, each at the start of a line of stderr.
Exits 0 when every check passes, 1 with one line per failure.
"""

import json
import os
import sqlite3
import sys
import uuid
from collections import Counter, defaultdict

import check_agent as ca
from check_agent import check, tail
from sanitizers import sanitizer_runtime
from stderr_lines import misplaced_agent_lines

TIMEOUT = 180  # seconds per run: a hang fails the test (plain runs take 1-3 s, explore up to a minute)

FAMILIES = ["native", "rs_ag", "reduce_bcast", "hier", "mpi.ring"]
MODES = ["observe", "explore"] + [f"apply-{family}" for family in FAMILIES]
# Under a sanitizer (an ASan or TSan agent) each run is several times slower: the agent's paths are
# covered by observe, explore, and apply with one plain and one engine family (the others differ in
# the comm library's transports only, which the ci preset covers).
SANITIZER_MODES = ["observe", "explore", "apply-rs_ag", "apply-mpi.ring"]
# Calls explore and apply must leave to the library, per job and rank: the all-reduces on the
# intercommunicator (blocking fp32 and fp64, nonblocking fp32), the C job's negative count, and those on
# communicators of one rank (MPI_COMM_SELF, a split of one, and at 3 ranks the threads case's odd part on
# rank 1: the job counts them). At MPI_THREAD_MULTIPLE the agent prepares communicators when the job creates
# them: the duplicate MPI_Comm_idup makes, which it does not see, is left untouched (its one sum).
def untouched(kind, level, single):
    expected = {"intercommunicator": 3}
    if kind == "c":
        expected["invalid_arguments"] = 1
    if kind == "python" or level == "multiple":
        expected["not_prepared"] = 1
    if single:
        expected["single_rank"] = single
    return expected
LOSES_CALLS = {"call", "call_rate", "thread_buffer", "comm_table", "iallreduce_table", "recording_stopped"}


def plan(path, family):
    """A recommendation that replaces every fp32 and fp64 MPI all-reduce (any size) with sum/<family>."""
    rules = [{"api": api, "dtype": dtype, "min_bytes": 0, "max_bytes": 1 << 40, "strategy": f"sum/{family}",
              "error_class": "lossless", "evidence": 1}
             for api in ("MPI_Allreduce", "MPI_Iallreduce") for dtype in ("fp32", "fp64")]
    with open(path, "w") as file:
        json.dump({"format": "gradscope-recommendation", "version": 1, "backend": "mpi", "max_rel_error": 0,
                   "rules": rules}, file)
    return path


def mode_variables(args, mode):
    if mode == "observe":
        return {}
    if mode == "explore":
        return {"GRADSCOPE_MODE": "explore", "GRADSCOPE_EXPLORE_BUDGET": "1", "GRADSCOPE_EXPLORE_SAMPLES": "1",
                "GRADSCOPE_EXPLORE_WARMUP": "0", "GRADSCOPE_EXPLORE_REPS": "2",
                "GRADSCOPE_EXPLORE_WARMUP_REPS": "1", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}
    family = mode[len("apply-"):]
    return {"GRADSCOPE_MODE": "apply",
            "GRADSCOPE_RECOMMENDATION": plan(os.path.join(args.workdir, f"plan-{family}.json"), family),
            "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}


def sanitizer_variables(args):
    """What the sanitizers need for this job:
    - ASan: no leak check at exit: the job forks, and LeakSanitizer cannot suspend the parent's threads in a
      forked child (it aborts or hangs there, "Running thread ... was not suspended"). The agent's leaks are
      checked by the other agent tests; the Python job leaks by design anyway.
    - TSan: the memory accesses of intercepted functions ignored (their locking still tracked): at
      MPI_THREAD_MULTIPLE any thread inside MPI progresses every request, so Open MPI copies a message
      into another thread's receive buffer (a memcpy TSan charges to the copying thread) and hands it over
      with atomics TSan cannot see. The agent's own loads and stores are still checked."""
    runtime = sanitizer_runtime(args.agent)
    if runtime and "libasan" in runtime:
        return {"ASAN_OPTIONS": ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))}
    if runtime and "libtsan" in runtime:
        return {"TSAN_OPTIONS": ":".join(filter(None, [os.environ.get("TSAN_OPTIONS"),
                                                         "ignore_interceptors_accesses=1"]))}
    return {}


def expected_calls(out):
    """rank -> Counter(api -> calls) from the job's last lines."""
    expected = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "9999" and fields[2] == "calls":
            expected[int(fields[0][1:])] = Counter({k: int(v) for k, v in (f.split("=") for f in fields[3:])})
    return expected


def check_trace(args, merged, kind, mode, expected, label):
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    runs = [(run_id, uuid, json.loads(config)) for run_id, uuid, config in
            db.execute("SELECT id, uuid, config_json FROM runs ORDER BY id")]
    main = [run for run in runs if "spawned_by" not in run[2]]
    spawned = [run for run in runs if "spawned_by" in run[2]]
    if not check(len(main) == 1, f"{label}: {len(main)} runs besides the spawned ones, expected 1"):
        return
    run_id, uuid, config = main[0]
    if kind == "c":
        # The C job spawns one process, a run of its own that says which run started it.
        check([run[2]["spawned_by"] for run in spawned] == [uuid],
              f"{label}: spawned runs {[(run[1], run[2].get('spawned_by')) for run in spawned]}, expected one "
              f"spawned by {uuid}")
        for spawned_id, _, _ in spawned:
            calls = dict(db.execute("SELECT api, count(*) FROM call_view WHERE run_id = ? GROUP BY api",
                                    (spawned_id,)))
            check(calls == {"MPI_Allreduce": 1, "MPI_Bcast": 1}, f"{label}: the spawned process recorded {calls}")
    counts = defaultdict(Counter)
    for rank, api, n in db.execute("SELECT rank, api, count(*) FROM call_view WHERE run_id = ? GROUP BY rank, api",
                                   (run_id,)):
        counts[rank][api] = n
    on_world = dict(db.execute("SELECT rank, count(*) FROM call_view WHERE run_id = ? AND comm = 'world' "
                               "GROUP BY rank", (run_id,)))
    check(sorted(counts) == list(range(args.np)), f"{label}: calls from ranks {sorted(counts)}")
    for rank in range(args.np):
        want = Counter(expected.get(rank, Counter()))
        world = want.pop("world", 0)
        want.pop("single", 0)
        want = +want
        check(+counts[rank] == want, f"{label}: rank {rank} recorded {dict(+counts[rank])}, the job made {dict(want)}")
        # A communicator the agent forgot and met again would be a new one ("world@1"), not "world".
        check(on_world.get(rank, 0) == world,
              f"{label}: rank {rank} recorded {on_world.get(rank, 0)} calls on 'world', the job made {world}")
    drops = db.execute("SELECT kind, sum(count) FROM drops GROUP BY kind").fetchall()
    check(not [kind for kind, _ in drops if kind in LOSES_CALLS], f"{label}: calls lost: {drops}")
    agent_ranks = config.get("agent_ranks", [])
    check(len(agent_ranks) == args.np, f"{label}: agent statistics of {len(agent_ranks)} ranks")
    if mode != "observe":
        for entry in agent_ranks:
            want = untouched(kind, args.level, expected.get(entry.get("rank"), Counter()).get("single", 0))
            check(entry.get("shadow", {}).get("untouched", {}) == want,
                  f"{label}: rank {entry.get('rank')} left {entry.get('shadow', {}).get('untouched')} untouched, "
                  f"expected {want}")
    if mode == "explore":
        # Nothing measured on a communicator of one rank (recommend would ask which world size to plan for).
        worlds = sorted(w for (w,) in db.execute("SELECT DISTINCT world FROM measurements WHERE run_id = ?",
                                                 (run_id,)))
        check(args.np in worlds and 1 not in worlds, f"{label}: measurements at world sizes {worlds}")
    if mode.startswith("apply-"):
        applied = db.execute("SELECT count(*) FROM applied_calls a JOIN call_view c ON c.id = a.call_id "
                             "WHERE c.comm = 'world' AND c.run_id = ?", (run_id,)).fetchone()[0]
        check(applied > 0, f"{label}: no call on MPI_COMM_WORLD was replaced")
    db.close()
    code, report, err = ca.run([args.gradscope, "report", merged], ca.base_environment(), args.workdir)
    check(code == 0, f"{label}: gradscope report exit {code}: {tail(err)}")
    if mode != "observe":
        check("intercommunicator" in report, f"{label}: the report does not name the untouched calls:\n{tail(report)}")


def run_mode(args, kind, job, mode, plain_code, plain_out):
    label = f"{kind} np={args.np}{' ' + args.level if kind == 'c' else ''} {mode}"
    traces = ca.fresh_directory(os.path.join(args.workdir, f"traces-{mode}"))
    # As gradscope run sets them: a run id for every process (the spawned one names it as its origin) and
    # the pid in the file name (the spawned process is a rank 0 as well).
    variables = dict(mode_variables(args, mode), GRADSCOPE_RUN_ID=str(uuid.uuid4()), **sanitizer_variables(args))
    options = ca.agent_options(args, os.path.join(traces, "rank%r-%p.db"), **variables)
    code, out, err = ca.run(ca.mpiexec(args, args.np, job, options), ca.base_environment(), args.workdir,
                            timeout=TIMEOUT)
    if not check(code == plain_code, f"{label}: exit {code}, the plain run's {plain_code}: {tail(err)}"):
        return
    check(sorted(out.splitlines()) == sorted(plain_out.splitlines()),
          f"{label}: output differs from the plain run's: "
          f"{sorted(set(out.splitlines()) ^ set(plain_out.splitlines()))[:6]}")
    misplaced = misplaced_agent_lines(err)
    check(not misplaced, f"{label}: gradscope's lines in the middle of the job's: {misplaced[:3]}")
    for line in ca.gradscope_lines(err):
        print(f"check_adversarial: {label}: said: {line}")
    merged = os.path.join(args.workdir, f"merged-{mode}.db")
    if ca.merge(args, traces, merged, label):
        check_trace(args, merged, kind, mode, expected_calls(plain_out), label)


def check_job(args, kind):
    job = [args.adversarial, "--level", args.level] if kind == "c" else [args.python, args.adversarial_py]
    label = f"{kind} np={args.np}"
    code, plain_out, err = ca.run(ca.mpiexec(args, args.np, job), ca.base_environment(), args.workdir,
                                  timeout=TIMEOUT)
    if not check(code == 0, f"{label}: the plain run failed (exit {code}): {tail(err)}"):
        return
    check(len(expected_calls(plain_out)) == args.np, f"{label}: the plain run printed no call counts")
    for mode in args.modes.split(","):
        if not check(mode in MODES, f"unknown mode {mode}; modes: {', '.join(MODES)}"):
            continue
        run_mode(args, kind, job, mode, code, plain_out)


CASES = {
    "c": (lambda args: check_job(args, "c"), ["agent", "gradscope", "adversarial"]),
    "python": (lambda args: check_job(args, "python"), ["agent", "gradscope", "adversarial_py"]),
}


def main():
    parser = ca.tool_parser(__doc__)
    parser.add_argument("--adversarial")
    parser.add_argument("--adversarial-py")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--level", default="multiple", choices=["single", "funneled", "serialized", "multiple"])
    parser.add_argument("--modes", help=f"comma-separated, of {', '.join(MODES)}; default: all of them, or "
                        f"{', '.join(SANITIZER_MODES)} under a sanitizer")
    parser.add_argument("job", choices=sorted(CASES))
    args, function = ca.prepare(parser, CASES, "job", "gs-adversarial-")
    if not args.modes:
        args.modes = ",".join(SANITIZER_MODES if sanitizer_runtime(args.agent) else MODES)
    try:
        function(args)
    finally:
        code = ca.conclude("check_adversarial", args.job)
    return code


if __name__ == "__main__":
    sys.exit(main())
