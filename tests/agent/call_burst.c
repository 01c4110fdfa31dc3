/* A burst of small calls, as fast as MPI makes them: what the agent's recording rate limit
 * (GRADSCOPE_MAX_CALL_RATE) and its bounded tables are for.
 *
 *   call-burst CALLS [allreduce|isend]
 *
 * allreduce (the default): CALLS MPI_Allreduce calls of one float (sum) on MPI_COMM_WORLD, back to back;
 * each rank adds its rank + 1 (exact in float).
 * isend: CALLS point-to-point calls per rank, in exchanges of 4: MPI_Irecv and MPI_Isend of one int with
 * each neighbour in a ring (next and previous rank), completed by one MPI_Waitall; each message carries
 * the sender's rank and the exchange's number.
 * Rank 0 prints "call_burst: ok" when every result is right; exit status 1 on a wrong result or a bad
 * argument. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

static int allreduces(long calls, int rank, int size) {
  const float send = (float)(rank + 1), expected = (float)(size * (size + 1) / 2);
  int wrong = 0;
  for (long call = 0; call < calls; ++call) {
    float sum = 0;
    MPI_Allreduce(&send, &sum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    wrong |= sum != expected;
  }
  return wrong;
}

static int exchanges(long calls, int rank, int size) {
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  int wrong = 0;
  for (long exchange = 0; exchange < calls / 4; ++exchange) {
    int out[2] = {rank * 1000000 + (int)(exchange % 1000000), rank}, in[2] = {-1, -1};
    MPI_Request requests[4];
    MPI_Irecv(&in[0], 1, MPI_INT, prev, 1, MPI_COMM_WORLD, &requests[0]);
    MPI_Irecv(&in[1], 1, MPI_INT, next, 2, MPI_COMM_WORLD, &requests[1]);
    MPI_Isend(&out[0], 1, MPI_INT, next, 1, MPI_COMM_WORLD, &requests[2]);
    MPI_Isend(&out[1], 1, MPI_INT, prev, 2, MPI_COMM_WORLD, &requests[3]);
    MPI_Waitall(4, requests, MPI_STATUSES_IGNORE);
    wrong |= in[0] != prev * 1000000 + (int)(exchange % 1000000) || in[1] != next;
  }
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const long calls = argc >= 2 ? strtol(argv[1], NULL, 10) : -1;
  const char* kind = argc >= 3 ? argv[2] : "allreduce";
  if (calls < 0 || argc > 3 || (strcmp(kind, "allreduce") != 0 && strcmp(kind, "isend") != 0)) {
    fprintf(stderr, "usage: call-burst CALLS [allreduce|isend]\n");
    MPI_Finalize();
    return 1;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int wrong = strcmp(kind, "isend") == 0 ? exchanges(calls, rank, size) : allreduces(calls, rank, size);
  if (wrong) fprintf(stderr, "call_burst: rank %d: wrong %s result\n", rank, kind);
  if (rank == 0 && !wrong) printf("call_burst: ok\n");
  MPI_Finalize();
  return wrong;
}
