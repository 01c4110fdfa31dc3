"""The adversarial job of check_adversarial.py in mpi4py (tests/agent/adversarial.c is its C twin; its
header lists the cases). mpi4py initialises MPI at MPI_THREAD_MULTIPLE, raises MPI errors as exceptions
(MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF) and loads libmpi with RTLD_LOCAL.

  /usr/bin/python3 adversarial.py

Prints "r<rank> <line> <case> ..." result lines (exact: the inputs are small integers), the thread level
before and after, and last the number of calls it made of each intercepted API.
"""

import hashlib
import os
import subprocess
import sys
import threading

import numpy as np
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
APIS = ["MPI_Allreduce", "MPI_Iallreduce", "MPI_Reduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast"]
# "world": those on MPI_COMM_WORLD, which the trace keeps as "world"; "single": the all-reduces on
# intracommunicators of one rank, which explore and apply leave untouched
calls = dict.fromkeys(APIS + ["world", "single"], 0)
calls_lock = threading.Lock()
line = 0
LEVELS = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SERIALIZED: "serialized",
          MPI.THREAD_MULTIPLE: "multiple"}


def counted(api, comm):
    with calls_lock:
        calls[api] += 1
        if comm == WORLD:
            calls["world"] += 1
        if api in ("MPI_Allreduce", "MPI_Iallreduce") and not comm.Is_inter() and comm.Get_size() == 1:
            calls["single"] += 1


def write_line(text):
    # One write per line: mpirun forwards each rank's output in the pieces the rank writes, and print()
    # writes the end of the line apart from the text, so two ranks' lines could interleave.
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def emit(label, text):
    global line
    write_line(f"r{RANK} {line:04d} {label} {text}")
    line += 1


def emit_array(label, values):
    digest = hashlib.sha1(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]
    emit(label, f"n={values.size} hash={digest} " + " ".join(f"{v:g}" for v in values.ravel()[:4]))


def fill(n, salt, dtype=np.float32):
    i = np.arange(n)
    return (((RANK + 1) * 31 + i * 7 + salt) % 17 - 8).astype(dtype)


def sum_on(comm, n, salt, label, dtype=np.float32):
    out = np.empty(n, dtype)
    comm.Allreduce(fill(n, salt, dtype), out, op=MPI.SUM)
    counted("MPI_Allreduce", comm)
    emit_array(label, out)


def error_class(call):
    try:
        call()
        return MPI.SUCCESS
    except MPI.Exception as error:
        return error.Get_error_class()


def case_intercomm():
    if SIZE < 2:
        return
    color = RANK % 2
    local = WORLD.Split(color, RANK)
    inter = local.Create_intercomm(0, WORLD, 1 if color == 0 else 0, 77)
    local_rank, local_size, remote_size = local.Get_rank(), local.Get_size(), inter.Get_remote_size()
    out = np.empty(1000, np.float32)
    inter.Allreduce(fill(1000, 1), out, op=MPI.SUM)
    counted("MPI_Allreduce", inter)
    emit_array("intercomm allreduce-f32", out)
    out64 = np.empty(1000, np.float64)
    inter.Allreduce(fill(1000, 2, np.float64), out64, op=MPI.SUM)
    counted("MPI_Allreduce", inter)
    emit_array("intercomm allreduce-f64", out64)
    out = np.empty(64, np.float32)
    inter.Iallreduce(fill(64, 3), out, op=MPI.SUM).Wait()
    counted("MPI_Iallreduce", inter)
    emit_array("intercomm iallreduce-f32", out)
    values = np.arange(100, 116, dtype=np.int32) if color == 0 else np.full(16, -1, np.int32)
    root = (MPI.ROOT if local_rank == 0 else MPI.PROC_NULL) if color == 0 else 0
    inter.Bcast(values, root=root)
    counted("MPI_Bcast", inter)
    emit_array("intercomm bcast", values)
    gathered = np.empty(remote_size, np.int32)
    inter.Allgather(np.array([1000 * color + RANK], np.int32), gathered)
    counted("MPI_Allgather", inter)
    emit_array("intercomm allgather", gathered)
    out = np.full(8, -99, np.float32)
    root = 0 if color == 1 else (MPI.ROOT if local_rank == 0 else MPI.PROC_NULL)
    inter.Reduce(fill(8, 4), out, op=MPI.SUM, root=root)
    counted("MPI_Reduce", inter)
    emit_array("intercomm reduce", out)
    if local_size == remote_size:
        out = np.empty(4, np.float32)
        inter.Reduce_scatter_block(fill(4 * local_size, 5), out, op=MPI.SUM)
        counted("MPI_Reduce_scatter_block", inter)
        emit_array("intercomm reduce-scatter-block", out)
    merged = inter.Merge(high=bool(color))
    sum_on(merged, 300, 6, "intercomm merged-allreduce")
    for comm in (merged, inter, local):
        comm.Free()


def case_threads():
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return
    sum_on(WORLD, 4096, 7, "threads world-before")
    comms = [WORLD.Dup() for _ in range(3)]
    digests = [hashlib.sha1() for _ in range(3)]
    failures = []

    def reduce(index, dtype):
        try:
            for i in range(12):
                n = (1, 1024, 16384, 8)[i % 4]
                out = np.empty(n, dtype)
                comms[index].Allreduce(fill(n, i, dtype), out, op=MPI.SUM)
                counted("MPI_Allreduce", comms[index])
                digests[index].update(out.tobytes())
        except Exception as error:  # noqa: BLE001 (reported, and the job fails)
            failures.append(repr(error))

    def create():
        try:
            for i in range(12):
                duplicate = comms[2].Dup()
                part = duplicate.Split(RANK % 2, -RANK)
                out = np.empty(32, np.float32)
                part.Allreduce(fill(32, i), out, op=MPI.SUM)
                counted("MPI_Allreduce", part)
                digests[2].update(out.tobytes())
                part.Free()
                duplicate.Free()
        except Exception as error:  # noqa: BLE001
            failures.append(repr(error))

    threads = [threading.Thread(target=reduce, args=(0, np.float32)),
               threading.Thread(target=reduce, args=(1, np.float64)), threading.Thread(target=create)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for label, digest in zip(("reducer-f32", "reducer-f64", "creator"), digests):
        emit(f"threads {label}", "hash=" + digest.hexdigest()[:16])
    for comm in comms:
        comm.Free()
    if failures:
        print(f"adversarial.py: rank {RANK}: {failures}", file=sys.stderr)
        sys.exit(1)
    sum_on(WORLD, 4096, 8, "threads world-after")


def case_failing():
    emit("failing free-world", f"error-class={error_class(lambda: MPI.Comm.Free(WORLD))}")
    emit("failing free-self", f"error-class={error_class(lambda: MPI.Comm.Free(MPI.COMM_SELF))}")
    data, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    emit("failing null-comm", f"error-class={error_class(lambda: MPI.COMM_NULL.Allreduce(data, out))}")
    for i in range(3):
        sum_on(WORLD, 2048, 10 + i, "failing then-world")


def triple_sum(a, b, datatype):
    x = np.frombuffer(a, np.float32)
    y = np.frombuffer(b, np.float32)
    y += x


def matrix_product(a, b, datatype):
    x = np.frombuffer(a, np.int32).reshape(-1, 2, 2)
    y = np.frombuffer(b, np.int32).reshape(-1, 2, 2)
    y[...] = np.matmul(x, y) % 97


def case_types():
    triple = MPI.FLOAT.Create_contiguous(3).Commit()
    matrix = MPI.INT.Create_vector(2, 2, 2).Commit()
    triple_op = MPI.Op.Create(triple_sum, commute=True)
    product = MPI.Op.Create(matrix_product, commute=False)
    out = np.empty(150, np.float32)
    WORLD.Allreduce([fill(150, 20), 50, triple], [out, 50, triple], op=triple_op)
    counted("MPI_Allreduce", WORLD)
    emit_array("types derived-user-sum", out)
    matrices = ((RANK * 7 + np.arange(40) * 3) % 11 + 1).astype(np.int32)
    out = np.empty(40, np.int32)
    WORLD.Allreduce([matrices, 10, matrix], [out, 10, matrix], op=product)
    counted("MPI_Allreduce", WORLD)
    emit_array("types noncommutative", out)
    inplace = fill(777, 21)
    WORLD.Allreduce(MPI.IN_PLACE, inplace, op=MPI.SUM)
    counted("MPI_Allreduce", WORLD)
    emit_array("types in-place", inplace)
    empty = np.full(1, -1, np.float32)
    WORLD.Allreduce([np.full(1, 5, np.float32), 0, MPI.FLOAT], [empty, 0, MPI.FLOAT], op=MPI.SUM)
    counted("MPI_Allreduce", WORLD)
    emit_array("types zero-count", empty)
    sum_on(MPI.COMM_SELF, 1000, 22, "types self")
    alone = WORLD.Split(RANK, 0)
    sum_on(alone, 5000, 23, "types size-one")
    out = np.empty(256, np.float32)
    alone.Iallreduce(fill(256, 24), out, op=MPI.SUM).Wait()
    counted("MPI_Iallreduce", alone)
    emit_array("types size-one-nonblocking", out)
    alone.Free()
    # A duplicate the agent does not see made (MPI_Comm_idup is not wrapped): at MPI_THREAD_MULTIPLE explore
    # and apply leave its sum untouched (not prepared).
    duplicate, request = WORLD.Idup()
    request.Wait()
    sum_on(duplicate, 64, 30, "types idup")
    duplicate.Free()
    out = np.empty(256, np.float32)
    WORLD.Allreduce(fill(256, 25), out, op=MPI.MAX)
    counted("MPI_Allreduce", WORLD)
    emit_array("types max", out)
    out = np.empty(100, np.int32)
    WORLD.Allreduce((RANK * 1000 + np.arange(100)).astype(np.int32), out, op=MPI.SUM)
    counted("MPI_Allreduce", WORLD)
    emit_array("types int-sum", out)
    for handle in (product, triple_op, matrix, triple):
        handle.Free()


def case_fork():
    sum_on(WORLD, 512, 30, "fork before")
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        total = sum(range(100000))
        os._exit(3 if total > 0 else 4)
    _, status = os.waitpid(child, 0)
    emit("fork child", f"exit={os.waitstatus_to_exitcode(status)}")
    emit("fork subprocess", f"status={subprocess.run(['sh', '-c', 'exit 5']).returncode}")
    sum_on(WORLD, 512, 31, "fork after")


def main():
    emit("thread-level-before", LEVELS.get(MPI.Query_thread(), "unknown"))
    sum_on(WORLD, 100, 0, "start world")
    case_intercomm()
    case_threads()
    case_failing()
    case_types()
    case_fork()
    emit("thread-level-after", LEVELS.get(MPI.Query_thread(), "unknown"))
    write_line(f"r{RANK} 9999 calls " + " ".join(f"{api}={calls[api]}" for api in APIS + ["world", "single"]))


if __name__ == "__main__":
    main()
