"""gradscope opens no network listener, anywhere (issue 10, "Security").

  check_no_listener.py imports BINARY... [--archive LIB.a]...
      gradscope's code calls no socket function (socket, socketpair, bind, listen, accept, accept4): code
      that never creates a socket cannot listen on one. Each shipped binary's dynamic imports, read with nm,
      hold none, except those of NVIDIA's CUDA runtime where a binary links it statically
      (libcudart_static: gradscope-bench with CUDA on), which are named as such; the undefined symbols of
      every gradscope static library (--archive), where gradscope's code is, hold none at all.
  check_no_listener.py job --agent SO --gradscope EXE --mpiexec EXE --sample EXE --workdir DIR
      What a running job listens on: the 2-rank C++ sample plain, then under `gradscope run --mode
      explore` (the agent and its MPI extension loaded, strategies running), with every listening
      socket each process holds (TCP and UDP over IPv4 and IPv6, Unix stream/seqpacket sockets in the
      listening state) read from /proc while the job runs. The ranks under the agent listen on exactly
      what they listen on without it (Open MPI's own sockets), and `gradscope run` itself on nothing.

Exits 0 when every check passes, 1 with one line per failure.
"""

import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agent"))
import check_agent as ca  # noqa: E402
from check_agent import check, tail  # noqa: E402
from sanitizers import sanitizer_runtime  # noqa: E402

SOCKET_FUNCTIONS = {"socket", "socketpair", "bind", "listen", "accept", "accept4"}
TCP_LISTEN = "0A"
UDP_BOUND = "07"  # a UDP socket bound to a port receives whatever is sent to it: a listener too
UNIX_ACCEPTING = 0x00010000  # __SO_ACCEPTCON: the socket called listen()


def undefined_symbols(nm, path):
    """The names `path` (an ELF file or an archive) needs from elsewhere, or None when nm fails."""
    options = ["-D"] if not path.endswith(".a") else []
    listing = subprocess.run([nm] + options + ["--undefined-only", path], capture_output=True, text=True, timeout=60)
    if not check(listing.returncode == 0, f"{path}: nm failed: {listing.stderr.strip()}"):
        return None
    # Symbol lines read "<spaces> U name[@version]" (w: weak); an archive's member headers end with ':'.
    return {match.group(1) for match in re.finditer(r"^\s+[Uw]\s+([^@\s]+)", listing.stdout, re.MULTILINE)}


def links_cuda_runtime_statically(nm, path):
    listing = subprocess.run([nm, path], capture_output=True, text=True, timeout=60)
    return any(" libcudart_static_" in line for line in listing.stdout.splitlines())


def check_imports(args):
    nm = shutil.which("nm")
    if not check(nm is not None, "nm (binutils) is missing: install binutils"):
        return
    for path in args.files:
        imported = undefined_symbols(nm, path)
        if imported is None:
            continue
        found = sorted(imported & SOCKET_FUNCTIONS)
        name = os.path.basename(path)
        if found and links_cuda_runtime_statically(nm, path):
            print(f"check_no_listener: {name}: imports {', '.join(found)} for the CUDA runtime it links statically "
                  "(libcudart_static); gradscope's archives are checked below")
            continue
        if check(not found, f"{name} imports {', '.join(found)}: gradscope must not open sockets"):
            print(f"check_no_listener: {name}: {len(imported)} imported symbols, no socket function")
    for path in args.archive:
        needed = undefined_symbols(nm, path)
        if needed is None:
            continue
        found = sorted(needed & SOCKET_FUNCTIONS)
        if check(not found, f"{os.path.basename(path)} (gradscope's code) calls {', '.join(found)}: gradscope must "
                 "not open sockets"):
            print(f"check_no_listener: {os.path.basename(path)}: {len(needed)} undefined symbols, no socket function")


def listening_inodes():
    """{socket inode: description} of every listening socket on this machine (its network namespace)."""
    found = {}
    for name in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{name}") as table:
                next(table)
                for line in table:
                    fields = line.split()
                    state, inode = fields[3], fields[9]
                    if state == (TCP_LISTEN if name.startswith("tcp") else UDP_BOUND):
                        found[inode] = f"{name} {fields[1]}"
        except FileNotFoundError:
            pass
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if int(fields[3], 16) & UNIX_ACCEPTING:
                found[fields[6]] = f"unix {fields[7] if len(fields) > 7 else '(unnamed)'}"
    return found


def sockets_of(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            match = re.fullmatch(r"socket:\[(\d+)\]", target)
            if match:
                inodes.add(match.group(1))
    except OSError:
        pass
    return inodes


def listening_kinds(pid, listening):
    """The kinds of listening sockets `pid` holds, e.g. ['tcp', 'tcp6', 'unix'] (sorted, with repeats)."""
    return sorted(listening[inode].split()[0] for inode in sockets_of(pid) if inode in listening)


def observe_job(args, command, env, label):
    """Starts the job, waits for both ranks' pids, and returns ({rank: kinds}, launcher kinds)."""
    job = ca.Job(command, env, args.workdir)
    try:
        lines = job.wait_for_lines(lambda line: " pid " in line, 2, timeout=60)
        pids = {}
        for line in lines:  # "gradscope-sample-mpi-train: rank R pid P"
            words = line.split()
            pids[int(words[words.index("rank") + 1])] = int(words[words.index("pid") + 1])
        if not check(sorted(pids) == [0, 1], f"{label}: ranks did not report their pids: {lines}"):
            return None, None
        time.sleep(1.5)  # past MPI_Init, the agent's activation and the first explorations
        check(job.process.poll() is None, f"{label}: the job ended before its sockets were read")
        listening = listening_inodes()
        ranks = {rank: listening_kinds(pid, listening) for rank, pid in pids.items()}
        launcher = listening_kinds(job.process.pid, listening)
        return ranks, launcher
    finally:
        code, out, err = job.finish(timeout=120)
        check(code == 0, f"{label}: exit {code}: {tail(err)}")


def check_job(args):
    # The job must outlive the 1.5 s wait below: 400 steps of 10 ms or more; under the sanitizers a step
    # takes ten times longer, and 150 steps are plenty.
    steps = "150" if sanitizer_runtime(args.agent) else "400"
    program = [args.sample, "--steps", steps, "--sleep-ms", "10", "--print-pid", "--print-every", "0"]
    env = ca.base_environment()
    plain, _ = observe_job(args, ca.mpiexec(args, 2, program), env, "plain job")
    output = os.path.join(args.workdir, "out")
    command = [args.gradscope, "run", "-o", output, "--mode", "explore", "--"] + ca.mpiexec(args, 2, program)
    env = dict(env, GRADSCOPE_AGENT_PATH=args.agent)
    # An ASan build's agent needs its runtime first in LD_PRELOAD (as in check_agent.py's run-outer).
    runtime = sanitizer_runtime(args.agent)
    if runtime and "libasan" in runtime:
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    traced, launcher = observe_job(args, command, env, "under gradscope run --mode explore")
    if plain is None or traced is None:
        return
    print(f"check_no_listener: listening sockets per rank without the agent {plain}, with it {traced}; "
          f"gradscope run itself {launcher}")
    check(traced == plain, f"the ranks listen on {traced} under the agent and on {plain} without it: the agent "
          "must add no listener")
    check(launcher == [], f"gradscope run holds listening sockets: {launcher}")


def main():
    parser = ca.tool_parser(__doc__)
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("files", nargs="*")
    parser.add_argument("--archive", action="append", default=[], help="a gradscope static library")
    args, function = ca.prepare(parser, MODES, "mode", "gs-listener-")
    try:
        function(args)
    finally:
        code = ca.conclude("check_no_listener", args.mode)
    return code


MODES = {"imports": (check_imports, []),
         "job": (check_job, ["agent", "gradscope", "sample"])}


if __name__ == "__main__":
    sys.exit(main())
