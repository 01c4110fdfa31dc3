/* The agent's cost per intercepted call, isolated from the network: one rank, MPI_Allreduce of one float
 * (Open MPI copies it locally, ~13 ns) called through the agent's wrapper (MPI_Allreduce) and directly
 * (PMPI_Allreduce, which the agent does not intercept), in alternating blocks of 1,000,000 calls.
 *
 *   mpirun -np 1 -x LD_PRELOAD=build/default/agent/libgradscope-agent.so gradscope_agent_hot_path [BLOCKS]
 *
 * Prints the median over blocks of the time per call each way and of their difference. Without the agent
 * preloaded the difference is the cost of nothing (both go straight to Open MPI). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <mpi.h>

enum { kCallsPerBlock = 1000000, kMaxBlocks = 101 };

static double nowNs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int compareDoubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* values, int n) {
  qsort(values, (size_t)n, sizeof *values, compareDoubles);
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int blocks = argc > 1 ? atoi(argv[1]) : 21;
  if (blocks < 1 || blocks > kMaxBlocks) blocks = 21;
  float in = 1.0f, out = 0.0f;
  double direct[kMaxBlocks], wrapped[kMaxBlocks], difference[kMaxBlocks];
  for (int b = 0; b < blocks; ++b) {
    double t0 = nowNs();
    for (int i = 0; i < kCallsPerBlock; ++i) PMPI_Allreduce(&in, &out, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    direct[b] = (nowNs() - t0) / kCallsPerBlock;
    t0 = nowNs();
    for (int i = 0; i < kCallsPerBlock; ++i) MPI_Allreduce(&in, &out, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    wrapped[b] = (nowNs() - t0) / kCallsPerBlock;
    difference[b] = wrapped[b] - direct[b];
  }
  printf(
      "%d blocks of %d calls: PMPI_Allreduce %.2f ns/call, MPI_Allreduce %.2f ns/call, difference %.2f "
      "ns/call\n",
      blocks, kCallsPerBlock, median(direct, blocks), median(wrapped, blocks), median(difference, blocks));
  MPI_Finalize();
  return 0;
}
