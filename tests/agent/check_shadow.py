#!/usr/bin/python3
"""Integration tests of the agent's explore and apply modes on real MPI jobs.

  check_shadow.py TOOLS --workdir DIR explore --np N  the C++ sample under explore mode: stdout bit-identical
                                                      to the plain run's; the calls exactly the job's; every
                                                      applicable strategy measured on each size, linked to its
                                                      call, on the same calls on every rank; errors within the
                                                      documented bounds; consensus rows for the fp32 buffers
  check_shadow.py TOOLS --workdir DIR explore-python  the same for the mpi4py sample (2 ranks): mpi4py loads
                                                      libmpi RTLD_LOCAL, which the extension must bind to
  check_shadow.py TOOLS --workdir DIR apply --np N    apply-check under apply mode: covered calls return the
                                                      recommended strategy's result bit for bit, the others the
                                                      library's own; applied_calls says which
  check_shadow.py TOOLS --workdir DIR slow-rank       explore with rank 0 much slower than rank 1: no deadlock,
                                                      the same calls explored on both
  check_shadow.py TOOLS --workdir DIR budget          explore with the default budget on a longer run: time spent
                                                      exploring within the budget (plus one exploration)
  check_shadow.py TOOLS --workdir DIR validate        gradscope run --mode apply --validate 14 on the C++ sample:
                                                      the plan in even windows of 14 calls, the job's own calls
                                                      in odd ones, on both ranks alike; the validation stored,
                                                      reported and gated by gradscope check --min-step-gain;
                                                      with marked steps, windows of steps instead
  check_shadow.py TOOLS --workdir DIR bad-files       apply mode with a malformed, foreign, newer, mismatched,
                                                      semantic-without-opt-in or missing file: one 'gradscope:'
                                                      line for the job, its output untouched (also: a file
                                                      made for another world size)

TOOLS: --agent SO --gradscope EXE --mpiexec EXE --sample EXE --apply-check EXE --python /usr/bin/python3
--python-sample PY.
Shares its helpers with check_agent.py. Exits 0 when every check passes, 1 with one line per failure.
"""

import json
import os
import sqlite3
import sys
from collections import defaultdict

import check_agent as ca
from check_agent import check, tail
from sanitizers import sanitizer_runtime

# Strategy names explore mode measures on MPI (comm/ applicableStrategies).
TRANSPORTS = ["native", "rs_ag", "reduce_bcast", "hier"]
WIRES = ["fp16", "bf16", "fp8e4m3", "fp8e5m2"]
MPI_ALGORITHMS = ["basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring", "rabenseifner"]
SUMS = [f"sum/{t}" for t in TRANSPORTS] + [f"sum/mpi.{a}" for a in MPI_ALGORITHMS]
FP32_STRATEGIES = set(SUMS + [f"sum/{t}/{w}" for t in TRANSPORTS for w in WIRES] +
                      ["adacons/native", "adacons/rs_ag", "adasum/native"])
FP64_STRATEGIES = set(SUMS)

# Error bounds against the fp64 reference (docs/methods.md, "Distributed strategies"): a lossless sum of N
# fp32 values is within (N-1)·2^-24 relative; the wire formats within their unit roundoff times a few
# hops; AdaCons and AdaSum are compared with methods:: on every rank's input.
def error_bound(strategy, dtype):
    if strategy.startswith("adacons/") or strategy.startswith("adasum/"):
        return 1e-5
    for wire, bound in (("fp8e4m3", 0.2), ("fp8e5m2", 0.3), ("bf16", 3e-2), ("fp16", 5e-3)):
        if strategy.endswith("/" + wire):
            return bound
    return 1e-6 if dtype == ca.FP32 else 1e-14


def explore_variables(**overrides):
    variables = {"GRADSCOPE_MODE": "explore", "GRADSCOPE_EXPLORE_BUDGET": "1", "GRADSCOPE_EXPLORE_SAMPLES": "1",
                 "GRADSCOPE_EXPLORE_WARMUP": "1", "GRADSCOPE_EXPLORE_REPS": "2", "GRADSCOPE_EXPLORE_WARMUP_REPS": "1",
                 "OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}
    variables.update(overrides)
    return variables


def run_explore(args, np, label, steps, sample_args=(), variables=None, program=None):
    """Runs the sample under explore mode; returns the merged trace's path or None."""
    traces = ca.fresh_directory(os.path.join(args.workdir, "traces"))
    options = ca.agent_options(args, os.path.join(traces, "rank%r.db"), **(variables or explore_variables()))
    job = program or ([args.sample, "--steps", str(steps)] + list(sample_args))
    code, out, err = ca.run(ca.mpiexec(args, np, job, options), ca.base_environment(), args.workdir, timeout=180)
    check(code == 0, f"{label}: exit {code} under explore mode: {tail(err)}")
    check(ca.gradscope_lines(err) == [], f"{label}: the agent printed {ca.gradscope_lines(err)}")
    merged = os.path.join(args.workdir, "merged.db")
    if not ca.merge(args, traces, merged, label):
        return None, out
    return merged, out


def explored_calls(db):
    """rank -> sorted list of (seq, api, dtype, bytes, strategy) measured on that rank's calls."""
    rows = db.execute("SELECT r.rank, c.seq, c.api, c.dtype, c.bytes, m.strategy, m.api, m.dtype, m.bytes "
                      "FROM measurements m JOIN calls c ON c.id = m.call_id JOIN ranks r ON r.id = m.rank_id "
                      "ORDER BY r.rank, c.seq, m.strategy").fetchall()
    per_rank = defaultdict(list)
    for rank, seq, api, dtype, size, strategy, m_api, m_dtype, m_bytes in rows:
        check((api, dtype, size) == (m_api, m_dtype, m_bytes),
              f"measurement {strategy} on rank {rank} seq {seq}: says {(m_api, m_dtype, m_bytes)}, its call is "
              f"{(api, dtype, size)}")
        per_rank[rank].append((seq, api, dtype, size, strategy))
    return per_rank


def check_identical_sampling(per_rank, np, label):
    reference = per_rank.get(0, [])
    check(sorted(per_rank) == list(range(np)), f"{label}: measurements from ranks {sorted(per_rank)}, expected all")
    for rank, rows in per_rank.items():
        if rows != reference:
            check(False, f"{label}: rank {rank} explored other calls or strategies than rank 0: "
                  f"{sorted(set(rows) ^ set(reference))[:5]}")


def check_explore(args, kind="cpp"):
    """explore --np N: bit-identical job output, the exact calls, every strategy on every explored size."""
    np, steps, label = args.np, 6, f"explore {kind} np={args.np}"
    job = ([args.python, args.python_sample] if kind == "python" else [args.sample]) + ["--steps", str(steps)]
    plain_out, _ = ca.plain_run(args, np, job, args.workdir, label)
    variables = explore_variables(**(ca.foreign_process_variables(args) if kind == "python" else {}))
    merged, out = run_explore(args, np, label, steps, variables=variables, program=job)
    check(out == plain_out, f"{label}: stdout differs from the plain run's:\n--- plain\n{plain_out}--- explore\n{out}")
    if merged is None:
        return
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    ca.check_job_trace(db, np, steps, label, mode="explore")

    # Warm-up 1, one sample per (api, dtype, size): each of the 7 calls of a step is explored once, in
    # the second step; every applicable strategy on each. The async strategies' errors come from the same
    # call sites' next two steps (docs/async.md): stale1 and dga1 in the third and fourth, stale2 in the
    # fourth.
    measured = explored_calls(db)
    per_rank = {rank: [row for row in rows if not row[4].startswith("async/")] for rank, rows in measured.items()}
    per_rank_async = {rank: [row for row in rows if row[4].startswith("async/")] for rank, rows in measured.items()}
    check_identical_sampling(per_rank, np, label)
    check_identical_sampling(per_rank_async, np, label + " (async)")
    by_call = defaultdict(set)
    for seq, api, dtype, size, strategy in per_rank.get(0, []):
        by_call[(seq, api, dtype, size)].add(strategy)
    setup, per_step = len(ca.SETUP_CALLS), len(ca.STEP_CALLS)
    expected_seqs = list(range(setup + per_step, setup + 2 * per_step))
    check(sorted(key[0] for key in by_call) == expected_seqs,
          f"{label}: explored calls with seq {sorted(key[0] for key in by_call)}, expected the second step's "
          f"{expected_seqs}")
    for (seq, api, dtype, size), strategies in sorted(by_call.items()):
        expected = FP32_STRATEGIES if dtype == ca.FP32 else FP64_STRATEGIES
        check(strategies == expected, f"{label}: call seq {seq} ({ca.API_NAMES.get(api)}, {size} B): strategies "
              f"measured {sorted(strategies)}; missing {sorted(expected - strategies)}, unexpected "
              f"{sorted(strategies - expected)}")

    async_by_call = defaultdict(set)
    for seq, api, dtype, size, strategy in per_rank_async.get(0, []):
        async_by_call[seq].add(strategy)
    expected_async = {seq + per_step: {"async/stale1", "async/dga1"} for seq in expected_seqs}
    expected_async.update({seq + 2 * per_step: {"async/stale1", "async/stale2", "async/dga1"} for seq in expected_seqs})
    check(dict(async_by_call) == expected_async, f"{label}: async errors measured at {dict(async_by_call)}, "
          f"expected {expected_async}")

    rows = db.execute("SELECT m.strategy, m.dtype, m.reps, m.min_ns, m.median_ns, m.p90_ns, m.max_ns, m.rel_l2_error, "
                      "m.cosine, m.overflow_count, m.world, m.busbw_gbs FROM measurements m").fetchall()
    for strategy, dtype, reps, low, median, p90, high, error, cosine, overflow, world, busbw in rows:
        where = f"{label}: {strategy} ({ca.DTYPE_NAMES.get(dtype)})"
        if strategy.startswith("async/"):
            # An error without a time: what it would have returned, not how long it took.
            check(reps == 0 and low == median == p90 == high == 0 and busbw == 0, f"{where}: reps {reps}, times")
            check(world == np and error is not None and 0 <= error < 10 and overflow == 0,
                  f"{where}: world {world}, relative error {error}, {overflow} overflows")
            continue
        check(reps == 2 and 0 < low <= median <= p90 <= high, f"{where}: reps {reps}, times {low} {median} {p90} {high}")
        check(world == np, f"{where}: world {world}, expected {np}")
        check(busbw > 0, f"{where}: busbw {busbw}")
        check(error is not None and error <= error_bound(strategy, dtype),
              f"{where}: relative error {error} above {error_bound(strategy, dtype)}")
        check(cosine is not None and cosine > 0.9, f"{where}: cosine to the reference {cosine}")
        check(overflow == 0, f"{where}: {overflow} overflows on gradients of magnitude ~1")

    # Consensus: one row per rank and explored fp32 buffer, its step filled in at merge; diversity and
    # the set of calls the same on every rank.
    consensus = db.execute("SELECT r.rank, c.seq, k.step, c.step, k.alpha, k.cosine_to_mean, k.grad_norm, "
                           "k.diversity FROM consensus k JOIN ranks r ON r.id = k.rank_id "
                           "JOIN calls c ON c.id = k.call_id ORDER BY c.seq, r.rank").fetchall()
    fp32_calls = sorted(seq for (seq, api, dtype, size) in by_call if dtype == ca.FP32)
    check(len(consensus) == np * len(fp32_calls), f"{label}: {len(consensus)} consensus rows, expected "
          f"{np} ranks x {len(fp32_calls)} explored fp32 buffers")
    diversity = defaultdict(set)
    for rank, seq, step, call_step, alpha, cosine, norm, div in consensus:
        check(step == call_step == 1, f"{label}: consensus of seq {seq} rank {rank} has step {step} (call {call_step})")
        check(norm > 0 and -1.0 <= cosine <= 1.0 and alpha == alpha, f"{label}: consensus row {rank, seq}: "
              f"alpha {alpha} cosine {cosine} norm {norm}")
        diversity[seq].add(round(div, 9))
    check(all(len(values) == 1 for values in diversity.values()),
          f"{label}: diversity differs between ranks: {dict(diversity)}")
    stats = [json.loads(row[0]) for row in db.execute("SELECT config_json FROM runs")]
    shadow = [rank.get("shadow", {}) for rank in stats[0].get("agent_ranks", [])] if stats else []
    check(len(shadow) == np and all(s.get("mode") == "explore" and s.get("explored") == 7 and
                                    s.get("followed") == 14 for s in shadow),
          f"{label}: agent statistics {shadow}, expected mode explore, 7 explored and 14 followed calls per rank")
    db.close()


def check_slow_rank(args):
    """Rank 0 sleeps 30 ms a step more than rank 1 (MPMD launch): the budget agreement and the explorations
    must not deadlock, and both ranks explore the same calls."""
    # 48 steps (~1.5 s): the fast rank's waits in the agreements count as spent, and under a sanitizer on a
    # busy machine the first preparation alone took half of a 16-step run's budget (CI: nothing explored).
    label, steps = "explore, slow rank 0", 48
    slow = [args.sample, "--steps", str(steps), "--sleep-ms", "30"]
    fast = [args.sample, "--steps", str(steps)]
    variables = explore_variables(GRADSCOPE_EXPLORE_BUDGET="0.5", GRADSCOPE_EXPLORE_SAMPLES="2",
                                  GRADSCOPE_EXPLORE_STRATEGIES="sum/native,sum/rs_ag,sum/native/bf16,adacons/native")
    options = ca.agent_options(args, os.path.join(ca.fresh_directory(os.path.join(args.workdir, "traces")),
                                                  "rank%r.db"), **variables)
    # Open MPI's -x applies to one application context: each gets the options.
    command = ([args.mpiexec, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "1"] + options + slow
               + [":", "-np", "1"] + options + fast)
    code, out, err = ca.run(command, ca.base_environment(), args.workdir, timeout=180)
    check(code == 0, f"{label}: exit {code}: {tail(err)}")
    merged = os.path.join(args.workdir, "merged.db")
    if ca.merge(args, os.path.join(args.workdir, "traces"), merged, label):
        db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
        per_rank = explored_calls(db)
        check(len(per_rank.get(0, [])) > 0, f"{label}: nothing explored")
        check_identical_sampling(per_rank, 2, label)
        db.close()


def check_budget(args):
    """The default budget (10%) on a run long enough to explore several times: the time spent exploring,
    as every rank counts it, stays within the budget plus the last exploration."""
    # Under the sanitizers every step is 10-20x slower, so a third of the steps still makes a run several
    # times the length the budget needs (and keeps CI within its time).
    label, steps = "explore, default budget", 500 if sanitizer_runtime(args.agent) else 1500
    variables = explore_variables()
    for name in ("GRADSCOPE_EXPLORE_BUDGET", "GRADSCOPE_EXPLORE_SAMPLES", "GRADSCOPE_EXPLORE_WARMUP",
                 "GRADSCOPE_EXPLORE_REPS", "GRADSCOPE_EXPLORE_WARMUP_REPS"):
        variables.pop(name)
    # 2 ms of sleep per step stands for a real step's compute: about 4 s, long enough for the budget to
    # pay for the first exploration's one-off setup (0.25 s reserved) and several more.
    merged, _ = run_explore(args, 2, label, steps, sample_args=["--sleep-ms", "2", "--print-every", "0"],
                            variables=variables)
    if merged is None:
        return
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    config, start, end = db.execute("SELECT config_json, start_ns, end_ns FROM runs").fetchone()
    duration = end - start
    for rank in json.loads(config).get("agent_ranks", []):
        shadow = rank.get("shadow", {})
        spent, explored = shadow.get("explore_ns", 0), shadow.get("explored", 0)
        # Every exploration was predicted to fit when it started; allow the budget plus the average
        # exploration (the last one may overshoot by its prediction's error) and 5% for timing noise.
        check(explored >= 1, f"{label}: rank {rank.get('rank')}: nothing explored in {duration / 1e9:.2f} s ({shadow})")
        per_exploration = spent / max(explored, 1)
        check(spent <= 0.10 * duration + per_exploration + 0.05 * duration,
              f"{label}: rank {rank.get('rank')} spent {spent / 1e6:.1f} ms exploring in a {duration / 1e6:.1f} ms "
              f"run: over the 10% budget plus one exploration")
        print(f"check_shadow: budget: rank {rank.get('rank')}: {explored} explorations, {spent / 1e6:.1f} ms of "
              f"{duration / 1e6:.1f} ms ({100 * spent / duration:.1f}%), {shadow.get('skipped_budget')} refused")
    db.close()


# ---- apply ------------------------------------------------------------------------------------------------

def recommendation(rules, world=None, backend="mpi", allow_semantic=False, max_rel_error=0.05, **extra):
    document = {"format": "gradscope-recommendation", "version": 1, "created": "2026-11-22T00:00:00Z",
                "tool_version": "test", "source_runs": [], "backend": backend, "max_rel_error": max_rel_error,
                "allow_semantic_change": allow_semantic, "rules": rules}
    if world is not None:
        document["world_size"] = world
    document.update(extra)
    return document


def rule(api, low, high, strategy, error_class):
    return {"api": api, "dtype": "fp32", "min_bytes": low, "max_bytes": high, "strategy": strategy,
            "error_class": error_class}


# apply-check's sizes are 1, 7, 100, 1000, 4099 and 65536 floats (4 B to 256 KiB).
APPLY_RULES = [rule("MPI_Allreduce", 0, 400, "sum/rs_ag", "lossless"),
               rule("MPI_Allreduce", 401, 20000, "sum/native/bf16", "lossy"),
               rule("MPI_Iallreduce", 0, 30000, "adacons/native", "semantic"),
               rule("MPI_Iallreduce", 30001, 1 << 30, "sum/reduce_bcast/fp16", "lossy")]


def apply_check_rules(rules):
    arguments = []
    for r in rules:
        arguments += ["--rule", f"{r['api']}:{r['min_bytes']}:{r['max_bytes']}:{r['strategy']}"]
    return arguments


def check_apply(args):
    np, label = args.np, f"apply np={args.np}"
    plan = os.path.join(args.workdir, "plan.json")
    with open(plan, "w") as handle:
        json.dump(recommendation(APPLY_RULES, world=np, allow_semantic=True), handle)
    expected = os.path.join(args.workdir, "expected")
    code, out, err = ca.run(ca.mpiexec(args, np, [args.apply_check, "--expect", expected] + apply_check_rules(APPLY_RULES)),
                            ca.base_environment(), args.workdir)
    if not check(code == 0, f"{label}: apply-check --expect exit {code}: {tail(err)}"):
        return
    traces = ca.fresh_directory(os.path.join(args.workdir, "traces"))
    options = ca.agent_options(args, os.path.join(traces, "rank%r.db"), GRADSCOPE_MODE="apply",
                               GRADSCOPE_RECOMMENDATION=plan, GRADSCOPE_ALLOW_SEMANTIC_CHANGE="1")
    code, out, err = ca.run(ca.mpiexec(args, np, [args.apply_check, "--check", expected] + apply_check_rules(APPLY_RULES),
                                       options), ca.base_environment(), args.workdir)
    check(code == 0, f"{label}: apply-check --check exit {code}:\n{out}{tail(err)}")
    check(ca.gradscope_lines(err) == [], f"{label}: the agent printed {ca.gradscope_lines(err)}")
    check("0 wrong" in out, f"{label}: apply-check says {out.strip()}")
    merged = os.path.join(args.workdir, "merged.db")
    if not ca.merge(args, traces, merged, label):
        return
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    # applied_calls: exactly the covered calls, with their rule's strategy, on every rank alike.
    rows = db.execute("SELECT r.rank, c.seq, c.api, c.bytes, a.strategy FROM calls c JOIN ranks r ON r.id = c.rank_id "
                      "LEFT JOIN applied_calls a ON a.call_id = c.id WHERE c.dtype = ? ORDER BY r.rank, c.seq",
                      (ca.FP32,)).fetchall()
    names = {"MPI_Allreduce": ca.MPI_ALLREDUCE, "MPI_Iallreduce": ca.MPI_IALLREDUCE}
    wrong = []
    for rank, seq, api, size, strategy in rows:
        covering = [r["strategy"] for r in APPLY_RULES if names[r["api"]] == api and r["min_bytes"] <= size <= r["max_bytes"]]
        if (covering[0] if covering else None) != strategy:
            wrong.append((rank, seq, api, size, strategy, covering))
    check(rows and not wrong, f"{label}: applied_calls disagree with the rules (rank, seq, api, bytes, applied, "
          f"rule): {wrong[:5]}")
    mode = db.execute("SELECT mode FROM runs").fetchone()[0]
    check(mode == "apply", f"{label}: runs.mode {mode}, expected apply")
    db.close()


# The async strategies (docs/async.md): every round of apply-check is one step of 30 collectives.
ASYNC_RULES = [rule("MPI_Allreduce", 0, 400, "async/stale1", "semantic"),
               rule("MPI_Allreduce", 401, 1 << 30, "async/dga1", "semantic"),
               rule("MPI_Iallreduce", 0, 30000, "async/stale2", "semantic"),
               rule("MPI_Iallreduce", 30001, 1 << 30, "sum/native", "lossless")]


def check_apply_async(args):
    """Async rules in apply mode: every call's result bit for bit (its site's sum of K rounds before, dga's
    correction, the first K rounds synchronous), then linreg's replicas: identical under stale, apart by at
    most the local terms under dga."""
    np, label = args.np, f"apply async np={args.np}"
    plan = os.path.join(args.workdir, "plan.json")
    with open(plan, "w") as handle:
        json.dump(recommendation(ASYNC_RULES, world=np, allow_semantic=True), handle)
    expected = os.path.join(args.workdir, "expected")
    rules = apply_check_rules(ASYNC_RULES) + ["--rounds", "6"]
    code, out, err = ca.run(ca.mpiexec(args, np, [args.apply_check, "--expect", expected] + rules),
                            ca.base_environment(), args.workdir)
    if not check(code == 0, f"{label}: apply-check --expect exit {code}: {tail(err)}"):
        return
    traces = ca.fresh_directory(os.path.join(args.workdir, "traces"))
    options = ca.agent_options(args, os.path.join(traces, "rank%r.db"), GRADSCOPE_MODE="apply",
                               GRADSCOPE_RECOMMENDATION=plan, GRADSCOPE_ALLOW_SEMANTIC_CHANGE="1",
                               GRADSCOPE_STEP_CALLS="30")
    code, out, err = ca.run(ca.mpiexec(args, np, [args.apply_check, "--check", expected] + rules, options),
                            ca.base_environment(), args.workdir)
    check(code == 0, f"{label}: apply-check --check exit {code}:\n{out}{tail(err)}")
    check(ca.gradscope_lines(err) == [], f"{label}: the agent printed {ca.gradscope_lines(err)}")
    check("0 wrong" in out and "calls" in out, f"{label}: apply-check says {out.strip()}")

    # Without the step marker the steps are counted where the first call's size comes again, which in
    # apply-check's rounds it does four times a round: the sites change size, restart, and the agent says so
    # once for the job (results then follow other "steps" than the rounds: not compared).
    options = ca.agent_options(args, os.path.join(ca.fresh_directory(os.path.join(args.workdir, "unmarked")),
                                                  "rank%r.db"), GRADSCOPE_MODE="apply",
                               GRADSCOPE_RECOMMENDATION=plan, GRADSCOPE_ALLOW_SEMANTIC_CHANGE="1")
    code, out, err = ca.run(ca.mpiexec(args, np, [args.apply_check, "--check", expected] + rules, options),
                            ca.base_environment(), args.workdir)
    lines = ca.gradscope_lines(err)
    check("calls" in out and len(lines) == 1 and "changed size or the steps changed shape" in lines[0] and
          "GRADSCOPE_STEP_CALLS" in lines[0], f"{label}, unmarked steps: exit {code}, {out.strip()}, said {lines}")

    # linreg under the plan: stale keeps the replicas identical; dga's differ by the local terms only.
    for strategy in ("async/stale1", "async/dga1"):
        where = f"{label}: linreg {strategy}"
        linreg_plan = os.path.join(args.workdir, strategy.replace("/", "_") + ".json")
        with open(linreg_plan, "w") as handle:
            json.dump(recommendation([rule("MPI_Allreduce", 0, 1 << 30, strategy, "semantic")], world=np,
                                     allow_semantic=True), handle)
        out_dir = os.path.join(args.workdir, "linreg_" + strategy.replace("/", "_"))
        command = [args.gradscope, "run", "-f", "-o", out_dir, "--mode", "apply", "--recommendation", linreg_plan,
                   "--allow-semantic-change", "--", args.mpiexec, "--oversubscribe", "--mca",
                   "mpi_yield_when_idle", "1", "-np", str(np), args.linreg, "--steps", "200", "--print-every", "0",
                   "--check-replicas"]
        code, out, err = ca.run(command, ca.gradscope_run_environment(args), args.workdir)
        if not check(code == 0, f"{where}: exit {code}: {tail(err)}"):
            continue
        replicas = [line for line in out.splitlines() if line.startswith("replicas:")]
        if not check(len(replicas) == 1, f"{where}: no replicas line in\n{out}"):
            continue
        absolute = float(replicas[0].split("=")[1].split(",")[0])
        relative = float(replicas[0].split("relative")[1])
        if strategy.startswith("async/stale"):
            check(absolute == 0, f"{where}: replicas differ: {replicas[0]}")
        else:
            # lr·(g_last - g_first) per rank (docs/async.md): the local terms do not accumulate.
            check(0 < absolute and relative < 1, f"{where}: replicas {replicas[0]}, expected apart but within "
                  f"the local terms of one step")
        check(ca.gradscope_lines(err) == [] or all("async" not in line for line in ca.gradscope_lines(err)),
              f"{where}: the agent said {ca.gradscope_lines(err)}")


def check_validate(args):
    np, window, label = 2, 14, "apply --validate"
    # The sample's seven reductions per step (two windows of 14 calls are four steps): every fp32 sum under
    # sum/rs_ag, lossless, with times, so that a prediction is made.
    timed = rule("MPI_Allreduce", 0, 1 << 30, "sum/rs_ag", "lossless")
    timed.update({"predicted_ns": {"median": 9000, "low": 8000, "high": 10000},
                  "baseline": {"strategy": "sum/native", "median": 10000, "low": 9000, "high": 11000}})
    plan = os.path.join(args.workdir, "plan.json")
    with open(plan, "w") as handle:
        json.dump(recommendation([timed], world=np), handle)
    out_dir = os.path.join(args.workdir, "run")
    command = [args.gradscope, "run", "-o", out_dir, "--mode", "apply", "--recommendation", plan, "--validate",
               str(window), "--", args.mpiexec, "--oversubscribe", "-np", str(np), args.sample, "--blocking",
               "--steps", "120", "--print-every", "0"]
    code, out, err = ca.run(command, ca.gradscope_run_environment(args), args.workdir)
    if not check(code == 0, f"{label}: exit {code}: {tail(err)}"):
        return
    check("Validation (apply mode, the plan in alternate windows)" in err,
          f"{label}: the summary has no Validation section:\n{tail(err)}")
    merged = os.path.join(out_dir, "trace.db")
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    rows = db.execute("SELECT r.rank, c.seq, a.strategy FROM calls c JOIN ranks r ON r.id = c.rank_id "
                      "LEFT JOIN applied_calls a ON a.call_id = c.id WHERE c.api = ? AND c.dtype = ? AND c.op = 0 "
                      "ORDER BY r.rank, c.seq", (ca.MPI_ALLREDUCE, ca.FP32)).fetchall()
    wrong = [(rank, seq, strategy) for rank, seq, strategy in rows
             if (strategy == "sum/rs_ag") != ((seq // window) % 2 == 0)]
    check(len(rows) >= 2 * 120 * 5 and not wrong,
          f"{label}: {len(rows)} fp32 sums; applied outside the even windows or not inside them (rank, seq, "
          f"strategy): {wrong[:5]}")
    config = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0])
    db.close()
    validation = config.get("validation", {})
    check(validation.get("window_calls") == window and validation.get("windows_with", 0) >= 2 and
          validation.get("windows_without", 0) >= 2 and "predicted" in validation,
          f"{label}: runs.config_json validation {validation}")
    # The gate: no plan makes this step half as long; a trace without a validation is bad input.
    code, out, err = ca.run([args.gradscope, "check", "--min-step-gain", "50%", merged], ca.base_environment(),
                            args.workdir)
    check(code == 1 and out.startswith("REGRESSION: the plan made the step"),
          f"{label}: check --min-step-gain 50%: exit {code}: {out}{err}")
    rank_file = sorted(f for f in os.listdir(out_dir) if f.startswith("rank"))[0]
    code, out, err = ca.run([args.gradscope, "check", "--min-step-gain", "1%", os.path.join(out_dir, rank_file)],
                            ca.base_environment(), args.workdir)
    check(code == 2 and "no validation of a plan" in err, f"{label}: check of a rank file: exit {code}: {err}")

    # A job that marks its steps (every 7 collectives): windows of 3 steps, switched between steps, so no
    # step mixes the two. (The setup's MPI_Bcast counts too, so the last marked step holds only the loss's
    # fp64 sum, which no rule covers: that one step is left out.)
    label = "apply --validate, marked steps"
    out_dir = os.path.join(args.workdir, "run-steps")
    command[command.index("-o") + 1] = out_dir
    command[command.index("--validate") + 1] = "3"
    code, out, err = ca.run(command, {**ca.gradscope_run_environment(args), "GRADSCOPE_STEP_CALLS": "7"},
                            args.workdir)
    if not check(code == 0, f"{label}: exit {code}: {tail(err)}"):
        return
    db = sqlite3.connect(f"file:{os.path.join(out_dir, 'trace.db')}?mode=ro", uri=True)
    rows = db.execute("SELECT r.rank, c.step, a.strategy FROM calls c JOIN ranks r ON r.id = c.rank_id "
                      "LEFT JOIN applied_calls a ON a.call_id = c.id WHERE c.api = ? AND c.dtype = ? AND c.op = 0",
                      (ca.MPI_ALLREDUCE, ca.FP32)).fetchall()
    wrong = [(rank, step, strategy) for rank, step, strategy in rows
             if (strategy == "sum/rs_ag") != (step is not None and (step // 3) % 2 == 0)]
    check(len(rows) == 2 * 120 * 6 and not wrong,
          f"{label}: {len(rows)} fp32 sums; applied outside the even windows of steps or not inside them "
          f"(rank, step, strategy): {wrong[:5]}")
    validation = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0]).get("validation", {})
    db.close()
    check(validation.get("window_steps") is True and validation.get("steps_left_out", 9) <= 1 and
          validation.get("steps_with", 0) + validation.get("steps_without", 0) == 120,
          f"{label}: runs.config_json validation {validation}")

    # An async plan (docs/async.md): its rules change the step, not the call, so the prediction is the
    # file's predicted_step_saving_ns over the mean step without the plan.
    label = "apply --validate, async plan"
    saving = 200000.0
    plan = os.path.join(args.workdir, "plan-async.json")
    with open(plan, "w") as handle:
        json.dump(recommendation([rule("MPI_Allreduce", 0, 1 << 30, "async/stale1", "semantic")], world=np,
                                 allow_semantic=True,
                                 predicted_step_saving_ns={"median": saving, "low": 100000, "high": 300000}),
                  handle)
    out_dir = os.path.join(args.workdir, "run-async")
    command[command.index("-o") + 1] = out_dir
    command[command.index("--recommendation") + 1] = plan
    command.insert(command.index("--validate"), "--allow-semantic-change")
    code, out, err = ca.run(command, {**ca.gradscope_run_environment(args), "GRADSCOPE_STEP_CALLS": "7"},
                            args.workdir)
    if not check(code == 0, f"{label}: exit {code}: {tail(err)}"):
        return
    db = sqlite3.connect(f"file:{os.path.join(out_dir, 'trace.db')}?mode=ro", uri=True)
    applied = db.execute("SELECT COUNT(*) FROM applied_calls WHERE strategy = 'async/stale1'").fetchone()[0]
    validation = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0]).get("validation", {})
    db.close()
    predicted = validation.get("predicted", {})
    without = validation.get("step_without_ns", 0)
    # The prediction divides by the mean of the steps without, step_without_ns is the mean of the windows'
    # means: the same on a quiet machine, 9% apart once under ASan beside other tests (one slow window), so
    # the step is checked to 25%; the saving itself exactly, by the ratio of median to low (3 to 2).
    change, low = predicted.get("change", 0), predicted.get("low", 1)
    check(applied > 0 and without > 0 and abs(change / (-saving / without) - 1) < 0.25 and
          abs(change / low - 2 / 3) < 1e-9,
          f"{label}: {applied} calls applied; runs.config_json validation {validation}")


def check_bad_files(args):
    """Every bad recommendation: one 'gradscope:' line for the whole job (the lowest rank that has the
    problem says it), the job's output as without the agent, nothing applied."""
    np, label = 2, "apply, bad files"
    sample = [args.sample, "--steps", "4"]
    plain_out, _ = ca.plain_run(args, np, sample, args.workdir, label)
    good_rules = [rule("MPI_Allreduce", 0, 1 << 30, "sum/native/bf16", "lossy")]
    cases = {
        "malformed": ("{\"format\": \"gradscope-recommendation\", \"version\": 1, \"rules\": [", ["malformed"]),
        "foreign": (json.dumps({"hello": "world"}), ["foreign"]),
        "newer": (json.dumps(recommendation(good_rules, version=99)), ["newer"]),
        "nccl": (json.dumps(recommendation([rule("ncclAllReduce", 0, 100, "sum/native", "lossless")], backend="nccl")),
                 ["nccl"]),
        "world": (json.dumps(recommendation(good_rules, world=5)), ["5 ranks"]),
        "semantic": (json.dumps(recommendation([rule("MPI_Allreduce", 0, 1 << 30, "adacons/native", "semantic")],
                                               allow_semantic=True)), ["allow-semantic-change"]),
        "missing": (None, ["missing"]),
    }
    for case, (text, mentions) in cases.items():
        plan = os.path.join(args.workdir, f"{case}.json")
        if text is not None:
            with open(plan, "w") as handle:
                handle.write(text)
        traces = ca.fresh_directory(os.path.join(args.workdir, f"traces-{case}"))
        options = ca.agent_options(args, os.path.join(traces, "rank%r.db"), GRADSCOPE_MODE="apply",
                                   GRADSCOPE_RECOMMENDATION=plan)
        code, out, err = ca.run(ca.mpiexec(args, np, sample, options), ca.base_environment(), args.workdir)
        where = f"{label}: {case}"
        check(code == 0, f"{where}: exit {code}: {tail(err)}")
        check(out == plain_out, f"{where}: stdout differs from the plain run's")
        lines = ca.gradscope_lines(err)
        check(len(lines) == 1, f"{where}: {len(lines)} 'gradscope:' lines, expected one for the job: {lines}")
        for line in lines:
            check(case in line or any(word in line for word in mentions) or plan in line,
                  f"{where}: '{line}' names neither the file nor the problem")
        # The job was still observed: every rank wrote its calls, none applied.
        files = ca.trace_files(traces)
        check(len(files) == np, f"{where}: per-rank files {files}")
        for name in files:
            db = sqlite3.connect(f"file:{os.path.join(traces, name)}?mode=ro", uri=True)
            applied = db.execute("SELECT count(*) FROM applied_calls").fetchone()[0]
            calls = db.execute("SELECT count(*) FROM calls").fetchone()[0]
            check(applied == 0 and calls > 0, f"{where}: {name}: {applied} applied calls, {calls} calls")
            db.close()


MODES = {
    "explore": (check_explore, ["agent", "gradscope", "sample"]),
    "explore-python": (lambda args: check_explore(args, "python"), ["agent", "gradscope", "python", "python_sample"]),
    "slow-rank": (check_slow_rank, ["agent", "gradscope", "sample"]),
    "budget": (check_budget, ["agent", "gradscope", "sample"]),
    "apply": (check_apply, ["agent", "gradscope", "apply_check"]),
    "apply-async": (check_apply_async, ["agent", "gradscope", "apply_check", "linreg"]),
    "bad-files": (check_bad_files, ["agent", "sample"]),
    "validate": (check_validate, ["agent", "gradscope", "sample"]),
}


def main():
    parser = ca.tool_parser(__doc__)
    parser.add_argument("--apply-check")
    parser.add_argument("--linreg")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--python-sample")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("mode", choices=sorted(MODES))
    args, function = ca.prepare(parser, MODES, "mode", "gs-shadow-")
    try:
        function(args)
    finally:
        code = ca.conclude("check_shadow", args.mode)
    return code


if __name__ == "__main__":
    sys.exit(main())
