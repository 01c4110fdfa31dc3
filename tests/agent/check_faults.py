#!/usr/bin/python3
"""Fault injection on real MPI jobs under the agent (issue 10). Every case runs the job once without the
agent and once with it, does the same harm to both, and checks that the job behaves as without the agent
(exit code equal to the plain run's, stdout equal where the case is deterministic, else the same lines as
far as both got), that every trace file is valid (gradscope report reads it, as merge does;
PRAGMA integrity_check ok; runs/ranks/comms/calls/drops readable), that nothing recorded is lost beyond
what the flush interval (GRADSCOPE_FLUSH_INTERVAL, 50 ms by default) allows, and that drops are counted.

  check_faults.py TOOLS --workdir DIR outdir-removed    the output directory removed (rmtree) mid-run: the
                                                        agent writes the files again with everything recorded;
                                                        one 'gradscope:' line per rank; every call kept
  check_faults.py TOOLS --workdir DIR hang              3 ranks, rank 1 stops for good at step 5; SIGTERM to
                                                        mpiexec once the others wait: every step before 5 kept
  check_faults.py TOOLS --workdir DIR launcher-sigterm  SIGTERM to the outermost process of mpiexec + agent,
                                                        gradscope run -- mpiexec, mpiexec gradscope run --
  check_faults.py TOOLS --workdir DIR rank-sigkill      SIGKILL to rank 1: its file keeps what was committed
  check_faults.py TOOLS --workdir DIR write-error       inserts into the trace fail mid-run: recording stops with
                                                        one line per rank; written + 'recording_stopped' drops =
                                                        every call of the job
  check_faults.py TOOLS --workdir DIR elsewhere         the rows of the faults other tests cover (disk full,
                                                        a corrupted recommendation)

TOOLS: --agent SO --gradscope EXE --mpiexec EXE --sample EXE.
Each case prints its row of the fault matrix, to paste into docs:
  check_faults: MATRIX | <case> | exit without agent A | exit with agent B | <data kept, files valid>
Shares its helpers with check_agent.py. Exits 0 when every check passes, 1 with one line per failure.
"""

import os
import queue
import re
import shutil
import signal
import sqlite3
import sys
import time

import check_agent as ca
from check_agent import check, tail
from sanitizers import sanitizer_runtime

CALLS_PER_STEP = len(ca.STEP_CALLS)
SIGNAL_DELAY = 0.7  # seconds a long job runs (after every rank reported its pid) before the harm is done
LONG_JOB = ["--steps", "1000", "--sleep-ms", "20", "--print-every", "1", "--print-pid"]  # ~25 s unharmed

GRADSCOPE = None  # the gradscope executable (--gradscope)

# Every job a case starts: main() ends whatever is left of them, whatever went wrong.
started_jobs = []


class Job(ca.Job):
    """check_agent's Job, whose stdout is also read line by line: a case can wait for the job's progress
    (rank 0 prints a line per step with --print-every 1)."""

    def __init__(self, command, env, cwd):
        self.stdout_lines = queue.Queue()
        super().__init__(command, env, cwd)
        started_jobs.append(self)

    def _read_stdout(self):
        for line in self.process.stdout:
            self.stdout_parts.append(line)
            self.stdout_lines.put(line)

    def wait_for_stdout(self, predicate, timeout):
        """The first stdout line satisfying `predicate`, or None when `timeout` runs out."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.stdout_lines.get(timeout=remaining)
            except queue.Empty:
                break
            if predicate(line):
                return line
        return None


def end_leftover_jobs():
    for job in started_jobs:
        if job.process.poll() is None:  # not reaped: its pid still names its session
            ca.kill_session(job.process.pid)
            job.process.wait()


# ---- jobs ------------------------------------------------------------------------------------------------

def sample_job(args, np, sample_arguments, options=()):
    """The sample under mpiexec; `options` for mpiexec (the agent's -x options, or none: the plain run)."""
    return Job(ca.mpiexec(args, np, [args.sample] + list(sample_arguments), options), ca.base_environment(),
               args.workdir)


def gradscope_run_environment(args):
    """The environment in which `gradscope run` uses the agent under test (as check_agent's run-outer)."""
    env = ca.base_environment()
    env["GRADSCOPE_AGENT_PATH"] = args.agent
    runtime = sanitizer_runtime(args.agent)
    if runtime and "libasan" in runtime:
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return env


def wait_for_pids(job, np, label):
    """{rank: pid} once every rank printed its pid (--print-pid), else None."""
    pids = {}
    for line in job.wait_for_lines(lambda line: " pid " in line, np, timeout=30):
        words = line.split()  # "gradscope-sample-mpi-train: rank R pid P"
        pids[int(words[words.index("rank") + 1])] = int(words[words.index("pid") + 1])
    return pids if check(sorted(pids) == list(range(np)), f"{label}: ranks did not report their pids: {pids}") else None


def complete_lines(text):
    """The lines of `text` that ended with a newline (a signalled job may stop mid-line)."""
    return text.split("\n")[:-1]


def check_same_lines_so_far(plain_out, out, where):
    """A job stopped by a signal stops at a step that depends on timing: compare the lines both printed."""
    plain, agent = complete_lines(plain_out), complete_lines(out)
    common = min(len(plain), len(agent))
    check(common > 0, f"{where}: no stdout line to compare (without the agent {len(plain)}, with it {len(agent)})")
    first = next((i for i in range(common) if plain[i] != agent[i]), None)
    if first is not None:
        check(False, f"{where}: stdout line {first} is {agent[first]!r} with the agent, {plain[first]!r} without")


def steps_printed(out):
    """The last step rank 0 printed ('step K loss ...', K counted from 1), 0 when none."""
    steps = [int(match.group(1)) for match in re.finditer(r"^step (\d+) loss", out, re.MULTILINE)]
    return max(steps, default=0)


def calls_surely_made(out):
    """Calls every rank has returned from, proven by rank 0's stdout: rank 0 printed step K after the loss
    all-reduce of step K returned, which every rank had entered, having returned from every earlier call:
    the setup call, K-1 whole steps and the first six calls of step K."""
    steps = steps_printed(out)
    return 0 if steps == 0 else len(ca.SETUP_CALLS) + CALLS_PER_STEP * steps - 1


def exit_codes_equal(plain_code, agent_code, where, err):
    return check(plain_code == agent_code, f"{where}: exit {agent_code} with the agent, {plain_code} without: "
                 f"{tail(err)}")


# ---- trace files -----------------------------------------------------------------------------------------

class RankFile:
    """What one per-rank file holds, read after the job ended."""

    def __init__(self, path, rank, epoch_ns, end_ns, calls, last_end_ns, drops, hot_journal):
        self.path, self.rank, self.epoch_ns, self.end_ns = path, rank, epoch_ns, end_ns
        self.hot_journal = hot_journal  # a hot -journal was beside it (gradscope_read_error())
        self.calls = calls  # {seq: (api, dtype, count, op)}
        self.last_end_ns = last_end_ns  # of the last recorded call, relative to epoch_ns; None without calls
        self.drops = drops  # [(kind, count)] of the non-zero drop counters


def gradscope_read_error(path):
    """(why gradscope cannot read `path` or None, whether a hot journal was beside it). Read as gradscope merge
    and report read it: `gradscope report PATH`. A writer killed in the middle of a rollback-journal
    transaction leaves a hot -journal (the agent finishing its file when the launcher's SIGKILL comes):
    gradscope's reader rolls it back (StorageHotJournal tests), so such a file is valid too, and the matrix
    says it was found. Runs before any other connection, which would roll the journal back itself."""
    hot = os.path.exists(path + "-journal")
    code, _, err = ca.run([GRADSCOPE, "report", path], ca.base_environment(), os.path.dirname(path))
    return (None if code == 0 else f"gradscope report exit {code}: {tail(err)}"), hot


def read_rank_file(path, label):
    """A per-rank file's facts; None (and a failure) when it is not valid: gradscope cannot read it,
    integrity_check is not ok, not one runs row, or a table does not read."""
    error, hot_journal = gradscope_read_error(path)
    check(error is None, f"{label}: {path} does not read as gradscope merge and report read it: {error}")
    db = ca.check_file_opens(path, label)  # integrity_check ok and one runs row (read-write: replays a WAL)
    if db is None:
        return None
    try:
        for table in ("runs", "ranks", "comms", "calls", "drops"):
            db.execute(f"SELECT count(*) FROM {table}").fetchone()
        epoch_ns, end_ns = db.execute("SELECT epoch_ns, end_ns FROM runs").fetchone()
        ranks = [row[0] for row in db.execute("SELECT rank FROM ranks")]
        rows = db.execute("SELECT seq, api, dtype, count, op, end_ns FROM calls ORDER BY seq, id").fetchall()
        drops = db.execute("SELECT kind, count FROM drops WHERE count != 0").fetchall()
    except sqlite3.Error as error:
        check(False, f"{label}: {path}: a table does not read: {error}")
        return None
    finally:
        db.close()
    if not check(len(ranks) == 1, f"{label}: {path}: ranks {ranks}, expected one"):
        return None
    return RankFile(path, ranks[0], epoch_ns, end_ns, {row[0]: tuple(row[1:5]) for row in rows},
                    max((row[5] for row in rows if row[5] is not None), default=None), drops, hot_journal)


def read_rank_files(directory, np, label):
    """{rank: RankFile} of the per-rank files in `directory` (every *.db but gradscope run's trace.db)."""
    files = [name for name in ca.trace_files(directory) if name != "trace.db"]
    check(len(files) == np, f"{label}: per-rank files {files} in {directory}, expected {np}")
    ranks = {}
    for name in files:
        facts = read_rank_file(os.path.join(directory, name), label)
        if facts is not None:
            check(facts.rank not in ranks, f"{label}: two files of rank {facts.rank}")
            ranks[facts.rank] = facts
    check(sorted(ranks) == list(range(np)), f"{label}: valid files of ranks {sorted(ranks)}, expected 0..{np - 1}")
    return ranks


def check_calls_of_the_job(facts, label, in_flight_at_end=False):
    """The calls are the sample's sequence from its start, call seq being the sample's call number seq:
    nothing lost in between. With `in_flight_at_end` (a job ended by a signal), the MPI_Iallreduce of the
    last step may be missing: it is recorded when it completes (docs/agent.md), and the signal may have
    come between its start and its MPI_Wait, while the later calls of that step completed."""
    seqs = sorted(facts.calls)
    expected = ca.expected_calls((seqs[-1] if seqs else 0) // CALLS_PER_STEP + 1)
    wrong = [(seq, ca.describe(facts.calls[seq]), ca.describe(expected[seq])) for seq in seqs
             if facts.calls[seq] != expected[seq]]
    check(not wrong, f"{label}: rank {facts.rank}: calls differ from the sample's (seq, recorded, the sample's): "
          f"{wrong[:3]}")
    missing = sorted(set(range(seqs[-1] + 1)) - set(seqs)) if seqs else []
    allowed = [seq for seq in missing if in_flight_at_end and expected[seq][0] == ca.MPI_IALLREDUCE
               and seq > seqs[-1] - CALLS_PER_STEP]
    check(missing == allowed, f"{label}: rank {facts.rank}: calls missing (seq): {missing[:10]}"
          f"{' (an MPI_Iallreduce of the last step in flight at the end may be)' if in_flight_at_end else ''}")


def check_first_to_die_finished(ranks, label):
    """After a SIGTERM, Open MPI SIGKILLs the remaining ranks as soon as the first one has died: a rank's
    agent may then be killed before its file is finished (runs.end_ns NULL; its calls are all there, up to
    the flush interval). The first rank to die did finish: the agent's handler re-raises the signal only
    once the file is finished. So at least one file is complete."""
    check(any(facts.end_ns is not None for facts in ranks.values()),
          f"{label}: no rank's runs.end_ns is set: the first rank to die should have finished its file at SIGTERM")


def check_no_drops(ranks, label):
    for facts in ranks.values():
        check(facts.drops == [], f"{label}: rank {facts.rank}: drops {facts.drops}, expected none")


def summary(ranks, np, expected=None, lower_bound=None, killed=None):
    """The data column of a matrix row: calls per rank (of the expected, or of those surely made; the
    killed rank's: committed), how many files are complete (runs.end_ns set), drops."""
    parts = []
    for rank in range(np):
        facts = ranks.get(rank)
        if facts is None:
            parts.append(f"rank{rank} invalid or missing")
        elif rank == killed:
            parts.append(f"rank{rank} (killed) {len(facts.calls)} calls committed")
        elif expected is not None:
            parts.append(f"rank{rank} {len(facts.calls)}/{expected} calls")
        else:
            parts.append(f"rank{rank} {len(facts.calls)} calls (>= {lower_bound} made)")
    complete = sum(1 for facts in ranks.values() if facts.end_ns is not None)
    drops = sum(count for facts in ranks.values() for _, count in facts.drops)
    valid = "files valid" if len(ranks) == np else f"{len(ranks)}/{np} files valid"
    rolled_back = [f"rank{facts.rank}" for facts in ranks.values() if facts.hot_journal]
    if rolled_back:  # killed while finishing its file: gradscope's reader rolled the journal back
        valid += f" ({', '.join(rolled_back)}: hot journal rolled back on reading)"
    return f"{', '.join(parts)}; end_ns set {complete}/{np}; drops {drops}; {valid}"


def matrix_row(case, plain_code, agent_code, data):
    print(f"check_faults: MATRIX | {case} | exit without agent {plain_code} | exit with agent {agent_code} | {data}")


def start_until_committing(args, np, sample_arguments, traces):
    """Starts the sample under the agent, writing rank%r.db into a fresh `traces`, and returns once every
    file holds committed calls and at least ~0.7 s into the job, with a second or more of the job to go:
    harm done before the agent ever commits, or after the job, tests nothing. A file exists from MPI_Init
    on, before its schema and first rows are committed; on a loaded machine (a sanitizer build beside other
    tests) that took over a second, and harm done then hit a file the agent was still making, so the wait
    is for the rows, not for the file. Returns (job, file names, start time)."""
    ca.fresh_directory(traces)
    names = [f"rank{rank}.db" for rank in range(np)]
    job = sample_job(args, np, sample_arguments, ca.agent_options(args, os.path.join(traces, "rank%r.db")))
    started = time.monotonic()
    deadline = started + 60
    while (not all(committed_calls(os.path.join(traces, name)) > 0 for name in names)
           and time.monotonic() < deadline and job.process.poll() is None):
        time.sleep(0.05)
    time.sleep(max(0.0, 0.7 - (time.monotonic() - started)))
    return job, names, started


def committed_calls(path):
    """Calls committed to a rank's file so far, read as the live view reads (WAL: a reader never blocks the
    agent's writes); 0 while the file is missing, not yet in WAL mode (a reader's shared lock then could
    block the agent's switch to it) or its schema not yet committed."""
    if not os.path.exists(path + "-wal"):
        return 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.1)
        try:
            return db.execute("SELECT count(*) FROM calls").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


# ---- cases -------------------------------------------------------------------------------------------------

def check_outdir_removed(args):
    """The directory that holds rank%r.db removed while the job runs. The agent notices at its next flush,
    makes the directory and the file again with everything committed so far, says so in one line per rank,
    and records on: at the end each file holds every call of the job."""
    label, np, steps = "outdir-removed", 2, 150
    sample_arguments = ["--steps", str(steps), "--sleep-ms", "15"]  # ~2.5 s
    plain = sample_job(args, np, sample_arguments)
    plain_code, plain_out, _ = plain.finish()
    check(plain_code == 0, f"{label}: plain run exit {plain_code}")

    traces = os.path.join(args.workdir, "traces")
    job, names, started = start_until_committing(args, np, sample_arguments, traces)
    removed_at = time.monotonic() - started
    if check(job.process.poll() is None, f"{label}: the job ended before the directory was removed "
             f"({removed_at:.1f} s); files then: {ca.trace_files(traces)}"):
        try:
            shutil.rmtree(traces)
        except OSError as error:
            check(False, f"{label}: cannot remove {traces}: {error}")
    code, out, err = job.finish()
    where = f"{label} (removed {removed_at:.1f} s into the job)"
    exit_codes_equal(plain_code, code, where, err)
    check(out == plain_out, f"{where}: stdout differs from the plain run's:\n--- plain\n{plain_out}--- agent\n{out}")
    lines = ca.gradscope_lines(err)
    check(len(lines) == np and all("removed" in line for line in lines),
          f"{where}: 'gradscope:' lines {lines}, expected one per rank saying the file was removed")
    check(sorted(name for line in lines for name in names if name in line) == names,
          f"{where}: the 'gradscope:' lines do not name each rank's file once: {lines}")

    if not check(os.path.isdir(traces), f"{where}: {traces} was not made again"):
        matrix_row(label, plain_code, code, "no files: the directory stayed removed")
        return
    check(ca.trace_files(traces) == names, f"{where}: files {ca.trace_files(traces)} at the original path, "
          f"expected {names}")
    ranks = read_rank_files(traces, np, where)
    expected = ca.expected_calls(steps)
    for facts in ranks.values():
        check(facts.end_ns is not None, f"{where}: rank {facts.rank}: runs.end_ns NULL after MPI_Finalize")
        check(len(facts.calls) == len(expected), f"{where}: rank {facts.rank}: {len(facts.calls)} calls, expected "
              f"all {len(expected)} of the job")
        check_calls_of_the_job(facts, where)
    check_no_drops(ranks, where)
    # The merged trace: the exact calls, steps, one run (check_agent's check of a whole job).
    merged = os.path.join(args.workdir, "merged.db")
    if len(ranks) == np and ca.merge(args, traces, merged, where):
        db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
        ca.check_job_trace(db, np, steps, f"{where}: merged.db")
        db.close()
    matrix_row(label, plain_code, code, summary(ranks, np, expected=len(expected)))


def check_write_error(args):
    """Every insert into `calls` fails from ~0.7 s into the job on (a trigger added to each rank's file, as
    a full or broken store would fail): recording stops with one line per rank, the job runs on untouched,
    and no call goes missing silently: the calls written plus the 'recording_stopped' drops are every call
    the job made, and gradscope report says so under "Dropped events"."""
    label, np, steps = "write-error", 2, 150
    sample_arguments = ["--steps", str(steps), "--sleep-ms", "15"]  # ~2.5 s
    plain = sample_job(args, np, sample_arguments)
    plain_code, plain_out, _ = plain.finish()
    check(plain_code == 0, f"{label}: plain run exit {plain_code}")

    traces = os.path.join(args.workdir, "traces")
    job, names, started = start_until_committing(args, np, sample_arguments, traces)
    for name in names:
        try:
            db = sqlite3.connect(os.path.join(traces, name), timeout=10)
            db.execute("CREATE TRIGGER IF NOT EXISTS injected_fault BEFORE INSERT ON calls "
                       "BEGIN SELECT RAISE(ABORT, 'injected write error'); END")
            db.commit()
            db.close()
        except sqlite3.Error as error:
            check(False, f"{label}: cannot add the failing trigger to {name}: {error}")
    check(job.process.poll() is None, f"{label}: the job ended before the fault was injected")
    code, out, err = job.finish()
    exit_codes_equal(plain_code, code, label, err)
    check(out == plain_out, f"{label}: stdout differs from the plain run's:\n--- plain\n{plain_out}--- agent\n{out}")
    # The trigger, or the test's own write adding it when the agent commits at that moment (the file is
    # locked by another writer, which the agent refuses too): either way one line per rank names it.
    lines = ca.gradscope_lines(err)
    check(len(lines) == np and all("recording stopped" in line and
                                   ("injected write error" in line or "locked by another writer" in line)
                                   for line in lines),
          f"{label}: 'gradscope:' lines {lines}, expected one per rank naming the error")
    made = len(ca.expected_calls(steps))
    ranks = read_rank_files(traces, np, label)
    kept = []
    for facts in ranks.values():
        lost = sum(count for kind, count in facts.drops if kind == "recording_stopped")
        check(lost > 0, f"{label}: rank {facts.rank}: no 'recording_stopped' drops: {facts.drops}")
        check(len(facts.calls) + lost == made,
              f"{label}: rank {facts.rank}: {len(facts.calls)} calls written + {lost} counted lost, the job made {made}")
        check(facts.end_ns is not None, f"{label}: rank {facts.rank}: runs.end_ns NULL")
        kept.append(f"rank{facts.rank} {len(facts.calls)} written + {lost} recording_stopped = {made}")
        code_report, report, report_err = ca.run([GRADSCOPE, "report", facts.path], ca.base_environment(),
                                                 args.workdir)
        check(code_report == 0 and "recording_stopped" in report and "calls not recorded" in report,
              f"{label}: rank {facts.rank}: the report does not account for the lost calls: {tail(report + report_err)}")
    matrix_row(label, plain_code, code, "; ".join(kept) + "; files valid, the report lists them as dropped")


def check_hang(args):
    """3 ranks (not a power of two: the all-reduces take their non-power-of-two paths), rank 1 stops for
    good at the start of step 5 (--hang-at-step); ranks 0 and 2 wait in step 5's first all-reduce. Once
    rank 0 has printed step 5's line (the 5th step, counted from 1) and the job has sat stuck a little,
    SIGTERM to mpiexec.

    What happens then (Open MPI 4.1, observed with strace): mpiexec sends SIGCONT to each rank's process
    group, 1 s later (odls_base_sigkill_timeout) SIGTERM, and SIGKILL to the rest as soon as the first
    rank has died. Every rank gets the SIGTERM, the hung one too (the agent's handler runs while it sits
    in pause()), and the agent finishes its file before re-raising it (docs/agent.md, "Signals"): every
    file holds exactly the calls before step 5, and the first rank to die has finished its file
    (runs.end_ns set). The waiting ranks' step-5 all-reduce never returned and is not recorded (a call is
    recorded when it returns). The other ranks' agents have only until the first rank's death, not the
    documented 3 s: one SIGKILLed before it finished keeps end_ns NULL (the matrix row counts them), and
    an older agent killed while switching the file out of WAL mode left a hot journal, which
    gradscope_read_error() accepts and reports."""
    label, np, hang_step, hang_rank = "hang", 3, 5, 1
    sample_arguments = ["--steps", "1000", "--print-every", "1", "--hang-at-step", str(hang_step), "--hang-rank",
                        str(hang_rank)]
    traces = ca.fresh_directory(os.path.join(args.workdir, "traces"))
    results = {}
    for kind, options in (("plain", ()), ("agent", ca.agent_options(args, os.path.join(traces, "rank%r.db")))):
        job = sample_job(args, np, sample_arguments, options)
        last = job.wait_for_stdout(lambda line: line.startswith(f"step {hang_step} loss"), timeout=30)
        check(last is not None, f"{label} ({kind}): rank 0 did not print step {hang_step}")
        time.sleep(0.5)  # ranks 0 and 2 are then in step 5's first all-reduce: a few ms of work away
        check(job.process.poll() is None, f"{label} ({kind}): the job ended although rank {hang_rank} hangs")
        check(steps_printed("".join(job.stdout_parts)) == hang_step,
              f"{label} ({kind}): rank 0 printed steps past {hang_step}: {tail(''.join(job.stdout_parts), 200)}")
        job.process.send_signal(signal.SIGTERM)
        results[kind] = job.finish(timeout=30)
    (plain_code, plain_out, _), (code, out, err) = results["plain"], results["agent"]
    exit_codes_equal(plain_code, code, label, err)
    # Deterministic: both stop after the same step, and the losses up to there are the same.
    check(out == plain_out, f"{label}: stdout differs from the plain run's:\n--- plain\n{plain_out}--- agent\n{out}")
    check(ca.gradscope_lines(err) == [], f"{label}: the agent printed {ca.gradscope_lines(err)}")

    ranks = read_rank_files(traces, np, label)
    expected = len(ca.expected_calls(hang_step))
    check_first_to_die_finished(ranks, label)
    for facts in ranks.values():
        check(len(facts.calls) == expected, f"{label}: rank {facts.rank}: {len(facts.calls)} calls, expected the "
              f"{expected} of setup and steps 0..{hang_step - 1}")
        check_calls_of_the_job(facts, label)
    check_no_drops(ranks, label)
    matrix_row(f"{label} (np {np}, rank {hang_rank} stuck at step {hang_step}, SIGTERM to mpiexec)", plain_code, code,
               summary(ranks, np, expected=expected))


def check_launcher_sigterm(args):
    """SIGTERM to the outermost process of three launch forms; each against the plain `mpiexec -np 2
    SAMPLE` signalled the same way (the same command for all three).
      mpiexec    mpiexec -x LD_PRELOAD=agent ... SAMPLE: mpiexec passes the signal on to the ranks
      outer      gradscope run -o DIR -- mpiexec ...: gradscope forwards it to mpiexec, returns mpiexec's
                 exit code and merges the per-rank files into DIR/trace.db
      inner      mpiexec gradscope run -o DIR -- SAMPLE: mpiexec signals each rank's process group (gradscope
                 run and its SAMPLE)
    Every per-rank file valid; a finished one (the agent flushes at SIGTERM) holds every call rank 0's
    output proves the job made, and one Open MPI SIGKILLed before its agent finished (when the first rank
    died) every call up to about one flush interval before that. The inner form gets no merged trace: Open MPI SIGKILLs each rank's process group
    as soon as the first rank has died after the SIGTERM (observed with strace, Open MPI 4.1), which ends
    rank 0's gradscope run before it can merge; `gradscope merge DIR` then makes it from the complete
    per-rank files, which this case checks."""
    label, np = "launcher-sigterm", 2
    plain = sample_job(args, np, LONG_JOB)
    if wait_for_pids(plain, np, f"{label} (plain)") is not None:
        time.sleep(SIGNAL_DELAY)
        check(plain.process.poll() is None, f"{label} (plain): the job ended before the signal")
        plain.process.send_signal(signal.SIGTERM)
    plain_code, plain_out, _ = plain.finish(timeout=30)

    program = [args.sample] + LONG_JOB
    for form in ("mpiexec", "outer", "inner"):
        where = f"{label} ({form})"
        output = ca.fresh_directory(os.path.join(args.workdir, form))
        if form == "mpiexec":
            job = Job(ca.mpiexec(args, np, program, ca.agent_options(args, os.path.join(output, "rank%r.db"))),
                      ca.base_environment(), args.workdir)
        elif form == "outer":
            job = Job([args.gradscope, "run", "-o", output, "--"] + ca.mpiexec(args, np, program),
                      gradscope_run_environment(args), args.workdir)
        else:
            job = Job(ca.mpiexec(args, np, [args.gradscope, "run", "-o", output, "--"] + program),
                      gradscope_run_environment(args), args.workdir)
        if wait_for_pids(job, np, where) is not None:
            time.sleep(SIGNAL_DELAY)
            check(job.process.poll() is None, f"{where}: the job ended before the signal")
            job.process.send_signal(signal.SIGTERM)
        code, out, err = job.finish(timeout=30)
        exit_codes_equal(plain_code, code, where, err)
        check_same_lines_so_far(plain_out, out, where)

        ranks = read_rank_files(output, np, where)
        made = calls_surely_made(out)
        check_first_to_die_finished(ranks, where)
        finished = [f.epoch_ns + f.end_ns for f in ranks.values() if f.end_ns is not None]
        for facts in ranks.values():
            check_calls_of_the_job(facts, where, in_flight_at_end=True)
            if facts.end_ns is None and finished and facts.last_end_ns is not None:
                # Open MPI SIGKILLed this rank when the first one died, before its agent finished the file
                # (check_first_to_die_finished): it holds the calls up to about one flush interval before
                # that kill, which came right after the first rank finished its file. Calls end every
                # ~20 ms, commits every 50 ms; 300 ms leaves room for a slow machine (as rank-sigkill).
                lag_ms = (max(finished) - (facts.epoch_ns + facts.last_end_ns)) / 1e6
                check(lag_ms <= 300, f"{where}: rank {facts.rank} (killed before it finished its file): the last "
                      f"recorded call ended {lag_ms:.1f} ms before the first rank finished, expected at most 300 ms")
                continue
            check(len(facts.calls) >= made, f"{where}: rank {facts.rank}: {len(facts.calls)} calls, but rank 0's "
                  f"output proves the job made {made} (step {steps_printed(out)} printed)")
        check_no_drops(ranks, where)
        merged_note = ""
        if form != "mpiexec":
            merged = os.path.join(output, "trace.db")
            if form == "outer":
                check(os.path.exists(merged), f"{where}: gradscope run merged nothing: {os.listdir(output)}: "
                      f"{tail(err)}")
            if os.path.exists(merged):
                merged_note = "; merged trace.db written"
                db = sqlite3.connect(f"file:{merged}?mode=ro", uri=True)
                counts = dict(db.execute("SELECT r.rank, count(c.id) FROM ranks r LEFT JOIN calls c "
                                         "ON c.rank_id = r.id GROUP BY r.rank").fetchall())
                db.close()
                expected_counts = {rank: len(facts.calls) for rank, facts in ranks.items()}
                check(counts == expected_counts, f"{where}: trace.db holds calls per rank {counts}, the per-rank "
                      f"files {expected_counts}; gradscope run said: {ca.gradscope_lines(err)}")
            else:
                merged = ca.merge(args, output, os.path.join(args.workdir, f"merged-{form}.db"), where)
                merged_note = (f"; no merged trace.db (gradscope run killed by Open MPI), gradscope merge DIR "
                               f"{'ok' if merged else 'FAILED'}")
        matrix_row(f"{label} ({form})", plain_code, code, summary(ranks, np, lower_bound=made) + merged_note)


def check_rank_sigkill(args):
    """SIGKILL to rank 1 of 2 (the data checks of check_agent.py sigkill, agent.signal.sigkill, plus the exit
    code and the other rank): rank 1's file is valid, incomplete (end_ns NULL: nothing runs after SIGKILL)
    and holds the calls committed up to about one flush interval before the kill. Open MPI then ends rank
    0 (observed with strace, Open MPI 4.1: SIGCONT to its process group, 1 s later SIGTERM, SIGKILL once
    it has died): the agent finishes rank 0's file at that SIGTERM, so it is complete and holds every call
    rank 0 returned from. mpiexec exits 128 + 9, with and without the agent."""
    label, np, victim = "rank-sigkill", 2, 1
    results = {}
    traces = ca.fresh_directory(os.path.join(args.workdir, "traces"))
    kill_ns = {}
    for kind, options in (("plain", ()), ("agent", ca.agent_options(args, os.path.join(traces, "rank%r.db")))):
        job = sample_job(args, np, LONG_JOB, options)
        pids = wait_for_pids(job, np, f"{label} ({kind})")
        if pids is not None:
            time.sleep(SIGNAL_DELAY)
            check(job.process.poll() is None, f"{label} ({kind}): the job ended before the signal")
            kill_ns[kind] = time.time_ns()
            os.kill(pids[victim], signal.SIGKILL)
        results[kind] = job.finish(timeout=30)
    (plain_code, plain_out, _), (code, out, err) = results["plain"], results["agent"]
    exit_codes_equal(plain_code, code, label, err)
    check_same_lines_so_far(plain_out, out, label)

    ranks = read_rank_files(traces, np, label)
    made = calls_surely_made(out)
    lag_note = ""
    for facts in ranks.values():
        check_calls_of_the_job(facts, label, in_flight_at_end=True)
        if facts.rank != victim:
            # The survivor gets SIGTERM and, the victim being dead already, SIGKILL close behind: its end
            # is in the matrix row (end_ns set), its calls are checked.
            check(len(facts.calls) >= made, f"{label}: rank {facts.rank}: {len(facts.calls)} calls, but rank 0's "
                  f"output proves the job made {made} (step {steps_printed(out)} printed)")
            continue
        check(facts.end_ns is None, f"{label}: rank {victim}: runs.end_ns {facts.end_ns} although it was killed")
        survived = check(facts.last_end_ns is not None, f"{label}: rank {victim}: no call survived the kill")
        if survived and "agent" in kill_ns:
            lag_ms = (kill_ns["agent"] - (facts.epoch_ns + facts.last_end_ns)) / 1e6
            # Calls end every ~20 ms (the step's sleep), commits every 50 ms: the last one committed ended at
            # most ~100 ms before the kill; 300 ms leaves room for a slow machine (as check_agent's sigkill).
            check(-20 <= lag_ms <= 300, f"{label}: rank {victim}: the last recorded call ended {lag_ms:.1f} ms "
                  "before the kill, expected 0..300 ms (one flush interval and a step, with room)")
            lag_note = f"; rank{victim}'s last call {lag_ms:.0f} ms before the kill"
    check_no_drops(ranks, label)
    matrix_row(f"{label} (rank {victim})", plain_code, code,
               summary(ranks, np, lower_bound=made, killed=victim) + lag_note)


def check_elsewhere(args):
    """The faults whose tests live elsewhere, named in the matrix so that it is whole; fails when the modes
    named here are gone."""
    import check_shadow
    rows = [("disk-full", "agent.failopen.disk_full", "check_agent.py failopen-disk-full", ca.MODES,
             "failopen-disk-full", "stdout and exit code as without the agent; one 'gradscope:' line per rank; "
             "files valid, calls committed before the disk filled kept"),
            ("corrupted-recommendation", "agent.shadow.bad_files", "check_shadow.py bad-files", check_shadow.MODES,
             "bad-files", "stdout and exit code as without the agent; one 'gradscope:' line; the job observed, "
             "nothing applied")]
    for case, test, script, modes, mode, what in rows:
        if check(mode in modes, f"elsewhere: {script} has no mode '{mode}' any more; update this row"):
            print(f"check_faults: MATRIX | {case} | see ctest {test} ({script}) | {what}")


CASES = {
    "outdir-removed": (check_outdir_removed, ["agent", "gradscope", "sample"]),
    "hang": (check_hang, ["agent", "gradscope", "sample"]),
    "launcher-sigterm": (check_launcher_sigterm, ["agent", "gradscope", "sample"]),
    "rank-sigkill": (check_rank_sigkill, ["agent", "gradscope", "sample"]),
    "write-error": (check_write_error, ["agent", "gradscope", "sample"]),
    "elsewhere": (check_elsewhere, []),
}


def main():
    parser = ca.tool_parser(__doc__)
    parser.add_argument("case", choices=sorted(CASES))
    args, function = ca.prepare(parser, CASES, "case", "gs-faults-")
    global GRADSCOPE
    GRADSCOPE = args.gradscope
    try:
        function(args)
    finally:
        end_leftover_jobs()
        code = ca.conclude("check_faults", args.case)
    return code


if __name__ == "__main__":
    sys.exit(main())
