/* A burst of small all-reduces, as fast as MPI makes them: what the agent's recording rate limit
 * (GRADSCOPE_MAX_CALL_RATE) is for.
 *
 *   call-burst CALLS
 *
 * CALLS MPI_Allreduce calls of one float (sum) on MPI_COMM_WORLD, back to back. Rank 0 prints
 * "call_burst: ok" when every result is right (each rank adds its rank + 1: exact in float); exit
 * status 1 on a wrong result or a bad argument. */

#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const long calls = argc == 2 ? strtol(argv[1], NULL, 10) : -1;
  if (calls < 0) {
    fprintf(stderr, "usage: call-burst CALLS\n");
    MPI_Finalize();
    return 1;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const float send = (float)(rank + 1), expected = (float)(size * (size + 1) / 2);
  int wrong = 0;
  for (long call = 0; call < calls; ++call) {
    float sum = 0;
    MPI_Allreduce(&send, &sum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    wrong |= sum != expected;
  }
  if (wrong) fprintf(stderr, "call_burst: rank %d: wrong MPI_Allreduce result\n", rank);
  if (rank == 0 && !wrong) printf("call_burst: ok\n");
  MPI_Finalize();
  return wrong;
}
