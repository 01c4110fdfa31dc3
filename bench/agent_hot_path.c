/* The agent's cost per intercepted call, measured inside one job so that both sides see the machine in
 * the same state: MPI_Allreduce called through the agent's wrapper (MPI_Allreduce) and directly
 * (PMPI_Allreduce, which the agent does not intercept), in alternating blocks.
 *
 *   mpirun -np 1 -x LD_PRELOAD=build/default/agent/libgradscope-agent.so gradscope_agent_hot_path [BLOCKS]
 *   mpirun -np 2 -x LD_PRELOAD=... gradscope_agent_hot_path [BLOCKS] [BYTES] [allreduce|pingpong|isend]
 *
 * One rank: the cost isolated from the network. MPI_Allreduce of one float (Open MPI copies it locally,
 * ~13 ns), blocks of 1,000,000 back-to-back calls; prints the median over blocks of the time per call
 * each way and of their difference.
 *
 * Several ranks: the OSU loop (MPI_Wtime around each call of BYTES, default 8, then a barrier), blocks
 * of 2,000 calls up to 8 KiB and of 4 calls above (a 64 MiB all-reduce takes tens of milliseconds here),
 * the order of the two kinds swapped from block to block; a block's latency is the average over
 * its calls and ranks, and the line gives the medians over blocks and the median of the per-block
 * ratios (wrapped / direct). The VM this was written on switches its 8-byte latency between two modes
 * for tens of seconds at a time, which makes separate runs with and without the agent differ by ±20%;
 * here both kinds share the mode.
 *
 * pingpong and isend time point-to-point calls the same way, with two ranks: OSU's osu_latency loop (rank 0
 * sends BYTES to rank 1 and receives them back; a call's latency is half the round trip), by
 * MPI_Send/MPI_Recv, or by MPI_Isend/MPI_Irecv each completed by MPI_Wait; direct blocks call the PMPI_
 * functions throughout. The barriers between calls are PMPI_Barrier in both kinds of block.
 *
 * Without the agent preloaded both kinds go straight to Open MPI: the difference is the cost of nothing. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

enum {
  kCallsPerBlock = 1000000,
  kMaxBlocks = 101,
  kOsuSmallBytes = 8192,
  kOsuCallsPerBlock = 2000,
  kOsuLargeCallsPerBlock = 4,
  kMaxOsuBlocks = 400
};

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

static void timeBackToBack(int blocks) {
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
}

/* The OSU loop's buffers: `count` floats each way. */
static float* g_in;
static float* g_out;
static int g_count;

enum Operation { kAllreduce, kPingPong, kIsend };
static const char* const kOperationNames[] = {"MPI_Allreduce", "MPI_Send/MPI_Recv",
                                              "MPI_Isend/MPI_Irecv+MPI_Wait"};

/* One message of the ping-pong, through the wrappers or around them. */
static void send(int wrapped, int nonblocking, int peer) {
  MPI_Request request;
  if (!nonblocking) {
    if (wrapped) MPI_Send(g_in, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
    else PMPI_Send(g_in, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
  } else if (wrapped) {
    MPI_Isend(g_in, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  } else {
    PMPI_Isend(g_in, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &request);
    PMPI_Wait(&request, MPI_STATUS_IGNORE);
  }
}
static void receive(int wrapped, int nonblocking, int peer) {
  MPI_Request request;
  if (!nonblocking) {
    if (wrapped) MPI_Recv(g_out, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    else PMPI_Recv(g_out, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (wrapped) {
    MPI_Irecv(g_out, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  } else {
    PMPI_Irecv(g_out, g_count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &request);
    PMPI_Wait(&request, MPI_STATUS_IGNORE);
  }
}

/* One block of the OSU loop: this rank's average latency in microseconds. */
static double osuBlock(enum Operation operation, int wrapped, int calls, int rank) {
  double total = 0.0;
  PMPI_Barrier(MPI_COMM_WORLD);
  if (operation != kAllreduce) {
    /* osu_latency: rank 0 and 1 bounce one message; the others (none with 2 ranks) wait. */
    const int nonblocking = operation == kIsend;
    const double start = MPI_Wtime();
    for (int i = 0; i < calls; ++i) {
      if (rank == 0) {
        send(wrapped, nonblocking, 1);
        receive(wrapped, nonblocking, 1);
      } else if (rank == 1) {
        receive(wrapped, nonblocking, 0);
        send(wrapped, nonblocking, 0);
      }
    }
    total = (MPI_Wtime() - start) / 2;
    PMPI_Barrier(MPI_COMM_WORLD);
    return total * 1e6 / calls;
  }
  for (int i = 0; i < calls; ++i) {
    const double start = MPI_Wtime();
    if (wrapped) MPI_Allreduce(g_in, g_out, g_count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else PMPI_Allreduce(g_in, g_out, g_count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    total += MPI_Wtime() - start;
    PMPI_Barrier(MPI_COMM_WORLD);
  }
  return total * 1e6 / calls;
}

static void timeOsuLoop(enum Operation operation, int blocks, size_t bytes, int rank, int ranks) {
  double mine[2][kMaxOsuBlocks], all[2][kMaxOsuBlocks], ratio[kMaxOsuBlocks];
  const int small = bytes <= kOsuSmallBytes;
  const int calls = small ? kOsuCallsPerBlock : kOsuLargeCallsPerBlock;
  g_count = (int)(bytes / sizeof(float));
  g_in = malloc(bytes);
  g_out = malloc(bytes);
  if (g_in == NULL || g_out == NULL) {
    fprintf(stderr, "gradscope_agent_hot_path: cannot allocate 2 x %zu bytes\n", bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  for (int i = 0; i < g_count; ++i) {
    g_in[i] = (float)(i % 7);
    g_out[i] = 0.0f;
  }
  for (int i = 0; i < (small ? 1000 : 4); ++i)
    osuBlock(operation, i % 2, 1, rank); /* warm-up of both paths */
  for (int b = 0; b < blocks; ++b) {
    const int first = b % 2;
    mine[first][b] = osuBlock(operation, first, calls, rank);
    mine[!first][b] = osuBlock(operation, !first, calls, rank);
  }
  free(g_in);
  free(g_out);
  PMPI_Reduce(mine, all, 2 * kMaxOsuBlocks, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  /* The ping-pong's latency is rank 0's (its round trips); the all-reduce's the average over ranks. */
  for (int b = 0; b < blocks; ++b) {
    if (operation == kAllreduce) {
      all[0][b] /= ranks;
      all[1][b] /= ranks;
    } else {
      all[0][b] = mine[0][b];
      all[1][b] = mine[1][b];
    }
    ratio[b] = all[1][b] / all[0][b];
  }
  printf(
      "%d ranks, %d blocks of %d calls (%zu B, OSU loop, %s): direct %.4f us, wrapped %.4f us, "
      "median ratio %.4f\n",
      ranks, blocks, calls, bytes, kOperationNames[operation], median(all[0], blocks), median(all[1], blocks),
      median(ratio, blocks));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int limit = ranks == 1 ? kMaxBlocks : kMaxOsuBlocks;
  int blocks = argc > 1 ? atoi(argv[1]) : ranks == 1 ? 21 : 100;
  if (blocks < 1 || blocks > limit) blocks = ranks == 1 ? 21 : 100;
  /* A whole number of floats, at least one. */
  const long long asked = argc > 2 ? atoll(argv[2]) : 8;
  const size_t bytes = asked >= (long long)sizeof(float) ? (size_t)asked / sizeof(float) * sizeof(float) : 8;
  if (bytes / sizeof(float) > (size_t)INT_MAX) {
    if (rank == 0)
      fprintf(stderr, "gradscope_agent_hot_path: %zu bytes is more than one MPI count of floats\n", bytes);
    MPI_Finalize();
    return 2;
  }
  enum Operation operation = kAllreduce;
  if (argc > 3) {
    if (strcmp(argv[3], "pingpong") == 0) operation = kPingPong;
    else if (strcmp(argv[3], "isend") == 0) operation = kIsend;
    else if (strcmp(argv[3], "allreduce") != 0) {
      if (rank == 0)
        fprintf(stderr, "gradscope_agent_hot_path: %s: not allreduce, pingpong or isend\n", argv[3]);
      MPI_Finalize();
      return 2;
    }
  }
  if (ranks == 1) timeBackToBack(blocks);
  else timeOsuLoop(operation, blocks, bytes, rank, ranks);
  MPI_Finalize();
  return 0;
}
