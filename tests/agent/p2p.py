"""mpi4py's point-to-point and all-to-all calls, for the agent: tests/agent/p2p.c's subject as a Python job
makes it (Debian's /usr/bin/python3 with python3-mpi4py and python3-numpy).

  mpiexec -np N /usr/bin/python3 p2p.py [--steps S]

Each step (r: this rank, n: the world size, next/prev: r +- 1 mod n), on MPI.COMM_WORLD:
  1  Sendrecv of 6 float64 to next (tag 1) from prev (tag 1)       buffer API: MPI_Sendrecv
  2  send of a dict to next (tag 2), recv from MPI.ANY_SOURCE      pickled: MPI_Send, MPI_Mprobe + MPI_Mrecv
  3  Isend / Irecv of 4 int32 to next / from prev (tag 3), Wait     MPI_Isend, MPI_Irecv, MPI_Wait
  4  Irecv from prev (tag 4) completed by Test in a loop, Send to next (tag 4)   MPI_Irecv, MPI_Send
  5  Alltoall of 2 int32 per peer; Alltoallv of r + j + 1 int32 to peer j
  6  Barrier
Rank 0 prints a line per step with a digest (sha256) of every rank's received data, gathered with
comm.gather (pickled: MPI_Gather of the sizes, then MPI_Gatherv, which the agent does not record)."""

import argparse
import hashlib
import pickle
import sys

import numpy as np
from mpi4py import MPI


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    steps = parser.parse_args().steps
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    wrong = 0

    def expect(ok, what):
        nonlocal wrong
        if not ok:
            wrong += 1
            print(f"p2p.py: rank {rank} step {step}: {what} wrong", file=sys.stderr)

    for step in range(steps):
        digest = hashlib.sha256()

        out = np.arange(6, dtype=np.float64) + 1000 * rank + 100 * step
        got = np.empty(6, dtype=np.float64)
        comm.Sendrecv(out, dest=nxt, sendtag=1, recvbuf=got, source=prv, recvtag=1)
        expect(np.array_equal(got, np.arange(6, dtype=np.float64) + 1000 * prv + 100 * step), "Sendrecv")
        digest.update(got.tobytes())

        comm.send({"from": rank, "step": step}, dest=nxt, tag=2)
        status = MPI.Status()
        message = comm.recv(source=MPI.ANY_SOURCE, tag=2, status=status)
        expect(message == {"from": prv, "step": step} and status.Get_source() == prv, "recv ANY_SOURCE")
        digest.update(pickle.dumps(message, protocol=4))

        out4 = np.arange(4, dtype=np.int32) + 10 * rank + step
        got4 = np.empty(4, dtype=np.int32)
        requests = [comm.Irecv(got4, source=prv, tag=3), comm.Isend(out4, dest=nxt, tag=3)]
        MPI.Request.Waitall(requests)
        expect(np.array_equal(got4, np.arange(4, dtype=np.int32) + 10 * prv + step), "Irecv")
        digest.update(got4.tobytes())

        got1 = np.empty(1, dtype=np.int32)
        request = comm.Irecv(got1, source=prv, tag=4)
        comm.Send(np.array([rank * 7 + step], dtype=np.int32), dest=nxt, tag=4)
        while not request.Test():
            pass
        expect(got1[0] == prv * 7 + step, "Irecv tested")
        digest.update(got1.tobytes())

        a2a_out = np.array([100 * rank + j for j in range(2 * size)], dtype=np.int32)
        a2a_in = np.empty(2 * size, dtype=np.int32)
        comm.Alltoall(a2a_out, a2a_in)
        expect(all(a2a_in[2 * j + i] == 100 * j + 2 * rank + i for j in range(size) for i in range(2)), "Alltoall")
        digest.update(a2a_in.tobytes())
        sendcounts = [rank + j + 1 for j in range(size)]
        recvcounts = [j + rank + 1 for j in range(size)]
        v_out = np.arange(sum(sendcounts), dtype=np.int32) + 1000 * rank
        v_in = np.empty(sum(recvcounts), dtype=np.int32)
        comm.Alltoallv([v_out, sendcounts], [v_in, recvcounts])
        offset = 0
        for j in range(size):
            start = sum(j + k + 1 for k in range(rank))
            expect(np.array_equal(v_in[offset:offset + recvcounts[j]],
                                  np.arange(start, start + recvcounts[j], dtype=np.int32) + 1000 * j), "Alltoallv")
            offset += recvcounts[j]
        digest.update(v_in.tobytes())

        comm.Barrier()
        digests = comm.gather(digest.hexdigest(), root=0)
        if rank == 0:
            print(f"p2p.py: step {step} digest {hashlib.sha256(''.join(digests).encode()).hexdigest()[:32]}",
                  flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
