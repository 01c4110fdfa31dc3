#!/usr/bin/python3
"""Integration tests of the agent's NCCL interposer on nccl_job (tests/agent/nccl/nccl_job.cc).

  check_nccl.py TOOLS --workdir DIR host      fake NCCL, no CUDA driver: host timing; exact calls, keys,
                                              sequence numbers (sends, receives and group launches
                                              numbered apart from the collectives), streams, peers;
                                              every group launch a row of its own (members, their
                                              bytes), sharing its members' one span
  check_nccl.py TOOLS --workdir DIR gpu       fake NCCL and the fake driver (libcuda.so.1, kernels of
                                              10 ms): CUDA-event timing; every span is its kernels'
                                              length, a group's members share the group's span, the
                                              graph-captured call is timed on the host, no job stream is
                                              ever synchronised, no event is recorded on a capturing stream
  check_nccl.py TOOLS --workdir DIR cupti     the same with the fake CUPTI (libcupti.so.13): every span is
                                              exactly its kernels' from CUPTI's records (groups included);
                                              with GRADSCOPE_CUPTI=0 the events give the same spans; a
                                              buffer pool that runs dry counts cupti_record drops and
                                              falls back to the events; each of the 3 launches of the
                                              graph of a captured call and a captured group is a call
                                              row of its own per captured call (replay 1, 2, 3),
                                              exactly its kernels' span
  check_nccl.py TOOLS --workdir DIR nvtx      GRADSCOPE_STEP_NVTX=step with the agent as the NVTX
                                              injection library: the step of every call
  check_nccl.py TOOLS --workdir DIR disabled  GRADSCOPE_DISABLE=1: no trace, the job untouched
  check_nccl.py TOOLS --workdir DIR old-nccl  the fake NCCL as 2.27 (no ncclAlltoAll, ncclGather,
                                              ncclScatter; --old-nccl): the job's other calls exactly; a
                                              probe finds the agent's ncclAlltoAll, whose calls fail
                                              with ncclInternalError, said once
  check_nccl.py TOOLS --workdir DIR profiler  the profiler plugin alone (NCCL_PROFILER_PLUGIN=its path,
                                              no agent), and on the v4 table: its own trace has every
                                              collective with NCCL's algorithm, protocol, channels and
                                              completion; `gradscope report` reads it
  check_nccl.py TOOLS --workdir DIR profiler-agent  agent + plugin (NCCL_PROFILER_PLUGIN=gradscope found
                                              on LD_LIBRARY_PATH): the agent's calls rows, plain and
                                              grouped, on every communicator, carry what NCCL reported;
                                              the plugin writes no file of its own
  check_nccl.py TOOLS --workdir DIR profiler-unset  NCCL_PROFILER_PLUGIN unset: no plugin file, no
                                              NCCL facts, the host-mode trace unchanged
  check_nccl.py TOOLS --workdir DIR tuner-profiler  agent + profiler plugin + tuner plugin
                                              (NCCL_TUNER_PLUGIN=its path; by name through the v4 and v3
                                              tables) with a CSV forcing Ring/Simple x3 channels for
                                              all-reduces up to 4096 bytes and Tree/LL128 above: every
                                              all-reduce row carries the tuner's choice, the other
                                              collectives NCCL's; NCCL_TUNER_PLUGIN=none: NCCL's only
  check_nccl.py TOOLS --workdir DIR tuner-apply  the same through `gradscope run --mode apply
                                              --recommendation plan.json` (sum/nccl.* rules): gradscope
                                              run sets the tuner's variables, the rows carry the plan
  check_nccl.py TOOLS --workdir DIR tuner-explore  GRADSCOPE_TUNER_EXPLORE=1, NCCL_PROTO=^LL128: per
                                              communicator, collective and size bucket the calls walk
                                              through the usable algorithm/protocol pairs, cycling
  check_nccl.py TOOLS --workdir DIR tuner-malformed  a bad CSV: the job unchanged, NCCL's own choices,
                                              one WARN line on stderr with NCCL_DEBUG=WARN
  check_nccl.py TOOLS --workdir DIR shadow-explore  explore mode over NCCL with the fake extension
                                              (--fake-extension, beside a link to the agent) and the fake
                                              driver: every communicator joins once, at its first sum
                                              all-reduce; exactly the calls ExplorePlan samples (group
                                              members after the group, never a graph-captured call) get
                                              measurements and consensus rows; the extension's own
                                              communicators and calls leave no trace; the job unchanged
  check_nccl.py TOOLS --workdir DIR shadow-apply  apply mode with a plan of fp32 rules: calls of the
                                              sum/rs_ag rules (group members included, never a graph-
                                              captured call) run the extension's strategy and get
                                              applied_calls rows; the sum/reduce_bcast rule is refused,
                                              one line says so, its call runs untouched; the
                                              sum/nccl.* rule is left to the tuner plugin
  check_nccl.py TOOLS --workdir DIR gpu-steps  gpu_steps_job.cc (--gpu-steps-job) under the fake CUPTI:
                                              the sampled windows' kernels, merged into GPU steps with
                                              the job's known split (check_gpu_steps says what is checked)
  check_nccl.py TOOLS --workdir DIR static    the job with the fake NCCL linked in statically (--static-job),
                                              as TensorFlow's: the agent cannot interpose it, the profiler
                                              plugin records it; `gradscope run` says which path recorded
                                              the rank and why
  check_nccl.py TOOLS --workdir DIR real      the job on the real NCCL and a GPU (scripts/gpu_check.sh):
                                              the same calls, keys from NCCL's random unique ids, GPU
                                              spans that start after their call (its communicators have
                                              one rank: NCCL copies, so the captured calls have no replays
                                              to trace; real-pair-graph has them); `gradscope report`
                                              on the trace when --gradscope is given
  check_nccl.py TOOLS --workdir DIR real-nvtx the same with the NVTX step marker
  check_nccl.py TOOLS --workdir DIR real-pair  nccl_pair.cc (--job): two ranks on one GPU, the real NCCL
                                              choosing: every call carries NCCL's algorithm, protocol
                                              and channels, the same on both ranks; with the tuner's
                                              CSV, the rule's choice; `gradscope run` merges both ranks
  check_nccl.py TOOLS --workdir DIR real-pair-graph  nccl-pair --graph: each rank's 64 KiB all-reduce
                                              captured into a CUDA graph and launched 3 times: the
                                              captured call is host-timed, and each launch is a replay
                                              of it with NCCL's kernels' span (CUPTI), on both ranks
  check_nccl.py TOOLS --workdir DIR real-pair-p2p  nccl-pair --p2p: the two ranks exchange 256 KiB each
                                              way, alone and in a group: each rank's sends and receives
                                              with their peer, bytes and GPU span, and the group launch
  check_nccl.py TOOLS --workdir DIR real-pair-explore  the same with GRADSCOPE_TUNER_EXPLORE=1: each
                                              size walks through several algorithm/protocol pairs
  check_nccl.py TOOLS --workdir DIR real-pair-shadow  explore and apply modes through the real NCCL
                                              extension (check_real_pair_shadow says what is checked)

TOOLS: --agent SO --job EXE [--fake-cuda SO] [--fake-cupti SO] [--fake-extension SO] [--old-nccl DIR]
[--profiler SO] [--tuner SO] [--gradscope EXE]. Every mode also runs the job without the
agent and requires the same stdout and exit status. Exits 0 when every check passes, 1 with one
"check_nccl: FAIL: ..." line per failed check.
"""

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sanitizers import preload, sanitizer_runtime  # noqa: E402
from stderr_lines import agent_lines, job_lines  # noqa: E402

# gradscope::Api, DType, ReduceOp codes (common/include/gradscope/common/types.h).
ALLREDUCE, REDUCESCATTER, ALLGATHER, REDUCE, BROADCAST = 16, 17, 18, 19, 20
GROUP, SEND, RECV, ALLTOALL, GATHER, SCATTER = 21, 22, 23, 24, 25, 26
TUNED = (ALLREDUCE, REDUCESCATTER, ALLGATHER, REDUCE, BROADCAST)  # what NCCL's tuner and profiler see
INT8, UINT8, INT32, FP32, FP64, BF16, OTHER = 0, 1, 2, 7, 8, 9, 254
SIZES = {INT8: 1, UINT8: 1, INT32: 4, FP32: 4, FP64: 8, BF16: 2}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
BACKEND_NCCL = 2

# The job's calls in order: (communicator, api, dtype, op, count, bytes, stream, group, captured, peer).
# op None: no reduction (NULL). group: index of the ncclGroupStart/End block, or None. peer: a send's or
# receive's peer rank, else None. The launch of each group is a row of its own besides (expected_groups).
STEPS = 3
GRAPH_LAUNCHES = 3  # launches of the captured call's graph (nccl_job.cc kGraphLaunches)
CAPTURED_GROUP = STEPS  # the group index of the group captured with it (the steps' groups are 0..STEPS-1)
EXCHANGE_GROUP, PAIR_GROUP = STEPS + 1, STEPS + 2  # the groups of sends and receives
MAIN, SPLIT, ALL, CONFIG, PAIR0, PAIR1 = "main", "split", "all", "config", "pair0", "pair1"
# (size, rank) of each communicator.
SHAPES = {MAIN: (1, 0), SPLIT: (1, 0), ALL: (1, 0), CONFIG: (1, 0), PAIR0: (2, 0), PAIR1: (2, 1)}


def call(comm, api, dtype, op, count, stream, group=None, captured=False, peer=None, elements=None):
    nbytes = (count if elements is None else elements) * SIZES[dtype]
    return (comm, api, dtype, op, count, nbytes, stream, group, captured, peer)


def expected_calls(fake=True, nccl_2_28=True):
    calls = []
    for step in range(STEPS):
        calls += [
            call(MAIN, ALLREDUCE, FP32, SUM, 1000, 1),
            call(MAIN, ALLREDUCE, FP64, MAX, 10, 1),
            call(MAIN, ALLREDUCE, INT32, SUM, 4096, 2),
            call(MAIN, ALLREDUCE, BF16, AVG, 2048, 1),
            call(MAIN, ALLREDUCE, FP32, SUM, 256, 1, group=step),
            call(MAIN, ALLREDUCE, FP32, PROD, 512, 1, group=step),
            call(MAIN, BROADCAST, INT8, None, 100, 1, group=step),
        ]
    calls += [
        call(MAIN, REDUCESCATTER, FP32, SUM, 64, 1),  # recvcount 64 x 1 rank x 4 bytes
        call(MAIN, ALLGATHER, FP32, None, 32, 1),
        call(MAIN, BROADCAST, UINT8, None, 200, 2),
        call(MAIN, REDUCE, FP64, MIN, 16, 1),
        # Sends to itself and their receives, in one group.
        call(MAIN, SEND, FP32, None, 300, 1, group=EXCHANGE_GROUP, peer=0),
        call(MAIN, SEND, INT32, None, 50, 1, group=EXCHANGE_GROUP, peer=0),
        call(MAIN, RECV, FP32, None, 300, 1, group=EXCHANGE_GROUP, peer=0),
        call(MAIN, RECV, INT32, None, 50, 1, group=EXCHANGE_GROUP, peer=0),
    ]
    if nccl_2_28:
        calls += [
            call(MAIN, ALLTOALL, FP32, None, 16, 1, elements=16 * SHAPES[MAIN][0]),
            call(MAIN, GATHER, FP32, None, 8, 1),
            call(MAIN, SCATTER, FP32, None, 8, 2),
        ]
    calls += [
        call(MAIN, ALLREDUCE, FP32, SUM, 128, 1, captured=True),
        call(MAIN, ALLREDUCE, FP32, SUM, 64, 1, group=CAPTURED_GROUP, captured=True),  # a group in the same graph
        call(MAIN, ALLREDUCE, FP32, SUM, 32, 1, group=CAPTURED_GROUP, captured=True),
        call(SPLIT, ALLREDUCE, FP32, SUM, 8, 1),
        call(ALL, ALLREDUCE, FP32, SUM, 4, 1),
        call(CONFIG, ALLREDUCE, FP32, SUM, 16, 1),
    ]
    if fake:  # the fake NCCL's two-rank communicator, both ranks in the job's process
        calls += [
            call(PAIR0, SEND, FP64, None, 12, 1, peer=1),
            call(PAIR1, RECV, FP64, None, 12, 2, peer=0),
            call(PAIR0, SEND, FP32, None, 40, 1, group=PAIR_GROUP, peer=1),
            call(PAIR1, SEND, BF16, None, 24, 1, group=PAIR_GROUP, peer=0),
            call(PAIR0, RECV, BF16, None, 24, 1, group=PAIR_GROUP, peer=1),
            call(PAIR1, RECV, FP32, None, 40, 1, group=PAIR_GROUP, peer=0),
            call(PAIR1, REDUCESCATTER, FP32, SUM, 8, 1, elements=8 * 2),  # recvcount 8 x 2 ranks x 4 bytes
            call(PAIR0, ALLGATHER, FP32, None, 8, 1),
        ]
    return calls


def numbered_apart(api):
    """Sends, receives and group launches: numbered apart from their communicator's collectives
    (agent/core/call_event.h numberedApart)."""
    return api in (SEND, RECV, GROUP)


def expected_groups(calls):
    """The launch of each group of `calls`, in launch order: {group: (index of its last member, the
    launch as a call() tuple)}. On the first member's communicator, count = the members, bytes = theirs
    summed, dtype Other, no reduction, the first member's stream."""
    members = {}
    for index, c in enumerate(calls):
        if c[7] is not None:
            members.setdefault(c[7], []).append(index)
    launches = {}
    for group, indices in members.items():
        first = calls[indices[0]]
        launches[group] = (indices[-1], (first[0], GROUP, OTHER, None, len(indices),
                                         sum(calls[i][5] for i in indices), first[6], group, first[8], None))
    return dict(sorted(launches.items(), key=lambda item: item[1][0]))


def expected_seqs(calls, groups):
    """The sequence numbers of `calls` and of the launches of `groups` (expected_groups): each
    communicator numbers its collectives, and apart from them its sends, receives and group launches (a
    launch after its last member)."""
    counters = {}
    call_seqs, group_seqs = [], {}
    ends = {last: group for group, (last, _) in groups.items()}
    for index, c in enumerate(calls):
        key = (c[0], numbered_apart(c[1]))
        call_seqs.append(counters.get(key, 0))
        counters[key] = call_seqs[-1] + 1
        if index in ends:
            launch = groups[ends[index]][1]
            key = (launch[0], True)
            group_seqs[ends[index]] = counters.get(key, 0)
            counters[key] = group_seqs[ends[index]] + 1
    return call_seqs, group_seqs


def peer_facts(c):
    """(dest, source, recv_bytes, peer_max_bytes, peer_min_bytes) a call of expected_calls() should have in
    peer_calls (None: NULL or no row)."""
    api = c[1]
    if api == SEND:
        return (c[9], None, None, None, None)
    if api == RECV:
        return (None, c[9], c[5], None, None)
    if api == ALLTOALL:
        return (None, None, None, c[4] * SIZES[c[2]], c[4] * SIZES[c[2]])
    return (None,) * 5


def expected_step(index):
    """The step of call `index` with the NVTX marker: the steps pushed so far - 1."""
    return min(index // 7, STEPS - 1)


def fnv1a(data):
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value


def fake_unique_id_key(n):
    """The agent's key for the fake NCCL's n-th unique id (fake_nccl.cc: byte i = 7i + 13n mod 256)."""
    return "nccl:%016x" % fnv1a(bytes((7 * i + 13 * n) & 0xFF for i in range(128)))


failures = []


# The fake kernels' length, and how far an event span may be from its kernels' (see check_gpu): shorter by
# EVENT_TOLERANCE_NS at most, longer by EVENT_LATE_NS. A sanitizer build's event thread, beside other tests,
# saw an end 11.7 ms late: there a span may be 19 ms longer, which still tells one kernel (at most 29 ms)
# from three (at least 21 ms, and 30 ms if recorded as one too many).
KERNEL_NS = 10_000_000
EVENT_TOLERANCE_NS = 9_000_000
EVENT_LATE_NS = 9_000_000


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def run(command, env, cwd, timeout=120):
    return subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


FLUSH_INTERVAL_NS = 10_000_000  # the agent's, in every run


def base_environment():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADSCOPE_") and k not in ("LD_PRELOAD", "NVTX_INJECTION64_PATH")}
    env["GRADSCOPE_FLUSH_INTERVAL"] = f"{FLUSH_INTERVAL_NS // 1_000_000}ms"
    return env


def run_pair(args, workdir, env, label):
    """The job without and with the agent; returns (the agent run's stderr, the trace file or None)."""
    plain = run([args.job], env, workdir)
    check(plain.returncode == 0, f"{label}: the job fails without the agent ({plain.returncode}): {plain.stderr[-800:]}")
    agent_env = dict(env, LD_PRELOAD=preload(args.agent), GRADSCOPE_OUTPUT=os.path.join(workdir, "trace-%p.db"))
    traced = run([args.job], agent_env, workdir)
    check(traced.returncode == plain.returncode,
          f"{label}: exit status {traced.returncode} under the agent, {plain.returncode} without")
    check(traced.stdout == plain.stdout, f"{label}: stdout differs under the agent:\n{traced.stdout}\n---\n{plain.stdout}")
    check("nccl_job: done" in traced.stdout, f"{label}: the job did not finish: {traced.stdout[-400:]}")
    other = job_lines(traced.stderr)
    check(not other, f"{label}: unexpected stderr under the agent: {other[:5]}")
    files = sorted(f for f in os.listdir(workdir) if f.startswith("trace-") and f.endswith(".db"))
    return traced.stderr, (os.path.join(workdir, files[0]) if len(files) == 1 else files)


def load_trace(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    calls = db.execute(
        "SELECT c.id, m.key, c.seq, c.step, c.api, c.dtype, c.op, c.count, c.bytes, c.enqueue_ns, c.start_ns, "
        "c.end_ns, coalesce(g.stream, 0), p.dest, p.source, p.recv_bytes, p.peer_max_bytes, p.peer_min_bytes "
        "FROM calls c JOIN comms m ON m.id = c.comm_id LEFT JOIN gpu_calls g ON g.call_id = c.id "
        "LEFT JOIN peer_calls p ON p.call_id = c.id WHERE g.replay IS NULL ORDER BY c.id").fetchall()
    comms = {key: (backend, size, rank) for key, backend, size, rank in
             db.execute("SELECT key, backend, size, comm_rank FROM comms")}
    drops = dict(db.execute("SELECT kind, count FROM drops"))
    run_row = db.execute("SELECT backend, world_size, end_ns FROM runs").fetchone()
    device = db.execute("SELECT device FROM ranks").fetchone()[0]
    db.close()
    return calls, comms, drops, run_row, device


def trace_config(workdir):
    """runs.config_json of the one trace in `workdir`, parsed ({} when there is none)."""
    traces = [f for f in os.listdir(workdir) if f.startswith("trace-") and f.endswith(".db")]
    if len(traces) != 1:
        return {}
    db = sqlite3.connect(f"file:{os.path.join(workdir, traces[0])}?mode=ro", uri=True)
    config = db.execute("SELECT config_json FROM runs").fetchone()[0]
    db.close()
    return json.loads(config)


def load_replays(path):
    """The graph replays (calls with gpu_calls.replay): [(communicator key, seq, replay, start, end, api, bytes)]
    in replay order."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute("SELECT m.key, c.seq, g.replay, c.start_ns, c.end_ns, c.api, c.bytes FROM calls c "
                      "JOIN gpu_calls g ON g.call_id = c.id JOIN comms m ON m.id = c.comm_id "
                      "WHERE g.replay IS NOT NULL ORDER BY m.key, c.seq, g.replay").fetchall()
    db.close()
    return rows


def check_trace(path, label, keys, nvtx=False, outside_groups=(), nccl_2_28=True):
    """The calls of the trace against expected_calls(), and the launch of every group against
    expected_groups(); returns the rows of expected_calls() in the job's order, each with its
    expectation, for the timing checks. `outside_groups`: indices of group members that ran after their
    group (apply mode's replaced members), with spans of their own and not counted in the launch."""
    calls, comms, drops, run_row, device = load_trace(path)
    check(run_row is not None and run_row[0] == BACKEND_NCCL and run_row[1] == 1 and run_row[2] is not None,
          f"{label}: runs row {run_row} (expected backend nccl, world 1, complete)")
    wanted_keys = set(keys.values())
    check(set(comms) == wanted_keys, f"{label}: communicator keys {sorted(comms)}, expected {sorted(wanted_keys)}")
    for tag, key in keys.items():
        if key in comms:
            check(comms[key] == (BACKEND_NCCL,) + SHAPES[tag],
                  f"{label}: communicator {key}: (backend, size, rank) {comms[key]}, expected {(BACKEND_NCCL,) + SHAPES[tag]}")
    check(not drops.get("call") and not drops.get("thread_buffer"), f"{label}: dropped calls {drops}")
    expected = expected_calls(fake=PAIR0 in keys, nccl_2_28=nccl_2_28)
    # Apply mode's replaced members leave their groups: the launches count the others.
    in_groups = [c if i not in outside_groups else c[:7] + (None,) + c[8:] for i, c in enumerate(expected)]
    groups = expected_groups(in_groups)
    call_seqs, group_seqs = expected_seqs(expected, groups)
    check(len(calls) == len(expected) + len(groups),
          f"{label}: {len(calls)} calls recorded, {len(expected)} made in {len(groups)} group launches")
    # A call is found by its communicator and its number in its sequence (the job's order within each
    # communicator; not enqueue_ns: ticks are converted to times when a record is written, GPU-timed ones once
    # their events complete, with the clock calibration of the moment, so calls microseconds apart may swap).
    by_number = {(row[1], numbered_apart(row[4]), row[2]): row for row in calls}
    rows = []
    for index, want in enumerate(expected):
        comm, w_api, w_dtype, w_op, w_count, w_bytes, w_stream, group, captured, peer = want
        number = (keys[comm], numbered_apart(w_api), call_seqs[index])
        where = f"{label}: call {index} ({keys[comm]} seq {call_seqs[index]}{' apart' if number[1] else ''})"
        row = by_number.get(number)
        if not check(row is not None, f"{where}: no such call recorded"):
            continue
        _, key, seq, step, api, dtype, op, count, nbytes, enqueue, start, end, stream = row[:13]
        check((api, dtype, op, count, nbytes) == (w_api, w_dtype, w_op, w_count, w_bytes),
              f"{where}: (api, dtype, op, count, bytes) = {(api, dtype, op, count, nbytes)}, "
              f"expected {(w_api, w_dtype, w_op, w_count, w_bytes)}")
        check(stream == w_stream, f"{where}: stream {stream}, expected {w_stream}")
        check(row[13:] == peer_facts(want), f"{where}: peers {row[13:]}, expected {peer_facts(want)}")
        wanted_step = expected_step(index) if nvtx else None
        check(step == wanted_step, f"{where}: step {step}, expected {wanted_step}")
        check(start <= end and enqueue <= end, f"{where}: times enqueue {enqueue} start {start} end {end}")
        rows.append((row, want))
    # Each group launch: its own row, spanning what its members span (all of them the same).
    members_of = {}
    for i, (r, w) in enumerate(rows):
        if w[7] is not None and i not in outside_groups:
            members_of.setdefault(w[7], []).append(r)
    for group, (last, launch) in groups.items():
        comm, _, w_dtype, _, w_count, w_bytes, w_stream = launch[:7]
        where = f"{label}: the launch of group {group} ({keys[comm]} seq {group_seqs[group]} apart)"
        row = by_number.get((keys[comm], True, group_seqs[group]))
        if not check(row is not None, f"{where}: not recorded"):
            continue
        first_index = next(i for i, c in enumerate(in_groups) if c[7] == group)
        check(row[4:9] == (GROUP, w_dtype, None, w_count, w_bytes) and row[12] == w_stream,
              f"{where}: (api, dtype, op, count, bytes, stream) {row[4:9] + (row[12],)}, expected "
              f"{(GROUP, w_dtype, None, w_count, w_bytes, w_stream)}")
        check(row[13:] == (None,) * 5, f"{where}: peers {row[13:]}")
        wanted_step = expected_step(first_index) if nvtx else None
        check(row[3] == wanted_step, f"{where}: step {row[3]}, expected {wanted_step}")
        spans = {(r[10], r[11]) for r in members_of.get(group, [])} | {(row[10], row[11])}
        check(len(spans) == 1, f"{where}: it and its members have spans {sorted(spans)}, expected one")
        members = members_of.get(group, [])
        # Issued at the outermost ncclGroupStart, before its members (converted from ticks with the clock
        # calibration of the moment, so within a few microseconds).
        check(all(row[9] <= r[9] + 10_000 for r in members), f"{where}: issued at {row[9]}, after a member "
                                                            f"({min(r[9] for r in members) if members else None})")
    return rows, drops, device


# ---- modes -----------------------------------------------------------------------------------------------

def fake_keys():
    main = fake_unique_id_key(0)
    return {MAIN: main, SPLIT: main + "/split0:3", ALL: "nccl:all#0", CONFIG: fake_unique_id_key(1),
            PAIR0: "nccl:all#1", PAIR1: "nccl:all#1@1"}


def check_host(args, workdir):
    stderr, trace = run_pair(args, workdir, base_environment(), "host")
    if not check(isinstance(trace, str), f"host: expected one trace file, found {trace}"):
        return
    lines = [line for line in stderr.splitlines() if line.startswith("gradscope: ")]
    check(len(lines) <= 1 and all("no GPU timing" in line for line in lines),
          f"host: at most one 'no GPU timing' line expected on stderr: {lines}")
    rows, drops, device = check_trace(trace, "host", fake_keys())
    check(device == "cuda:0", f"host: device {device!r}, expected 'cuda:0' (NCCL's device, no driver to name it)")
    check(not drops.get("gpu_timing"), f"host: gpu_timing drops {drops}")


def check_gpu(args, workdir, label="gpu", extra_env=None, exact=False, host_timed_ok=False):
    """The fake driver's kernels are the calls' spans: within float-millisecond rounding from CUDA events,
    to the nanosecond (`exact`) from CUPTI's kernel records. `host_timed_ok`: calls may also be host-timed,
    as many as the gpu_timing drops say. Returns the rows, the drops, the graph replays (none without CUPTI)
    and the fake driver's counts."""
    # Long enough that the host-timed (graph-captured) call stays far below it on a busy machine.
    kernel_ns = KERNEL_NS
    stats = os.path.join(workdir, "fake-cuda-stats.txt")
    env = dict(base_environment(), GRADSCOPE_FAKE_CUDA=args.fake_cuda, GRADSCOPE_FAKE_KERNEL_NS=str(kernel_ns),
               GRADSCOPE_FAKE_CUDA_STATS=stats, GRADSCOPE_CUPTI="0")
    env.update(extra_env or {})
    stderr, trace = run_pair(args, workdir, env, label)
    if not check(isinstance(trace, str), f"{label}: expected one trace file, found {trace}"):
        return [], {}, []
    check("gradscope: " not in stderr, f"{label}: the agent wrote to stderr: {stderr[-600:]}")
    rows, drops, device = check_trace(trace, label, fake_keys())
    replays = load_replays(trace)
    if env.get("GRADSCOPE_CUPTI") == "0":
        check(not replays, f"{label}: graph replays without CUPTI: {replays}")
    check(device == "cuda:0 Gradscope Fake GPU", f"{label}: device {device!r}")
    host_timed = 0
    # CUPTI spans are the fake kernels' exactly. Event spans are the times at which the fake driver's
    # host thread saw each event reached: it polls every 100 us, and under ThreadSanitizer or a loaded
    # machine it is scheduled late (7 ms seen under TSan beside another test's spinning ranks, 11.7 ms
    # under ASan). A tolerance of 0.9 kernels still tells 1 kernel (at most 1.9) from 3 (at least 2.1).
    early, late = (0, 0) if exact else (EVENT_TOLERANCE_NS, EVENT_LATE_NS)
    reference_width = 1_000_000  # GPU vs host times: the reference's host time is known within its width
    for index, (row, want) in enumerate(rows):
        enqueue, start, end = row[9], row[10], row[11]
        group, captured = want[7], want[8]
        where = f"{label}: call {index}"
        if captured:
            check(end - start < kernel_ns // 2,
                  f"{where} (graph-captured): span {end - start} ns, expected host timing (< {kernel_ns // 2})")
            continue
        kernels = group_kernels(group) if group is not None else 1
        if host_timed_ok and end - start < kernel_ns // 2:
            host_timed += 1
            continue
        check(-early <= (end - start) - kernels * kernel_ns <= late,
              f"{where}: span {end - start} ns, expected {kernels} kernels of {kernel_ns} ns")
        check(start >= enqueue - reference_width, f"{where}: GPU start {start} before the call was made ({enqueue})")
    # Every host-timed call is a drop; so may the group launches' own rows be, which are not among `rows`.
    launches = len(expected_groups(expected_calls(fake=True))) if host_timed else 0
    check(host_timed <= drops.get("gpu_timing", 0) <= host_timed + launches,
          f"{label}: gpu_timing drops {drops}, {host_timed} calls host-timed")
    counts = {}
    with open(stats) as f:
        for line in f:
            name, value = line.split()
            counts[name] = int(value)
    check(counts.get("job_stream_syncs") == 0, f"gpu: the agent synchronised a job stream: {counts}")
    check(counts.get("capture_records") == 0, f"gpu: the agent recorded on a capturing stream: {counts}")
    check(counts.get("streams_created") == 1, f"gpu: the agent created {counts.get('streams_created')} streams, expected 1")
    # Events are pooled: created once, never per call (a timing pair per slot, and one without timing
    # when CUPTI times the calls).
    created = counts.get("events_created", 0)
    check(0 < created <= 3 * 4096 + 256, f"gpu: {created} events created, expected one pool")
    return rows, drops, replays, counts


def group_kernels(group):
    """How many fake kernels long a group's span is: its streams run side by side, each its members'
    kernels one after the other."""
    per_stream = {}
    for c in expected_calls(fake=True):
        if c[7] == group:
            per_stream[c[6]] = per_stream.get(c[6], 0) + 1
    return max(per_stream.values())


def read_kernel_log(path):
    """The fake CUPTI's kernels: [(external id, start, end, graph node)] in launch order."""
    with open(path) as f:
        return [tuple(int(v) for v in line.split()) for line in f if line.strip()]


def check_cupti(args, workdir):
    if not check(args.fake_cupti is not None, "cupti: --fake-cupti is required"):
        return
    library_path = os.path.dirname(args.fake_cupti)
    env_path = library_path + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")

    def fake_cupti(name, **extra):
        os.makedirs(os.path.join(workdir, name))
        log = os.path.join(workdir, name, "kernels.txt")
        return os.path.join(workdir, name), log, dict(LD_LIBRARY_PATH=env_path, GRADSCOPE_FAKE_CUPTI_LOG=log, **extra)

    # 1. CUPTI's kernel records: every span is exactly its kernels' (groups included).
    where, log, env = fake_cupti("records", GRADSCOPE_CUPTI="1")
    rows, drops, replays, counts = check_gpu(args, where, "cupti", env, exact=True)
    check(not drops.get("cupti_record") and not drops.get("graph_replay") and not drops.get("graph_capture"),
          f"cupti: drops {drops}")
    # CUPTI times the calls of communicators of several ranks: one event without timing per call (or per
    # stream of a group) says when its work is done, no timing event. A one-rank communicator's calls record
    # the timing pair (real NCCL runs them without kernels of its own; gpu_timer.h).
    traces = [f for f in os.listdir(where) if f.startswith("trace-") and f.endswith(".db")]
    sizes = {key: size for key, (_, size, _) in load_trace(os.path.join(where, traces[0]))[1].items()}
    launches = {}  # (group or call index) -> (several ranks, distinct streams)
    for index, (row, want) in enumerate(rows):
        if want[8]:
            continue  # graph-captured: host-timed, no event
        several, streams = launches.get(want[7] if want[7] is not None else ("call", index), (True, set()))
        launches[want[7] if want[7] is not None else ("call", index)] = (several and sizes[row[1]] > 1,
                                                                         streams | {want[6]})
    untimed = sum(len(streams) for several, streams in launches.values() if several)
    timed = sum(2 * len(streams) for several, streams in launches.values() if not several)
    check(untimed > 0 and (counts.get("untimed_records"), counts.get("timing_records")) == (untimed, timed),
          f"cupti: {counts}: expected {untimed} events without timing and {timed} timing events")
    check(trace_config(where).get("agent", {}).get("gpu_spans") == "cupti",
          f"cupti: gpu_spans {trace_config(where).get('agent', {}).get('gpu_spans')}")
    kernels = read_kernel_log(log)
    # One kernel per call, but a graph-captured call's at each of its graph's launches; every call the
    # agent times on the GPU carries an id, grouped calls share one; graph kernels carry none, only their
    # node.
    expected = [w for _, w in rows]
    captured = sum(1 for w in expected if w[8])
    check(len(kernels) == len(expected) - captured + captured * GRAPH_LAUNCHES,
          f"cupti: {len(kernels)} fake kernels for {len(expected)} calls, {captured} of them graph-captured")
    ids = [k[0] for k in kernels]
    check([k[3] != 0 for k in kernels if k[0] == 0] == [True] * (captured * GRAPH_LAUNCHES),
          f"cupti: kernels without a correlation id: {kernels}")
    # Each launch of the graph is a replay of each captured call: numbered in launch order, its span its
    # kernel's exactly (a captured group's members share the group's two kernels), after the capture and
    # one after the other on the stream.
    # The captured group's launch is replayed with it, spanning its members' two kernels.
    all_calls = expected_calls(fake=True)
    groups = expected_groups(all_calls)
    _, group_seqs = expected_seqs(all_calls, groups)
    launches = [g for g, (_, launch) in groups.items() if launch[8]]
    check(len(replays) == (captured + len(launches)) * GRAPH_LAUNCHES,
          f"cupti: {len(replays)} graph replays, expected {GRAPH_LAUNCHES} of each of {captured} captured calls "
          f"and {len(launches)} group launches")
    for group in launches:
        key, seq, nbytes = fake_keys()[groups[group][1][0]], group_seqs[group], groups[group][1][5]
        mine = [r for r in replays if (r[0], r[1], r[5]) == (key, seq, GROUP)]
        check([r[2] for r in mine] == list(range(1, GRAPH_LAUNCHES + 1)) and all(r[6] == nbytes for r in mine)
              and all(r[4] - r[3] == 2 * KERNEL_NS for r in mine),
              f"cupti: replays of the captured group's launch ({key} seq {seq}): {mine}")
    for row, want in ((r, w) for r, w in rows if w[8]):
        kernel_span = KERNEL_NS * (2 if want[7] is not None else 1)
        mine = [r for r in replays if (r[0], r[1], numbered_apart(r[5])) == (row[1], row[2], numbered_apart(row[4]))]
        where = f"cupti: replays of call {row[0]} ({row[1]} seq {row[2]})"
        check([r[2] for r in mine] == list(range(1, GRAPH_LAUNCHES + 1)), f"{where}: numbered {[r[2] for r in mine]}")
        check(all((r[5], r[6]) == (row[4], row[8]) for r in mine), f"{where}: api and bytes {mine}, the call's {row}")
        check(all(r[4] - r[3] == kernel_span for r in mine), f"{where}: spans {[r[4] - r[3] for r in mine]}, "
              f"expected its kernels' {kernel_span} ns")
        check(all(r[3] >= row[11] - 1_000_000 for r in mine), f"{where}: a replay starts before the capture ended")
        check(all(a[4] <= b[3] for a, b in zip(mine, mine[1:])), f"{where}: replays overlap: {mine}")
    singles = sum(1 for w in expected if w[7] is None and not w[8])
    groups = len({w[7] for w in expected if w[7] is not None and not w[8]})
    check(len({i for i in ids if i != 0}) <= singles + groups,
          f"cupti: {len(set(ids))} distinct ids for {singles} calls and {groups} groups")

    # 1b. Records delivered late, after the events are seen complete: 0.4 flush intervals after their
    # kernels, so that a flush can bring a group's first kernels without its last; the agent waits for
    # them half an interval (docs/agent.md). Spans stay exact.
    where, _, env = fake_cupti("late", GRADSCOPE_CUPTI="1",
                               GRADSCOPE_FAKE_CUPTI_LATE_NS=str(FLUSH_INTERVAL_NS * 2 // 5))
    late_rows, drops, _, _ = check_gpu(args, where, "cupti-late", env, exact=True)
    check(len(late_rows) == len(rows) and not drops.get("cupti_record"),
          f"cupti-late: {len(late_rows)} calls for {len(rows)}, drops {drops}")

    # 2. GRADSCOPE_CUPTI=0: the events give the same spans (within their rounding); no id is ever pushed.
    where, log, env = fake_cupti("events", GRADSCOPE_CUPTI="0")
    event_rows, _, _, counts = check_gpu(args, where, "cupti=0", env)
    check(counts.get("timing_records", 0) >= 2 * len([w for _, w in event_rows if not w[8] and w[7] is None]),
          f"cupti=0: {counts}: expected a timing pair per call")
    agent = trace_config(where).get("agent", {})
    check((agent.get("gpu_spans"), agent.get("gpu_spans_note")) == ("events", "GRADSCOPE_CUPTI=0"),
          f"cupti=0: gpu_spans {agent}")
    check(not os.path.exists(log) or all(k[0] == 0 for k in read_kernel_log(log)),
          "cupti=0: correlation ids were pushed")
    if len(event_rows) == len(rows):
        for index, ((a, want), (b, _)) in enumerate(zip(rows, event_rows)):
            if not want[8]:
                check(-EVENT_TOLERANCE_NS < (b[11] - b[10]) - (a[11] - a[10]) < EVENT_LATE_NS,
                      f"cupti: call {index}: span {a[11] - a[10]} with CUPTI, {b[11] - b[10]} with events")

    # 3. A pool that runs dry (one record a buffer, buffers never handed back): records are dropped and
    # counted; the calls whose records were lost before the first drop was seen are host-timed (counted),
    # and timing events time every call made after it.
    where, _, env = fake_cupti("dry", GRADSCOPE_CUPTI="1", GRADSCOPE_FAKE_CUPTI_RECORDS_PER_BUFFER="1",
                                GRADSCOPE_FAKE_CUPTI_HOLD="1")
    _, drops, _, counts = check_gpu(args, where, "cupti-dry", env, host_timed_ok=True)
    check(drops.get("cupti_record", 0) > 0, f"cupti-dry: no cupti_record drops counted: {drops}")
    check(counts.get("timing_records", 0) > 0, f"cupti-dry: no timing events after CUPTI dropped records: {counts}")
    check(trace_config(where).get("agent", {}).get("gpu_spans") == "cupti+events",
          f"cupti-dry: gpu_spans {trace_config(where).get('agent')}")


GPU_STEPS, GPU_COMPUTE_MS, GPU_PERIOD_MS, GPU_NCCL_NS = 13, 6, 14, 2_000_000


def check_gpu_steps(args, workdir):
    """gpu_steps_job.cc's known step, through the sampled windows (GRADSCOPE_GPU_WINDOWS=2/4, steps marked by
    GRADSCOPE_STEP_CALLS=2) and merge's step model: steps 1, 2, 5, 6, 9, 10 are inside a window (StepBasis
    Gpu), the others only have their spans; a sampled step's NCCL time is one kernel exposed (after the
    compute kernel on its stream) and one hidden (beside it), to the nanosecond, and the GPU idles for the
    rest of the period. With CUPTI timing the calls and with GRADSCOPE_CUPTI=windows. Built with NVTX (--nvtx),
    the job launches its compute kernels inside a range "forward", which names them (the agent as its NVTX
    injection library)."""
    if not check(args.gpu_steps_job and args.gradscope and args.fake_cuda and args.fake_cupti,
                 "gpu-steps: --gpu-steps-job, --gradscope, --fake-cuda and --fake-cupti are required"):
        return
    library_path = os.path.dirname(args.fake_cupti)
    for cupti in ("1", "windows"):
        where = os.path.join(workdir, cupti)
        os.makedirs(where)
        env = dict(base_environment(), GRADSCOPE_FAKE_CUDA=args.fake_cuda, GRADSCOPE_FAKE_KERNEL_NS=str(GPU_NCCL_NS),
                   LD_LIBRARY_PATH=library_path, GRADSCOPE_CUPTI=cupti, GRADSCOPE_STEP_CALLS="2",
                   GRADSCOPE_GPU_WINDOWS="2/4")
        command = [args.gpu_steps_job, str(GPU_STEPS), str(GPU_COMPUTE_MS), str(GPU_PERIOD_MS)]
        plain = run(command, env, where)
        kernel_log = os.path.join(where, "kernels.txt")
        traced = run(command, dict(env, LD_PRELOAD=preload(args.agent), NVTX_INJECTION64_PATH=args.agent,
                                   GRADSCOPE_OUTPUT=os.path.join(where, "trace-%p.db"),
                                   GRADSCOPE_FAKE_CUPTI_LOG=kernel_log), where)
        label = f"gpu-steps (GRADSCOPE_CUPTI={cupti})"
        check(plain.returncode == 0 and traced.returncode == 0 and plain.stdout == traced.stdout,
              f"{label}: the job's output differs under the agent: {traced.stdout} {traced.stderr[-600:]} / {plain.stdout}")
        check("gradscope: " not in traced.stderr, f"{label}: the agent wrote to stderr: {traced.stderr[-600:]}")
        files = sorted(f for f in os.listdir(where) if f.startswith("trace-") and f.endswith(".db"))
        if not check(len(files) == 1, f"{label}: expected one trace, found {files}"):
            continue
        merged = os.path.join(where, "merged.db")
        result = run([args.gradscope, "merge", os.path.join(where, files[0]), "-o", merged], env, where)
        if not check(result.returncode == 0, f"{label}: merge failed: {result.stderr}"):
            continue
        db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
        run_epoch_ns = db.execute("SELECT epoch_ns FROM runs").fetchone()[0]
        windows = db.execute("SELECT count(*) FROM gpu_activity WHERE kind = 0").fetchone()[0]
        compute_kernels = db.execute("SELECT coalesce(sum(kernels), 0) FROM gpu_activity WHERE kind = 1").fetchone()[0]
        ranges = db.execute("SELECT DISTINCT coalesce(nvtx_range, '') FROM gpu_activity WHERE kind = 1").fetchall()
        rows = db.execute("SELECT step, basis, end_ns - start_ns, compute_ns, exposed_ns, hidden_ns, waiting_ns, "
                          "idle_ns, calls, start_ns FROM steps ORDER BY step").fetchall()
        db.close()
        check(windows == 3, f"{label}: {windows} windows, expected 3 (steps 1-3, 5-7, 9-11)")
        # Each window keeps the compute kernels of its steps and of the step after (open through it).
        check(compute_kernels >= 6, f"{label}: {compute_kernels} compute kernels kept")
        sampled = [r[0] for r in rows if r[1] == 1]
        check(sampled == [1, 2, 5, 6, 9, 10], f"{label}: steps measured on the GPU {sampled}, expected [1, 2, 5, 6, 9, 10]")
        check(all(r[1] == 2 for r in rows if r[0] not in sampled), f"{label}: unsampled rows {rows}")
        check(len(rows) == GPU_STEPS and all(r[8] == 2 for r in rows), f"{label}: steps {rows}")
        # What the fake GPU ran inside each step, from the fake CUPTI's log of every kernel (monotonic clock;
        # the steps are in ns from the run's origin, runs.epoch_ns): a step's span is not its own kernels'
        # alone when the host was late between two launches, e.g. when the next step's compute kernel started
        # well before that step's first NCCL kernel.
        offset = time.time_ns() - time.monotonic_ns() - run_epoch_ns
        ran = [(k[1] + offset, k[2] + offset) for k in read_kernel_log(kernel_log)] \
            if os.path.exists(kernel_log) else []

        def busy_inside(start, end, length=None):
            """The time in [start, end) that kernels (of `length` ns only, when given) ran, overlaps counted once."""
            total, reached = 0, start
            for a, b in sorted((a, b) for a, b in ran if length is None or b - a == length):
                a, b = max(a, reached), min(b, end)
                if b > a:
                    total, reached = total + b - a, b
            return total

        check(len(ran) >= (GPU_STEPS - 1) * 3, f"{label}: {len(ran)} kernels in the fake CUPTI's log")
        measured_compute = []
        for step, basis, span, compute, exposed, hidden, waiting, idle, _, start in rows:
            if basis != 1:
                check(compute == exposed == hidden == idle == 0, f"{label}: step {step} unsampled with a breakdown")
                continue
            where_step = f"{label}: step {step}"
            check(exposed == GPU_NCCL_NS, f"{where_step}: exposed {exposed} ns, expected one NCCL kernel {GPU_NCCL_NS}")
            check(hidden == GPU_NCCL_NS, f"{where_step}: hidden {hidden} ns, expected one NCCL kernel {GPU_NCCL_NS}")
            check(compute + exposed == span and waiting == 0, f"{where_step}: {compute} + {exposed} != {span}")
            busy = busy_inside(start, start + span)
            measured_compute.append(busy_inside(start, start + span, GPU_COMPUTE_MS * 1_000_000))
            # Within 0.1 ms: the test reads the clocks' offset at another time than the agent did.
            check(abs(idle - (span - busy)) < 100_000, f"{where_step}: idle {idle} ns in a span of {span} ns, "
                  f"expected about {span - busy} (the fake GPU ran {busy} ns of kernels in it)")
        report = run([args.gradscope, "report", merged], env, where)
        check(report.returncode == 0 and "GPU idle" in report.stdout, f"{label}: report: {report.stdout[-800:]}")
        if args.nvtx:
            check(ranges == [("forward",)], f"{label}: the compute kernels' NVTX ranges {ranges}, expected forward")
            # A step's span starts at its first NCCL kernel, just after its compute kernel started: each measured
            # step holds its own compute kernel but for those microseconds, and the next step's first ones
            # (more of them when the host was late between the two launches).
            named = re.search(r"GPU compute by NVTX range \(kernels launched inside it, mean per measured step\): "
                              r"forward ([0-9.]+) ms", report.stdout)
            mean_ms = sum(measured_compute) / max(1, len(measured_compute)) / 1e6
            check(named is not None and abs(float(named.group(1)) - mean_ms) < 0.02,
                  f"{label}: the report's NVTX range, expected forward {mean_ms:.2f} ms: {report.stdout[-800:]}")


def check_nvtx(args, workdir):
    if not args.nvtx:
        print("check_nccl: SKIP nvtx: the job was built without NVTX v3 headers")
        return
    env = dict(base_environment(), GRADSCOPE_STEP_NVTX="step", NVTX_INJECTION64_PATH=args.agent)
    plain_env = dict(env)
    _, trace = run_pair(args, workdir, plain_env, "nvtx")
    if check(isinstance(trace, str), f"nvtx: expected one trace file, found {trace}"):
        check_trace(trace, "nvtx", fake_keys(), nvtx=True)


def check_old_nccl(args, workdir):
    """old-nccl: the job on the fake NCCL as 2.27 (--old-nccl: its folder), which lacks ncclAlltoAll,
    ncclGather and ncclScatter. The job asks ncclGetVersion and calls none of them: the trace holds its
    other calls, exactly. Then it probes for ncclAlltoAll with dlsym, as a job might: without the agent it
    finds none; under the agent it finds the agent's, whose two calls fail with ncclInternalError, and the
    agent says so in one line."""
    if not check(args.old_nccl is not None, "old-nccl: --old-nccl is required"):
        return
    env = base_environment()
    env["LD_LIBRARY_PATH"] = args.old_nccl + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    command = [args.job, "--probe-newer"]
    plain = run(command, env, workdir)
    traced = run(command, dict(env, LD_PRELOAD=preload(args.agent),
                               GRADSCOPE_OUTPUT=os.path.join(workdir, "trace-%p.db")), workdir)
    for name, result in (("plain", plain), ("agent", traced)):
        check(result.returncode == 0, f"old-nccl: {name} run exit {result.returncode}: {result.stderr[-800:]}")
    check(traced.stdout == plain.stdout, f"old-nccl: stdout differs under the agent:\n{traced.stdout}\n---\n{plain.stdout}")
    check("alltoall" not in plain.stdout and "nccl_job: done" in plain.stdout,
          f"old-nccl: the job did not run on the 2.27 library: {plain.stdout[-600:]}")
    check(job_lines(plain.stderr) == ["nccl_job: no ncclAlltoAll"], f"old-nccl: plain stderr {plain.stderr[-600:]}")
    internal_error = 3  # ncclInternalError
    check(job_lines(traced.stderr) == [f"nccl_job: ncclAlltoAll returned {internal_error}"] * 2,
          f"old-nccl: the job's lines under the agent: {job_lines(traced.stderr)}")
    agent = [line for line in agent_lines(traced.stderr) if "no GPU timing" not in line]
    check(len(agent) == 1 and "pncclAlltoAll not found in any loaded NCCL library" in agent[0]
          and "ncclInternalError" in agent[0], f"old-nccl: the agent's lines {agent}")
    files = sorted(f for f in os.listdir(workdir) if f.startswith("trace-") and f.endswith(".db"))
    if check(len(files) == 1, f"old-nccl: trace files {files}"):
        check_trace(os.path.join(workdir, files[0]), "old-nccl", fake_keys(), nccl_2_28=False)


def check_disabled(args, workdir):
    env = dict(base_environment(), GRADSCOPE_DISABLE="1")
    stderr, trace = run_pair(args, workdir, env, "disabled")
    check(trace == [], f"disabled: trace files {trace}")
    check("gradscope: " not in stderr, f"disabled: the agent wrote to stderr: {stderr[-400:]}")


# ---- the NCCL profiler plugin ----------------------------------------------------------------------------

UNKNOWN_DTYPE = 254  # NCCL 2.28 names no ncclUint8 ("Unknown"): the plugin's own rows say Other


def fake_choice(nbytes):
    """(algo, proto, channels) the fake NCCL reports for a collective of `nbytes` (NCCL's nBytes) when no
    tuner steers it (fake_nccl.cc fakeChoice, the cheapest entry of its cost table): codes of types.h,
    Tree 0 / Ring 1, LL 0 / LL128 1 / Simple 2."""
    if nbytes <= 1024:
        return (0, 0, 1)
    if nbytes <= 8192:
        return (1, 1, 2)
    return (1, 2, 4)


def plugin_env(args, by_name=False):
    env = base_environment()
    if by_name:
        folder = os.path.dirname(args.profiler)
        env["LD_LIBRARY_PATH"] = folder + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env["NCCL_PROFILER_PLUGIN"] = "gradscope"
    else:
        env["NCCL_PROFILER_PLUGIN"] = args.profiler
    return env


def check_profiler_alone(args, workdir, label, extra_env):
    os.makedirs(workdir)
    env = dict(plugin_env(args), **extra_env)
    plain = run([args.job], base_environment(), workdir)
    traced = run([args.job], dict(env, GRADSCOPE_OUTPUT=os.path.join(workdir, "prof-%p.db")), workdir)
    check(traced.returncode == 0 and traced.stdout == plain.stdout,
          f"{label}: the job's output or status changed under the plugin: {traced.returncode} {traced.stderr[-400:]}")
    check(traced.stderr == "", f"{label}: unexpected stderr: {traced.stderr[-400:]}")
    files = sorted(f for f in os.listdir(workdir) if f.startswith("prof-") and f.endswith(".db"))
    if not check(len(files) == 1, f"{label}: expected one plugin trace, found {files}"):
        return
    path = os.path.join(workdir, files[0])
    check(os.stat(path).st_mode & 0o777 == 0o600, f"{label}: trace mode {oct(os.stat(path).st_mode & 0o777)}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT m.key, c.seq, c.api, c.dtype, c.count, c.bytes, c.enqueue_ns, c.start_ns, c.end_ns, g.algo, g.proto, "
        "g.channels FROM calls c JOIN comms m ON m.id = c.comm_id LEFT JOIN gpu_calls g ON g.call_id = c.id "
        "ORDER BY m.key, c.seq").fetchall()
    run_row = db.execute("SELECT mode, backend, world_size, end_ns, config_json FROM runs").fetchone()
    drops = dict(db.execute("SELECT kind, count FROM drops"))
    db.close()
    check(run_row[:3] == ("observe", BACKEND_NCCL, 1) and run_row[3] is not None, f"{label}: runs row {run_row[:4]}")
    check(not drops, f"{label}: drops {drops}")
    stats = json.loads(run_row[4]).get("profiler", {})
    # NCCL's profiler describes its five tuned collectives with an API code; sends and receives are P2p
    # events, the all-to-all family has no code: the plugin leaves them out.
    expected = [c for c in expected_calls(fake=True) if c[1] in TUNED]
    check(len(rows) == len(expected), f"{label}: {len(rows)} collectives recorded, {len(expected)} made")
    check(stats.get("collectives_recorded") == len(expected) and stats.get("collectives_completed") == len(expected),
          f"{label}: statistics {stats}: every collective recorded and completed expected")
    # Per communicator, the plugin's rows in NCCL's launch order; the job's calls of one communicator, in
    # call order, are the same multiset of shapes (a group's are reordered largest first).
    mine = sorted((r[2], r[3], r[4], r[5], r[9], r[10], r[11]) for r in rows)
    wanted = []
    for comm, api, dtype, op, count, nbytes, *_ in expected:
        if api in (BROADCAST, ALLGATHER):  # NCCL describes these in bytes, as ncclInt8 (ncclInfoSetDerived)
            shown = (INT8, nbytes, nbytes)
        else:  # and has no name for ncclUint8
            shown = (UNKNOWN_DTYPE, count, 0) if dtype == UINT8 else (dtype, count, nbytes)
        wanted.append((api,) + shown + fake_choice(nbytes))
    check(mine == sorted(wanted), f"{label}: rows differ from the calls:\n{mine}\n---\n{sorted(wanted)}")
    for r in rows:
        check(r[6] <= r[7] <= r[8], f"{label}: {r[0]} seq {r[1]}: enqueue {r[6]} launch {r[7]} completion {r[8]}")
    by_comm = {}
    for r in rows:
        by_comm.setdefault(r[0], []).append(r[1])
    for key, seqs in by_comm.items():
        check(seqs == list(range(len(seqs))), f"{label}: {key}: seq {seqs}")
    check(len(by_comm) == 6, f"{label}: communicators {sorted(by_comm)}")
    if args.gradscope:
        report = run([args.gradscope, "report", path], base_environment(), workdir)
        check(report.returncode == 0 and "AllReduce" in report.stdout.replace("allreduce", "AllReduce"),
              f"{label}: gradscope report failed: {report.returncode} {report.stderr[-400:]}")


def check_static(args, workdir):
    """static: nccl_job with the fake NCCL linked into it statically (--static-job), as TensorFlow links its
    own NCCL. Under the agent, which cannot interpose it, and the profiler plugin: the job runs as without
    them, the agent writes nothing, and the plugin records every collective in a trace of its own (what
    profiler checks of it alone), whose run says the agent was loaded but not interposing. Under
    `gradscope run`: the merged trace holds them, and the run says the plugin alone recorded the rank, why,
    and what that path does not record."""
    if not check(args.static_job and args.profiler and args.gradscope,
                 "static: --static-job, --profiler and --gradscope are required"):
        return
    preloaded = os.path.join(workdir, "preload")
    check_profiler_alone(argparse.Namespace(**dict(vars(args), job=args.static_job)), preloaded, "static",
                         {"LD_PRELOAD": preload(args.agent)})
    files = [f for f in os.listdir(preloaded) if f.endswith(".db")]
    if check(len(files) == 1, f"static: one trace expected (the plugin's), found {files}"):
        db = sqlite3.connect(f"file:{os.path.join(preloaded, files[0])}?mode=ro", uri=True)
        config = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0])
        db.close()
        check((config.get("source"), config.get("agent")) == ("nccl-profiler", "not interposing"),
              f"static: the plugin's run config {config}")
    out = os.path.join(workdir, "run")
    env = dict(plugin_env(args), GRADSCOPE_AGENT_PATH=args.agent)
    runtime = sanitizer_runtime(args.agent)
    if runtime:  # a sanitizer build's agent: its runtime first, which gradscope run keeps ahead of the agent
        env["LD_PRELOAD"] = runtime
    result = run([args.gradscope, "run", "-o", out, "--", args.static_job], env, workdir)
    said = result.stdout + result.stderr
    check(result.returncode == 0, f"static: gradscope run exited {result.returncode}: {said[-800:]}")
    check("gradscope: NCCL calls recorded by the NCCL profiler plugin alone on rank 0\n" in said,
          f"static: the run does not say which path recorded rank 0: {said[-1200:]}")
    check("the agent was loaded, but the job's NCCL is linked into it statically" in said,
          f"static: the run does not say why the agent saw nothing: {said[-1200:]}")
    merged = os.path.join(out, "trace.db")
    if check(os.path.exists(merged), f"static: no merged trace in {out}"):
        db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
        collectives = db.execute("SELECT count(*) FROM calls").fetchone()[0]
        db.close()
        wanted = len([c for c in expected_calls(fake=True) if c[1] in TUNED])
        check(collectives == wanted, f"static: {collectives} calls in the merged trace, {wanted} collectives made")


def check_profiler(args, workdir):
    if not check(args.profiler is not None, "profiler: --profiler is required"):
        return
    check_profiler_alone(args, os.path.join(workdir, "v5"), "profiler", {})
    check_profiler_alone(args, os.path.join(workdir, "v4"), "profiler-v4", {"GRADSCOPE_FAKE_PROFILER_V4": "1"})


def check_profiler_agent(args, workdir):
    if not check(args.profiler is not None, "profiler-agent: --profiler is required"):
        return
    env = plugin_env(args, by_name=True)
    _, trace = run_pair(args, workdir, env, "profiler-agent")
    if not check(isinstance(trace, str), f"profiler-agent: expected one trace file, found {trace}"):
        return
    # The run without the agent has the plugin write its own file (default name); the agent's run has
    # one file only (run_pair counts trace-*.db, the template the plugin would also have used).
    others = sorted(f for f in os.listdir(workdir) if f.endswith(".db") and not f.startswith("trace-"))
    check(len(others) == 1 and others[0].startswith("gradscope-nccl-"),
          f"profiler-agent: expected the plain run's plugin file only, found {others}")
    rows, drops, _ = check_trace(trace, "profiler-agent", fake_keys())
    check(not drops.get("nccl_profile"), f"profiler-agent: nccl_profile drops {drops}")
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    facts = {cid: (a, p, ch) for cid, a, p, ch in db.execute("SELECT call_id, algo, proto, channels FROM gpu_calls")}
    db.close()
    comms = set()
    for index, (row, want) in enumerate(rows):
        got = facts.get(row[0])
        got = got if got is None else tuple(-1 if v is None else v for v in got)
        # Sends, receives and the all-to-all family get no report (see check_profiler_alone); a GPU row
        # without NCCL's facts reads (-1, -1, -1).
        wanted = fake_choice(want[5]) if want[1] in TUNED else (-1, -1, -1)
        check((got or (-1, -1, -1)) == wanted, f"profiler-agent: call {index} ({row[1]} seq {row[2]}, group "
                                               f"{want[7]}): NCCL facts {got}, expected {wanted}")
        comms.add(row[1])
    check(len(comms) >= 2, f"profiler-agent: calls on {len(comms)} communicators")


def check_profiler_unset(args, workdir):
    env = base_environment()
    env.pop("NCCL_PROFILER_PLUGIN", None)
    _, trace = run_pair(args, workdir, env, "profiler-unset")
    if not check(isinstance(trace, str), f"profiler-unset: expected one trace file, found {trace}"):
        return
    others = [f for f in os.listdir(workdir) if f.endswith(".db") and not f.startswith("trace-")]
    check(others == [], f"profiler-unset: unexpected files {others}")
    rows, drops, _ = check_trace(trace, "profiler-unset", fake_keys())
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    with_facts = db.execute("SELECT count(*) FROM gpu_calls WHERE algo IS NOT NULL OR proto IS NOT NULL").fetchone()[0]
    db.close()
    check(with_facts == 0, f"profiler-unset: {with_facts} calls carry NCCL facts without a plugin")
    check(not drops.get("nccl_profile"), f"profiler-unset: drops {drops}")


# ---- the NCCL tuner plugin (with the profiler plugin reporting what NCCL chose) ---------------------------

TREE, RING = 0, 1
LL, LL128, SIMPLE = 0, 1, 2
# What the fake NCCL's cost table offers (fake_nccl.cc costTable), algorithm-major: Tree and Ring with every
# protocol; CollNet, NVLS, NVLSTree and PAT are -1 on its one node.
USABLE = [(a, p) for a in (TREE, RING) for p in (LL, LL128, SIMPLE)]


def nccl_bytes(call):
    """NCCL's nBytes for a call of expected_calls(): the larger buffer, the total for AllGather."""
    comm, api, _, _, _, nbytes = call[:6]
    return nbytes * SHAPES[comm][0] if api == ALLGATHER else nbytes


def tuner_env(args, by_name=False, **extra):
    """The profiler plugin by name (as profiler-agent) and the tuner plugin by path, or by name too."""
    env = plugin_env(args, by_name=True)
    if by_name:
        env["LD_LIBRARY_PATH"] = os.path.dirname(args.tuner) + ":" + env["LD_LIBRARY_PATH"]
        env["NCCL_TUNER_PLUGIN"] = "gradscope"
    else:
        env["NCCL_TUNER_PLUGIN"] = args.tuner
    env.update(extra)
    return env


def trace_choices(trace):
    """{call id: (algo, proto, channels)} of the trace's NCCL facts (-1 where NULL)."""
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    facts = {cid: tuple(-1 if v is None else v for v in (a, p, ch))
             for cid, a, p, ch in db.execute("SELECT call_id, algo, proto, channels FROM gpu_calls")}
    db.close()
    return facts


def check_tuned_run(args, workdir, env, label, expect):
    """The job plain and under the agent with `env`; every call row of the agent's trace carries
    expect(index, call of expected_calls()). Returns the rows or None."""
    os.makedirs(workdir, exist_ok=True)
    _, trace = run_pair(args, workdir, env, label)
    if not check(isinstance(trace, str), f"{label}: expected one trace file, found {trace}"):
        return None
    rows, drops, _ = check_trace(trace, label, fake_keys())
    check(not drops.get("nccl_profile"), f"{label}: nccl_profile drops {drops}")
    facts = trace_choices(trace)
    for index, (row, want) in enumerate(rows):
        # Only the five tuned collectives reach the tuner and the profiler's report (check_profiler_alone).
        got = facts.get(row[0], (-1, -1, -1))
        wanted = expect(index, want) if want[1] in TUNED else (-1, -1, -1)
        check(got == wanted, f"{label}: call {index} ({row[1]} seq {row[2]}, api {want[1]}, {want[5]} bytes, "
                             f"group {want[7]}): NCCL facts {got}, expected {wanted}")
    return rows


# tuner-profiler's rules: all-reduces up to 4096 bytes on Ring/Simple with at most 3 channels, larger ones
# on Tree/LL128 with NCCL's channels; the other collectives are left to NCCL.
TUNER_CSV = """# tuner-profiler (check_nccl.py)
# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
allreduce,0,4096,ring,simple,3,-1,-1
allreduce,4097,-1,tree,ll128,-1,-1,-1
"""


def tuner_csv_choice(index, call):
    nbytes = nccl_bytes(call)
    if call[1] != ALLREDUCE:
        return fake_choice(nbytes)
    return (RING, SIMPLE, 3) if nbytes <= 4096 else (TREE, LL128, fake_choice(nbytes)[2])


def check_tuner_profiler(args, workdir):
    """tuner-profiler: NCCL_TUNER_PLUGIN (v5 by path; v4 and v3 by name) with a CSV; the profiler
    reports exactly what the tuner asked for, through the agent's rows."""
    if not check(args.profiler and args.tuner, "tuner-profiler: --profiler and --tuner are required"):
        return
    config = os.path.join(workdir, "tuner.csv")
    with open(config, "w") as f:
        f.write(TUNER_CSV)
    for version, by_name in ((5, False), (4, True), (3, True)):
        env = tuner_env(args, by_name=by_name, GRADSCOPE_TUNER_CONFIG=config)
        if version != 5:
            env["GRADSCOPE_FAKE_TUNER_VERSION"] = str(version)
        check_tuned_run(args, os.path.join(workdir, f"v{version}"), env, f"tuner-profiler-v{version}",
                        tuner_csv_choice)
    # NCCL_TUNER_PLUGIN=none: NCCL's own choices, although a configuration is named.
    env = tuner_env(args, GRADSCOPE_TUNER_CONFIG=config, NCCL_TUNER_PLUGIN="none")
    check_tuned_run(args, os.path.join(workdir, "none"), env, "tuner-profiler-none",
                    lambda i, call: fake_choice(nccl_bytes(call)))


def recommendation(rules):
    return {"format": "gradscope-recommendation", "version": 1, "created": "2026-01-01T00:00:00Z",
            "tool_version": "check_nccl", "backend": "nccl", "world_size": 1, "max_rel_error": 0.0,
            "allow_semantic_change": False,
            "rules": [{"api": "ncclAllReduce", "dtype": dtype, "min_bytes": low, "max_bytes": high, "world_size": 1,
                       "strategy": strategy, "error_class": "lossless", "evidence": 3}
                      for dtype, low, high, strategy in rules]}


def check_tuner_apply(args, workdir):
    """tuner-apply: `gradscope run --mode apply --recommendation plan.json` sets NCCL_TUNER_PLUGIN and
    GRADSCOPE_TUNER_CONFIG itself; the rows carry the recommended algorithm and protocol."""
    if not check(args.profiler and args.tuner and args.gradscope,
                 "tuner-apply: --profiler, --tuner and --gradscope are required"):
        return
    plan = os.path.join(workdir, "plan.json")
    with open(plan, "w") as f:
        json.dump(recommendation([("fp32", 0, 4096, "sum/nccl.ring.simple"),
                                  ("fp32", 4097, 1 << 40, "sum/nccl.tree.ll128")]), f, indent=2)
    env = base_environment()
    for name in ("NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_TUNER_CONFIG_FILE", "NCCL_DEBUG"):
        env.pop(name, None)
    env["GRADSCOPE_AGENT_PATH"] = args.agent
    runtime = sanitizer_runtime(args.agent)
    if runtime:
        env["LD_PRELOAD"] = runtime
    # NCCL_DEBUG=INFO with the TUNING subsystem: the plugin's load line shows which file it read.
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING")
    plain = run([args.job], base_environment(), workdir)
    output = os.path.join(workdir, "out")
    result = run([args.gradscope, "run", "--mode", "apply", "--recommendation", plan, "-o", output, "--", args.job],
                 env, workdir)
    check(result.returncode == 0, f"tuner-apply: gradscope run exit {result.returncode}: {result.stderr[-1500:]}")
    check(result.stdout.startswith(plain.stdout),
          f"tuner-apply: the job's stdout differs from the plain run's:\n{result.stdout[-800:]}")
    loads = [line for line in result.stderr.splitlines() if "gradscope tuner:" in line]
    check(len(loads) == 1 and "NCCL INFO" in loads[0] and "2 rules from" in loads[0] and "plan.json" in loads[0]
          and "(GRADSCOPE_TUNER_CONFIG)" in loads[0],
          f"tuner-apply: expected one INFO line of the plugin loading plan.json, found {loads}")
    check("Successfully loaded external tuner plugin" in result.stderr and "libnccl-tuner-gradscope.so" in result.stderr,
          f"tuner-apply: NCCL did not load the tuner plugin: {result.stderr[-1500:]}")
    agent_lines = [line for line in result.stderr.splitlines() if line.startswith("gradscope: ")]
    with open(os.path.join(workdir, "gradscope-run.stderr"), "w") as f:
        f.write(result.stderr)
    # The agent interposed the job's NCCL and the profiler plugin gave it NCCL's choices: the run says so.
    check("gradscope: NCCL calls recorded by the agent, with NCCL's choices from the profiler plugin on rank 0"
          in agent_lines, f"tuner-apply: the run does not say which path recorded rank 0: {agent_lines}")
    if not os.path.isdir(output):
        check(False, f"tuner-apply: no output directory {output}")
        return
    merged = os.path.join(output, "trace.db")
    if not os.path.exists(merged):
        files = sorted(f for f in os.listdir(output) if f.endswith(".db"))
        merged = os.path.join(output, files[0]) if len(files) == 1 else None
    if not check(merged is not None, f"tuner-apply: no trace in {output}: {os.listdir(output)}"):
        return
    db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
    mode = db.execute("SELECT mode FROM runs").fetchone()
    rows = db.execute("SELECT c.api, c.bytes, g.algo, g.proto, g.channels, m.size FROM calls c "
                      "JOIN comms m ON m.id = c.comm_id LEFT JOIN gpu_calls g ON g.call_id = c.id "
                      f"WHERE c.api IN {TUNED}").fetchall()
    db.close()
    check(mode is not None and mode[0] == "apply", f"tuner-apply: runs.mode {mode}")
    got = sorted((api, nbytes, tuple(-1 if v is None else v for v in (a, p, ch))) for api, nbytes, a, p, ch, _ in rows)
    wanted = []
    for call in (c for c in expected_calls(fake=True) if c[1] in TUNED):
        nbytes = nccl_bytes(call)
        if call[1] == ALLREDUCE:
            choice = (RING, SIMPLE, fake_choice(nbytes)[2]) if nbytes <= 4096 else (TREE, LL128, fake_choice(nbytes)[2])
        else:
            choice = fake_choice(nbytes)
        wanted.append((call[1], call[5], choice))
    check(got == sorted(wanted), f"tuner-apply: rows differ:\n{got}\n---\n{sorted(wanted)}")
    print(f"check_nccl: tuner-apply: the agent's own lines: {agent_lines}")


def explore_choices(usable):
    """{index in expected_calls(): (algo, proto, channels)} under GRADSCOPE_TUNER_EXPLORE=1: per
    communicator, collective and size bucket (bit width of nBytes), the k-th call in launch order gets
    usable[k mod len(usable)]; a group's calls are launched largest first."""
    calls = expected_calls(fake=True)
    order, i = [], 0
    while i < len(calls):
        j = i + 1
        if calls[i][7] is not None:
            while j < len(calls) and calls[j][7] == calls[i][7] and calls[j][0] == calls[i][0]:
                j += 1
        order += sorted(range(i, j), key=lambda k: -nccl_bytes(calls[k]))
        i = j
    counters, result = {}, {}
    for index in order:
        call = calls[index]
        if call[1] not in TUNED:  # never reaches the tuner
            continue
        key = (call[0], call[1], nccl_bytes(call).bit_length())
        k = counters.get(key, 0)
        counters[key] = k + 1
        result[index] = usable[k % len(usable)] + (fake_choice(nccl_bytes(call))[2],)
    return result


def check_tuner_explore(args, workdir):
    """tuner-explore: GRADSCOPE_TUNER_EXPLORE=1 with NCCL_PROTO=^LL128 (4 usable combinations): calls of
    one collective and size bucket walk through them in algorithm-major order, cycling."""
    if not check(args.profiler and args.tuner, "tuner-explore: --profiler and --tuner are required"):
        return
    usable = [(a, p) for a, p in USABLE if p != LL128]
    expected = explore_choices(usable)
    env = tuner_env(args, GRADSCOPE_TUNER_EXPLORE="1", NCCL_PROTO="^LL128")
    rows = check_tuned_run(args, workdir, env, "tuner-explore", lambda index, call: expected[index])
    if rows is None:
        return
    # Spelled out: the 16384-byte all-reduce (alone in its bucket) of steps 0, 1, 2 gets the first three;
    # the 4000-byte one shares its bucket with the grouped 2048-byte one and wraps round in step 2.
    facts = trace_choices(os.path.join(workdir, [f for f in os.listdir(workdir) if f.startswith("trace-")][0]))
    for nbytes, wanted in ((16384, [(TREE, LL), (TREE, SIMPLE), (RING, LL)]),
                           (4000, [(TREE, LL), (RING, LL), (TREE, LL)])):
        got = [facts.get(row[0], (-1, -1, -1))[:2] for row, want in rows if want[1] == ALLREDUCE and want[5] == nbytes]
        check(got == wanted, f"tuner-explore: the {nbytes}-byte all-reduces got {got}, expected {wanted}")


def check_tuner_malformed(args, workdir):
    """tuner-malformed: a configuration with a bad line is refused whole: the job runs unchanged, the rows
    carry NCCL's own choices, and NCCL_DEBUG=WARN shows the plugin's one WARN line."""
    if not check(args.profiler and args.tuner, "tuner-malformed: --profiler and --tuner are required"):
        return
    config = os.path.join(workdir, "bad.csv")
    with open(config, "w") as f:
        f.write("allreduce,0,4096,ring,simple,3,-1,-1\nallreduce,4097,lots,tree,ll128,-1,-1,-1\n")
    env = tuner_env(args, GRADSCOPE_TUNER_CONFIG=config)
    check_tuned_run(args, os.path.join(workdir, "agent"), env, "tuner-malformed",
                    lambda i, call: fake_choice(nccl_bytes(call)))
    plain = run([args.job], base_environment(), workdir)
    warned = run([args.job], dict(env, NCCL_DEBUG="WARN"), workdir)
    check(warned.returncode == 0 and warned.stdout == plain.stdout,
          f"tuner-malformed: the job changed under NCCL_DEBUG=WARN: {warned.returncode} {warned.stderr[-600:]}")
    lines = warned.stderr.splitlines()
    warns = [line for line in lines if "NCCL WARN" in line]
    check(len(warns) == 1 and len(lines) == 1, f"tuner-malformed: expected one WARN line on stderr, found {lines}")
    if warns:
        check(re.search(r"NCCL WARN gradscope tuner: .*bad\.csv:2: .*; no rule applied, NCCL keeps its own choices$",
                        warns[0]) is not None, f"tuner-malformed: WARN line {warns[0]!r}")


# ---- explore and apply through the fake extension (fake_extension.cc) ------------------------------------

FLOAT_TYPES = (FP32, FP64, BF16, 6)  # 6: fp16
SHADOW_SAMPLES = 2


def shadow_setup(args, workdir, mode, **settings):
    """A folder with a link to the agent and the fake extension beside it (where the agent looks for
    libgradscope-agent-nccl.so); returns (args with that agent, environment, the extension's log)."""
    folder = os.path.join(workdir, "lib")
    os.makedirs(folder)
    os.symlink(args.agent, os.path.join(folder, "libgradscope-agent.so"))
    os.symlink(args.fake_extension, os.path.join(folder, "libgradscope-agent-nccl.so"))
    log = os.path.join(workdir, "extension.log")
    env = dict(base_environment(), GRADSCOPE_FAKE_CUDA=args.fake_cuda, GRADSCOPE_FAKE_KERNEL_NS="100000",
               GRADSCOPE_CUPTI="0", GRADSCOPE_MODE=mode, GRADSCOPE_FAKE_EXTENSION_LOG=log)
    env.update(settings)
    shadow_args = argparse.Namespace(**vars(args))
    shadow_args.agent = os.path.join(folder, "libgradscope-agent.so")
    return shadow_args, env, log


def explorable(call):
    return call[1] == ALLREDUCE and call[3] == SUM and call[2] in FLOAT_TYPES and not call[8]


def expected_sampled():
    """Indices in expected_calls() that ExplorePlan samples with WARMUP 0, SAMPLES 2, SPACING 1: the first
    two of each (communicator, dtype, size bucket)."""
    seen, sampled = {}, []
    for index, call in enumerate(expected_calls(fake=True)):
        if not explorable(call):
            continue
        key = (call[0], call[2], call[5].bit_length() - 1)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= SHADOW_SAMPLES:
            sampled.append(index)
    return sampled


def extension_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def check_joins(log, label):
    """One join per communicator with a float sum all-reduce, before anything else on it."""
    joined = [entry[1] for entry in log if entry[0] == "join"]
    check(len(joined) == len(set(joined)) == 4, f"{label}: joins {joined}, expected one for each of 4 communicators")
    first = {}
    for position, entry in enumerate(log):
        if entry[0] in ("join", "capture", "explore", "apply"):
            first.setdefault(entry[1], (position, entry[0]))
    check(all(kind == "join" for _, kind in first.values()), f"{label}: a communicator was used before it joined: {log}")
    # The job destroys every communicator but the last to join (CONFIG), which it aborts: that one keeps
    # its duplicate (docs/agent.md).
    forgotten = [entry[1] for entry in log if entry[0] == "forget"]
    check(sorted(forgotten) == sorted(joined[:-1]), f"{label}: forgotten {forgotten}, joined {joined}")


def check_shadow_explore(args, workdir):
    if not check(args.fake_extension and args.fake_cuda, "shadow-explore: --fake-extension and --fake-cuda are required"):
        return
    shadow_args, env, log_path = shadow_setup(args, workdir, "explore", GRADSCOPE_EXPLORE_WARMUP="0",
                                              GRADSCOPE_EXPLORE_SAMPLES=str(SHADOW_SAMPLES),
                                              GRADSCOPE_EXPLORE_REPS="3", GRADSCOPE_EXPLORE_WARMUP_REPS="1",
                                              GRADSCOPE_EXPLORE_BUDGET="1")
    stderr, trace = run_pair(shadow_args, workdir, env, "shadow-explore")
    if not check(isinstance(trace, str), f"shadow-explore: expected one trace file, found {trace}"):
        return
    check("gradscope: " not in stderr, f"shadow-explore: the agent wrote to stderr: {stderr[-600:]}")
    # The duplicates and their calls are not the job's: the communicators and calls are exactly the job's.
    rows, _, _ = check_trace(trace, "shadow-explore", fake_keys())
    log = extension_log(log_path)
    check_joins(log, "shadow-explore")
    sampled = expected_sampled()
    check(sum(entry[0] == "explore" for entry in log) == len(sampled) == sum(entry[0] == "capture" for entry in log),
          f"shadow-explore: {len(sampled)} calls should be explored; the extension saw {log}")
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    mode = db.execute("SELECT mode FROM runs").fetchone()[0]
    measured = db.execute("SELECT call_id, strategy, reps, rel_l2_error, world, bytes FROM measurements "
                          "ORDER BY call_id, strategy").fetchall()
    consensus = db.execute("SELECT call_id, cosine_to_mean, diversity FROM consensus ORDER BY call_id").fetchall()
    db.close()
    check(mode == "explore", f"shadow-explore: runs.mode {mode!r}")
    ids = {index: row[0] for index, (row, _) in enumerate(rows)}
    calls = expected_calls(fake=True)
    wanted = [(ids[i], strategy, 3, 0.0, 1, calls[i][5]) for i in sampled for strategy in ("sum/native", "sum/rs_ag")
              if i in ids]
    check(measured == wanted, f"shadow-explore: measurements\n{measured}\n--- expected\n{wanted}")
    wanted_consensus = [(ids[i], 1.0, 1.0) for i in sampled if calls[i][2] == FP32 and i in ids]
    check(consensus == wanted_consensus, f"shadow-explore: consensus rows {consensus}, expected {wanted_consensus}")
    check(any(calls[i][7] is not None for i in sampled), "shadow-explore: no group member among the explored calls")
    if args.gradscope:
        report = run([args.gradscope, "report", trace], base_environment(), workdir)
        check(report.returncode == 0 and "sum/rs_ag" in report.stdout,
              f"shadow-explore: gradscope report: {report.returncode} {report.stdout[-800:]} {report.stderr[-400:]}")


def check_shadow_apply(args, workdir):
    if not check(args.fake_extension and args.fake_cuda, "shadow-apply: --fake-extension and --fake-cuda are required"):
        return
    plan = os.path.join(workdir, "plan.json")
    os.makedirs(workdir, exist_ok=True)
    with open(plan, "w") as f:
        json.dump(recommendation([("fp32", 0, 32, "sum/rs_ag"), ("fp32", 33, 64, "sum/reduce_bcast"),
                                  ("fp32", 65, 2048, "sum/rs_ag"), ("fp32", 2049, 1 << 40, "sum/nccl.ring.simple")]),
                  f, indent=2)
    shadow_args, env, log_path = shadow_setup(args, workdir, "apply", GRADSCOPE_RECOMMENDATION=plan)
    stderr, trace = run_pair(shadow_args, workdir, env, "shadow-apply")
    if not check(isinstance(trace, str), f"shadow-apply: expected one trace file, found {trace}"):
        return
    lines = [line for line in stderr.splitlines() if line.startswith("gradscope: ")]
    refused = [line for line in lines if "sum/reduce_bcast" in line]
    check(len(refused) == 1 and "the fake extension refuses sum/reduce_bcast" in refused[0]
          and "run untouched" in refused[0] and len(lines) == 1,
          f"shadow-apply: expected one line about sum/reduce_bcast, got {lines}")
    calls = expected_calls(fake=True)
    # The 64-byte call's rule is refused, the 4000-byte calls' is the tuner plugin's (not loaded here).
    applied_indices = [i for i, call in enumerate(calls)
                       if explorable(call) and call[2] == FP32 and call[5] <= 2048 and call[5] != 64]
    rows, _, _ = check_trace(trace, "shadow-apply", fake_keys(), outside_groups=applied_indices)
    log = extension_log(log_path)
    check_joins(log, "shadow-apply")
    ids = {index: row[0] for index, (row, _) in enumerate(rows)}
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    applied = db.execute("SELECT call_id, strategy FROM applied_calls ORDER BY call_id").fetchall()
    db.close()
    wanted = [(ids[i], "sum/rs_ag") for i in applied_indices if i in ids]
    check(applied == wanted, f"shadow-apply: applied_calls {applied}, expected {wanted}")
    check(any(calls[i][7] is not None for i in applied_indices), "shadow-apply: no group member among the applied calls")
    check(sum(entry[0] == "apply" for entry in log) == len(applied_indices),
          f"shadow-apply: the extension applied {sum(entry[0] == 'apply' for entry in log)} calls, expected "
          f"{len(applied_indices)}: {log}")


def check_real(args, workdir, nvtx=False):
    env = base_environment()
    label = "real-nvtx" if nvtx else "real"
    if nvtx:
        env.update(GRADSCOPE_STEP_NVTX="step", NVTX_INJECTION64_PATH=args.agent)
    stderr, trace = run_pair(args, workdir, env, label)
    if not check(isinstance(trace, str), f"{label}: expected one trace file, found {trace}"):
        return
    check("gradscope: " not in stderr, f"{label}: the agent wrote to stderr: {stderr[-600:]}")
    calls, comms, _, _, _ = load_trace(trace)
    agent = trace_config(workdir).get("agent", {})
    print(f"check_nccl: {label}: GPU spans from {agent.get('gpu_spans')} ({agent.get('gpu_spans_note', '')})")
    ids = sorted(k for k in comms if re.fullmatch(r"nccl:[0-9a-f]{16}", k))
    # The first unique id made the first communicator: its key is the one with the most calls.
    by_key = {}
    for row in calls:
        by_key[row[1]] = by_key.get(row[1], 0) + 1
    if check(len(ids) == 2, f"{label}: communicator keys {sorted(comms)}"):
        main = max(ids, key=lambda k: by_key.get(k, 0))
        config = min(ids, key=lambda k: by_key.get(k, 0))
        keys = {MAIN: main, SPLIT: main + "/split0:3", ALL: "nccl:all#0", CONFIG: config}
        rows, drops, device = check_trace(trace, label, keys, nvtx=nvtx)
        check(device.startswith("cuda:"), f"{label}: device {device!r}")
        check(not drops.get("gpu_timing"), f"{label}: gpu_timing drops {drops}")
        # Spans are positive and start after the call was made (GPU spans; the graph-captured call's is the host's).
        for index, (row, want) in enumerate(rows):
            enqueue, start, end = row[9], row[10], row[11]
            check(end > start and start >= enqueue - 100_000,
                  f"{label}: call {index}: enqueue {enqueue} start {start} end {end}")
        # The job's communicators have one rank each: NCCL captures a copy, not a kernel of its own, so the
        # captured calls have no replays to trace (real-pair-graph checks replays on two ranks).
        replays = load_replays(trace)
        check(not replays, f"{label}: replays of one-rank communicators' captured calls: {replays}")
        if args.gradscope:
            report = run([args.gradscope, "report", trace], env, workdir)
            check(report.returncode == 0, f"{label}: gradscope report failed: {report.stderr[-400:]}")
            with open(os.path.join(workdir, "report.txt"), "w") as f:
                f.write(report.stdout)


# ---- two ranks on one GPU (nccl_pair.cc, scripts/gpu_check.sh) --------------------------------------------

PAIR_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]  # nccl_pair.cc's all-reduces, in the order of each step
PAIR_STEPS = 5

# real-pair's rules: the opposite of what NCCL picks by itself on two ranks (LL for small buffers,
# Simple for large ones), on Ring, which every communicator can use.
PAIR_CSV = """# real-pair (check_nccl.py)
allreduce,0,65536,ring,simple,-1,-1,-1
allreduce,65537,-1,ring,ll,-1,-1,-1
"""


def pair_rows(trace):
    """[(rank, seq, api, bytes, (algo, proto, channels))] of one rank's trace, in seq order."""
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT m.comm_rank, c.seq, c.api, c.bytes, g.algo, g.proto, g.channels FROM calls c "
        "JOIN comms m ON m.id = c.comm_id LEFT JOIN gpu_calls g ON g.call_id = c.id ORDER BY c.seq").fetchall()
    drops = dict(db.execute("SELECT kind, count FROM drops"))
    db.close()
    return [(r, seq, api, nbytes, tuple(-1 if v is None else v for v in (a, p, ch)))
            for r, seq, api, nbytes, a, p, ch in rows], drops


def run_real_pair(args, workdir, env, label, nccl_ran=True):
    """nccl-pair plain and under the agent with `env`; returns {rank: rows} of the two rank traces.
    `nccl_ran`: NCCL ran the job's calls (not so when a plan replaced them), so each carries its choice."""
    os.makedirs(workdir, exist_ok=True)
    plain = run([args.job, "--steps", str(PAIR_STEPS)], env, workdir, timeout=300)
    check(plain.returncode == 0, f"{label}: the job fails without the agent ({plain.returncode}): {plain.stderr[-800:]}")
    agent_env = dict(env, LD_PRELOAD=preload(args.agent), GRADSCOPE_OUTPUT=os.path.join(workdir, "trace-%p.db"))
    traced = run([args.job, "--steps", str(PAIR_STEPS)], agent_env, workdir, timeout=300)
    check(traced.returncode == 0, f"{label}: exit status {traced.returncode} under the agent: {traced.stderr[-800:]}")
    # The ranks print concurrently: the same lines, in either order.
    check(sorted(traced.stdout.splitlines()) == sorted(plain.stdout.splitlines()),
          f"{label}: stdout differs under the agent:\n{traced.stdout}\n---\n{plain.stdout}")
    for rank in (0, 1):
        check(f"rank {rank}: done, {PAIR_STEPS} steps x 4 all-reduces, wrong 0" in traced.stdout,
              f"{label}: rank {rank} did not finish with exact sums: {traced.stdout[-600:]}")
    files = sorted(f for f in os.listdir(workdir) if f.startswith("trace-") and f.endswith(".db"))
    if not check(len(files) == 2, f"{label}: expected two rank traces, found {files}"):
        return None
    by_rank = {}
    for name in files:
        rows, drops = pair_rows(os.path.join(workdir, name))
        check(not drops, f"{label}: {name}: drops {drops}")
        if rows:
            by_rank[rows[0][0]] = rows
    if not check(sorted(by_rank) == [0, 1], f"{label}: ranks {sorted(by_rank)} in the traces"):
        return None
    for rank, rows in by_rank.items():
        wanted = [(ALLREDUCE, nbytes) for _ in range(PAIR_STEPS) for nbytes in PAIR_SIZES]
        check([(api, nbytes) for _, _, api, nbytes, _ in rows] == wanted,
              f"{label}: rank {rank}: calls {[(api, nbytes) for _, _, api, nbytes, _ in rows]}")
        if nccl_ran:
            check(all(choice[0] >= 0 and choice[1] >= 0 and choice[2] > 0 for *_, choice in rows),
                  f"{label}: rank {rank}: calls without NCCL's algorithm, protocol or channels: "
                  f"{[choice for *_, choice in rows]}")
    check([row[4] for row in by_rank[0]] == [row[4] for row in by_rank[1]],
          f"{label}: the ranks' choices differ:\n{[row[4] for row in by_rank[0]]}\n{[row[4] for row in by_rank[1]]}")
    summary = {nbytes: sorted({row[4] for row in by_rank[0] if row[3] == nbytes}) for nbytes in PAIR_SIZES}
    print(f"check_nccl: {label}: (algo, proto, channels) per size on rank 0: {summary}")
    return by_rank


def check_real_pair(args, workdir):
    """real-pair: two ranks on one GPU (NCCL_HOSTID per rank, sockets over loopback) under the agent with
    the profiler plugin: every call carries NCCL's choice, the same on both ranks; then the tuner plugin
    with PAIR_CSV: every call carries the rule's algorithm and protocol; then `gradscope run`."""
    if not check(args.profiler and args.tuner and args.gradscope,
                 "real-pair: --profiler, --tuner and --gradscope are required"):
        return
    own = run_real_pair(args, os.path.join(workdir, "own"), plugin_env(args), "real-pair")
    config = os.path.join(workdir, "pair.csv")
    with open(config, "w") as f:
        f.write(PAIR_CSV)
    tuned = run_real_pair(args, os.path.join(workdir, "tuned"),
                          dict(plugin_env(args), NCCL_TUNER_PLUGIN=args.tuner, GRADSCOPE_TUNER_CONFIG=config),
                          "real-pair-tuned")
    if tuned:
        for rank, rows in tuned.items():
            for _, seq, _, nbytes, choice in rows:
                wanted = (RING, SIMPLE) if nbytes <= 65536 else (RING, LL)
                check(choice[:2] == wanted, f"real-pair-tuned: rank {rank} seq {seq} ({nbytes} bytes): "
                                            f"NCCL used {choice[:2]}, the tuner asked for {wanted}")
    if own and tuned:
        check(any(a[4][:2] != b[4][:2] for a, b in zip(own[0], tuned[0])),
              "real-pair: the tuner's rules are what NCCL chose anyway: the check proves nothing")
    # gradscope run: the launcher process records nothing, the two ranks' files merge into one trace.
    env = base_environment()
    env["GRADSCOPE_AGENT_PATH"] = args.agent
    output = os.path.join(workdir, "run")
    result = run([args.gradscope, "run", "-o", output, "--", args.job, "--steps", str(PAIR_STEPS)], env, workdir,
                 timeout=300)
    check(result.returncode == 0, f"real-pair: gradscope run exit {result.returncode}: {result.stderr[-1500:]}")
    merged = os.path.join(output, "trace.db")
    if check(os.path.exists(merged), f"real-pair: gradscope run wrote no {merged}: {result.stderr[-800:]}"):
        db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
        ranks = db.execute("SELECT COUNT(*) FROM ranks").fetchone()[0]
        calls = db.execute("SELECT COUNT(*), COUNT(g.algo) FROM calls c LEFT JOIN gpu_calls g ON g.call_id = c.id"
                           ).fetchone()
        db.close()
        check(ranks == 2 and calls == (2 * PAIR_STEPS * 4,) * 2,
              f"real-pair: gradscope run's trace: {ranks} ranks, (calls, calls with NCCL's algorithm) {calls}")
        with open(os.path.join(workdir, "run-report.txt"), "w") as f:
            f.write(result.stdout + result.stderr)


def run_pair_extra(args, workdir, flag, label, done):
    """nccl-pair --steps 1 FLAG under the agent: each rank must print "rank R: DONE, wrong 0". Returns the
    two rank traces' paths ([] when there are not two)."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(base_environment(), LD_PRELOAD=preload(args.agent), GRADSCOPE_OUTPUT=os.path.join(workdir, "trace-%p.db"))
    result = run([args.job, "--steps", "1", flag], env, workdir, timeout=300)
    check(result.returncode == 0, f"{label}: exit status {result.returncode}: {result.stderr[-800:]}")
    for rank in (0, 1):
        check(f"rank {rank}: {done}, wrong 0" in result.stdout, f"{label}: rank {rank}: {result.stdout[-600:]}")
    files = sorted(f for f in os.listdir(workdir) if f.startswith("trace-") and f.endswith(".db"))
    if not check(len(files) == 2, f"{label}: expected two rank traces, found {files}"):
        return []
    return [os.path.join(workdir, name) for name in files]


def check_real_pair_graph(args, workdir):
    """real-pair-graph: nccl-pair --graph under the agent (CUPTI's spans): on each rank, the 64 KiB
    all-reduce captured into a CUDA graph is host-timed, and each of the graph's 3 launches is a replay
    of it, numbered in launch order, spanning NCCL's kernels, after the capture and one after the other."""
    for trace in run_pair_extra(args, workdir, "--graph", "real-pair-graph", f"graph: {GRAPH_LAUNCHES} launches"):
        db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
        rank = db.execute("SELECT rank FROM ranks").fetchone()[0]
        agent = json.loads(db.execute("SELECT config_json FROM runs").fetchone()[0]).get("agent", {})
        captured = db.execute("SELECT m.key, c.seq, c.start_ns, c.end_ns FROM calls c JOIN comms m ON m.id = c.comm_id "
                              "LEFT JOIN gpu_calls g ON g.call_id = c.id WHERE c.api = ? AND c.bytes = ? "
                              "AND g.replay IS NULL ORDER BY c.seq DESC LIMIT 1", (ALLREDUCE, 64 << 10)).fetchone()
        db.close()
        print(f"check_nccl: real-pair-graph: rank {rank}: GPU spans from {agent.get('gpu_spans')} "
              f"({agent.get('gpu_spans_note', '')})")
        mine = [r for r in load_replays(trace) if captured and (r[0], r[1]) == (captured[0], captured[1])]
        where = f"real-pair-graph: rank {rank}: replays of the captured call {captured}"
        check([r[2] for r in mine] == list(range(1, GRAPH_LAUNCHES + 1)), f"{where}: {mine}")
        check(all(r[4] > r[3] >= captured[3] - 100_000 for r in mine), f"{where}: spans {mine}")
        check(all(a[4] <= b[3] for a, b in zip(mine, mine[1:])), f"{where}: overlap: {mine}")


def check_real_pair_p2p(args, workdir):
    """real-pair-p2p: nccl-pair --p2p under the agent: two ranks exchange 256 KiB each way, first as a send
    and a receive on their own, then in one group; every element checked. Each rank's trace holds its two
    sends and two receives, with the peer, the bytes and a GPU span, and the group's launch."""
    for trace in run_pair_extra(args, workdir, "--p2p", "real-pair-p2p", "p2p: 2 exchanges"):
        db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
        rank = db.execute("SELECT rank FROM ranks").fetchone()[0]
        rows = db.execute("SELECT c.api, c.bytes, p.dest, p.source, c.start_ns, c.end_ns FROM calls c "
                          "LEFT JOIN peer_calls p ON p.call_id = c.id WHERE c.api IN (?, ?, ?) ORDER BY c.id",
                          (SEND, RECV, GROUP)).fetchall()
        db.close()
        peer = 1 - rank
        sends = [r for r in rows if r[0] == SEND]
        receives = [r for r in rows if r[0] == RECV]
        where = f"real-pair-p2p: rank {rank}"
        check(len(sends) == 2 and all(r[1] == 256 << 10 and r[2] == peer for r in sends), f"{where}: sends {sends}")
        check(len(receives) == 2 and all(r[1] == 256 << 10 and r[3] == peer for r in receives),
              f"{where}: receives {receives}")
        check(sum(1 for r in rows if r[0] == GROUP) == 1, f"{where}: group launches {rows}")
        check(all(r[5] > r[4] for r in sends + receives), f"{where}: spans {sends + receives}")


def check_real_pair_explore(args, workdir):
    """real-pair-explore: GRADSCOPE_TUNER_EXPLORE=1: each size's calls walk through NCCL's usable
    algorithm/protocol pairs, in the same order on both ranks."""
    if not check(args.profiler and args.tuner, "real-pair-explore: --profiler and --tuner are required"):
        return
    env = dict(plugin_env(args), NCCL_TUNER_PLUGIN=args.tuner, GRADSCOPE_TUNER_EXPLORE="1")
    rows = run_real_pair(args, workdir, env, "real-pair-explore")
    if rows:
        for nbytes in PAIR_SIZES:
            walk = [row[4][:2] for row in rows[0] if row[3] == nbytes]
            check(len(set(walk)) >= 2, f"real-pair-explore: the {nbytes}-byte calls all used {walk}")


LOSSLESS_PREFIXES = ("sum/native", "sum/rs_ag", "sum/reduce_bcast", "sum/hier", "sum/nccl.")


def check_real_pair_shadow(args, workdir):
    """real-pair-shadow: explore and apply over the real NCCL extension (libgradscope-agent-nccl.so beside
    the agent), two ranks on one GPU. Explore: the first two calls of each size are explored on both
    ranks alike, every strategy measured on each, the lossless ones exact (the inputs are small integers),
    and the async strategies' errors follow each site into its next steps; the job's sums stay exact. Apply: a sum/rs_ag/bf16 plan replaces every call (exact on these inputs
    too: every value and partial sum fits bf16), applied_calls says so on both ranks."""
    if not check(args.profiler, "real-pair-shadow: --profiler is required"):
        return
    explore_env = dict(plugin_env(args), GRADSCOPE_MODE="explore", GRADSCOPE_EXPLORE_WARMUP="0",
                       GRADSCOPE_EXPLORE_SAMPLES="2", GRADSCOPE_EXPLORE_REPS="5", GRADSCOPE_EXPLORE_BUDGET="1")
    explore_dir = os.path.join(workdir, "explore")
    if run_real_pair(args, explore_dir, explore_env, "real-pair-shadow-explore"):
        measured = {}
        for name in sorted(f for f in os.listdir(explore_dir) if f.startswith("trace-")):
            db = sqlite3.connect(f"file:{os.path.join(explore_dir, name)}?mode=ro", uri=True)
            rank = db.execute("SELECT rank FROM ranks").fetchone()[0]
            rows = db.execute("SELECT c.seq, c.bytes, m.strategy, m.rel_l2_error, m.median_ns, m.algbw_gbs "
                              "FROM measurements m JOIN calls c ON c.id = m.call_id ORDER BY c.seq, m.strategy"
                              ).fetchall()
            config = db.execute("SELECT config_json FROM runs").fetchone()[0]
            begin, end = db.execute("SELECT start_ns, end_ns FROM runs").fetchone()
            db.close()
            measured[rank] = rows
            shadow = json.loads(config).get("agent", {}).get("shadow", {})
            spent = shadow.get("explore_ns", 0)
            print(f"check_nccl: real-pair-shadow: rank {rank}: {shadow}; exploring took {spent / 1e6:.1f} ms "
                  f"of a {(end - begin) / 1e6:.1f} ms run ({100.0 * spent / max(end - begin, 1):.1f}%)")
        if check(sorted(measured) == [0, 1], f"real-pair-shadow: ranks with measurements {sorted(measured)}"):
            # The first two calls of each size are explored; the async strategies' errors follow the sites
            # into the next steps (their rows have no time: the step model replays what they save).
            seqs = sorted({row[0] for row in measured[0] if not row[2].startswith("async/")})
            check(seqs == list(range(2 * len(PAIR_SIZES))), f"real-pair-shadow: explored seqs {seqs}")
            check([row[:3] for row in measured[0]] == [row[:3] for row in measured[1]],
                  "real-pair-shadow: the ranks measured different calls or strategies")
            strategies = sorted({row[2] for row in measured[0]})
            check({"sum/native", "sum/rs_ag", "sum/native/bf16"} <= set(strategies),
                  f"real-pair-shadow: strategies measured {strategies}")
            followed = {(row[0], row[2]) for row in measured[0] if row[2].startswith("async/")}
            check({(len(PAIR_SIZES), "async/stale1"), (len(PAIR_SIZES), "async/dga1")} <= followed,
                  f"real-pair-shadow: async errors at {sorted(followed)}, expected stale1 and dga1 at seq "
                  f"{len(PAIR_SIZES)} (the first size's second step)")
            for rank, rows in measured.items():
                for seq, nbytes, strategy, error, median, _ in rows:
                    timed = not strategy.startswith("async/")
                    check(median > 0 if timed else median == 0 and error == error,
                          f"real-pair-shadow: rank {rank} seq {seq} {strategy}: median {median}, error {error}")
                    if strategy.startswith(LOSSLESS_PREFIXES) and strategy.count("/") == 1:
                        check(error == 0, f"real-pair-shadow: rank {rank} seq {seq} {strategy}: rel error {error}")
            largest = max(PAIR_SIZES)
            table = sorted((median, strategy, algbw) for seq, nbytes, strategy, _, median, algbw in measured[0]
                           if nbytes == largest and seq == max(s for s, b, *_ in measured[0] if b == largest))
            print(f"check_nccl: real-pair-shadow: {largest} bytes on rank 0, median us and algbw GB/s:")
            for median, strategy, algbw in table:
                print(f"check_nccl:   {strategy:28s} {median / 1e3:10.1f} {algbw:8.2f}")

    plan = os.path.join(workdir, "plan.json")
    os.makedirs(workdir, exist_ok=True)
    rules = recommendation([("fp32", 0, 1 << 40, "sum/rs_ag/bf16")])
    rules.update(world_size=2, max_rel_error=0.01)
    for rule in rules["rules"]:
        rule.update(world_size=2, error_class="lossy")
    with open(plan, "w") as f:
        json.dump(rules, f, indent=2)
    apply_dir = os.path.join(workdir, "apply")
    apply_env = dict(plugin_env(args), GRADSCOPE_MODE="apply", GRADSCOPE_RECOMMENDATION=plan)
    # The plan's strategy replaces every call: NCCL never sees the job's own, so they carry no choice.
    if run_real_pair(args, apply_dir, apply_env, "real-pair-shadow-apply", nccl_ran=False):
        for name in sorted(f for f in os.listdir(apply_dir) if f.startswith("trace-")):
            db = sqlite3.connect(f"file:{os.path.join(apply_dir, name)}?mode=ro", uri=True)
            applied = db.execute("SELECT strategy, COUNT(*) FROM applied_calls GROUP BY strategy").fetchall()
            db.close()
            check(applied == [("sum/rs_ag/bf16", PAIR_STEPS * len(PAIR_SIZES))],
                  f"real-pair-shadow: {name}: applied calls {applied}")
    check_real_pair_async(args, workdir)


def check_real_pair_async(args, workdir):
    """real-pair-shadow, async: apply mode with an async/stale1 plan, then async/dga1, on every call; the job
    checks each call's result against what the strategy must return (nccl-pair --expect: the first step
    synchronous, then the site's sum of the step before, or dga's correction of it), bit for bit, so
    `wrong 0` on both ranks is the proof; applied_calls names the strategy for every call."""
    for strategy, expect in (("async/stale1", "stale1"), ("async/dga1", "dga1")):
        label = f"real-pair-shadow ({strategy})"
        plan = os.path.join(workdir, f"plan-{expect}.json")
        rules = recommendation([("fp32", 0, 1 << 40, strategy)])
        rules.update(world_size=2, allow_semantic_change=True)
        for rule in rules["rules"]:
            rule.update(world_size=2, error_class="semantic")
        with open(plan, "w") as f:
            json.dump(rules, f, indent=2)
        out = os.path.join(workdir, f"apply-{expect}")
        os.makedirs(out, exist_ok=True)
        env = dict(plugin_env(args), GRADSCOPE_MODE="apply", GRADSCOPE_RECOMMENDATION=plan,
                   GRADSCOPE_ALLOW_SEMANTIC_CHANGE="1", LD_PRELOAD=preload(args.agent),
                   GRADSCOPE_OUTPUT=os.path.join(out, "trace-%p.db"))
        result = run([args.job, "--steps", str(PAIR_STEPS), "--expect", expect], env, out, timeout=300)
        check(result.returncode == 0, f"{label}: exit status {result.returncode}: {result.stdout[-600:]} "
              f"{result.stderr[-1200:]}")
        for rank in (0, 1):
            check(f"rank {rank}: done, {PAIR_STEPS} steps x 4 all-reduces, wrong 0" in result.stdout,
                  f"{label}: rank {rank}: results not what {strategy} returns: {result.stdout[-600:]}")
        files = sorted(f for f in os.listdir(out) if f.startswith("trace-") and f.endswith(".db"))
        check(len(files) == 2, f"{label}: expected two rank traces, found {files}")
        for name in files:
            db = sqlite3.connect(f"file:{os.path.join(out, name)}?mode=ro", uri=True)
            applied = db.execute("SELECT strategy, COUNT(*) FROM applied_calls GROUP BY strategy").fetchall()
            db.close()
            check(applied == [(strategy, PAIR_STEPS * len(PAIR_SIZES))], f"{label}: {name}: applied calls {applied}")
        print(f"check_nccl: {label}: {PAIR_STEPS} steps x {len(PAIR_SIZES)} sizes on 2 ranks, every result exact")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--fake-cuda")
    parser.add_argument("--fake-cupti")
    parser.add_argument("--fake-extension", help="fake_extension.cc's libgradscope-agent-nccl.so")
    parser.add_argument("--old-nccl", help="the folder of the fake NCCL built as 2.27")
    parser.add_argument("--gradscope")
    parser.add_argument("--profiler", help="libnccl-profiler-gradscope.so")
    parser.add_argument("--tuner", help="libnccl-tuner-gradscope.so")
    parser.add_argument("--nvtx", action="store_true", help="the job marks steps with NVTX")
    parser.add_argument("--gpu-steps-job", help="gpu_steps_job.cc's executable")
    parser.add_argument("--static-job", help="nccl_job.cc linked with the fake NCCL statically (nccl-job-static)")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("mode", choices=["host", "gpu", "cupti", "nvtx", "disabled", "old-nccl", "profiler",
                                         "profiler-agent",
                                         "profiler-unset", "tuner-profiler", "tuner-apply", "tuner-explore",
                                         "tuner-malformed", "shadow-explore", "shadow-apply", "real",
                                         "real-nvtx", "real-pair", "real-pair-graph", "real-pair-p2p",
                                         "real-pair-shadow", "static",
                                         "real-pair-explore", "gpu-steps"])
    args = parser.parse_args()
    if sanitizer_runtime(os.path.abspath(args.agent)):
        global EVENT_LATE_NS
        EVENT_LATE_NS = 19_000_000
    for name in ("agent", "job", "fake_cuda", "fake_cupti", "fake_extension", "old_nccl", "gradscope", "profiler",
                 "tuner", "workdir", "gpu_steps_job"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    {"host": check_host, "gpu": check_gpu, "cupti": check_cupti, "nvtx": check_nvtx, "disabled": check_disabled,
     "old-nccl": check_old_nccl,
     "profiler": check_profiler, "profiler-agent": check_profiler_agent, "profiler-unset": check_profiler_unset,
     "tuner-profiler": check_tuner_profiler, "tuner-apply": check_tuner_apply, "tuner-explore": check_tuner_explore,
     "tuner-malformed": check_tuner_malformed,
     "shadow-explore": check_shadow_explore, "shadow-apply": check_shadow_apply,
     "real": check_real,
     "real-nvtx": lambda a, w: check_real(a, w, nvtx=True),
     "real-pair": check_real_pair, "real-pair-explore": check_real_pair_explore,
     "real-pair-shadow": check_real_pair_shadow, "real-pair-graph": check_real_pair_graph, "static": check_static,
     "real-pair-p2p": check_real_pair_p2p,
     "gpu-steps": check_gpu_steps}[args.mode](args, args.workdir)
    for failure in failures:
        print(f"check_nccl: FAIL: {failure}")
    if not failures:
        print(f"check_nccl: {args.mode}: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
