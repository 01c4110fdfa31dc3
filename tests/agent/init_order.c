/* MPI started behind the agent's back: PMPI_Init is the real initialisation without the MPI_Init entry
 * point, so an agent that only learns of MPI in its MPI_Init wrapper never sees it start. The agent must
 * notice that MPI is initialised at the first collective it intercepts and record from there on.
 *
 * Five MPI_Allreduce calls of 16 floats (sum), then MPI_Finalize. Rank 0 prints "init_order: ok" when
 * every result is right (the sums are small integers, exact in float), so the test also sees that the
 * calls went through the agent unchanged. Exit status 1 on a wrong result. */

#include <stdio.h>

#include <mpi.h>

enum { kCalls = 5, kCount = 16 };

int main(int argc, char** argv) {
  PMPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int wrong = 0;
  for (int call = 0; call < kCalls; ++call) {
    float send[kCount], receive[kCount];
    for (int i = 0; i < kCount; ++i) send[i] = (float)(rank + i + call);
    MPI_Allreduce(send, receive, kCount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    /* sum over ranks r of (r + i + call) = size (size - 1) / 2 + size (i + call) */
    for (int i = 0; i < kCount; ++i)
      if (receive[i] != (float)(size * (size - 1) / 2 + size * (i + call))) wrong = 1;
  }
  if (wrong) fprintf(stderr, "init_order: rank %d: wrong MPI_Allreduce result\n", rank);
  else if (rank == 0) printf("init_order: ok\n");
  MPI_Finalize();
  return wrong;
}
