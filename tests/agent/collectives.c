/* Every MPI function the agent intercepts, on communicators made by every creation function it wraps,
 * with results the program checks itself (integer-valued inputs: every sum, maximum and copy is exact).
 *
 *   collectives [--steps N]    (default 3)
 *
 * Set-up: from MPI_COMM_WORLD, in this order, MPI_Comm_dup, MPI_Comm_split (colour rank % 2),
 * MPI_Comm_split_type (MPI_COMM_TYPE_SHARED), MPI_Comm_create (the world group), MPI_Comm_create_group
 * (the world group) and MPI_Comm_dup_with_info. No collective is intercepted before the first step.
 *
 * Each step makes the same 26 intercepted calls, in this order (s: the step, n: the world size):
 *    1  world       MPI_Reduce                 7 float  sum, root s % n, out of place
 *    2  world       MPI_Reduce_scatter         recvcounts r + 1 (n(n+1)/2 in all), int  sum
 *    3  world       MPI_Reduce_scatter_block   recvcount 3 (3n sent), double  max
 *    4  world       MPI_Allgather              5 int, out of place
 *    5  world       MPI_Allgather              MPI_IN_PLACE, recvcount 2 double
 *    6  world       MPI_Bcast                  9 int, root (s + 1) % n
 *    7  world       MPI_Allreduce              3 long long  sum, MPI_IN_PLACE
 *    8  dup         MPI_Iallreduce 100, completed by MPI_Wait
 *    9  dup         MPI_Iallreduce 101, completed by MPI_Test in a loop
 *   10-11 dup       MPI_Iallreduce 102, 103, completed by one MPI_Waitall (with an MPI_REQUEST_NULL between
 *                   them and a point-to-point exchange's two requests after them)
 *   12-13 dup       MPI_Iallreduce 104, 105 (the second MPI_IN_PLACE), MPI_Testall in a loop
 *   14-15 dup       MPI_Iallreduce 106, 107, MPI_Waitany until both are done
 *   16-17 dup       MPI_Iallreduce 108, 109, MPI_Testany in a loop
 *   18-19 dup       MPI_Iallreduce 110, 111, MPI_Waitsome until both are done
 *   20-21 dup       MPI_Iallreduce 112, 113, MPI_Testsome in a loop
 *                   (all float sum, out of place unless said)
 *   22  split       MPI_Allreduce              4 float  sum
 *   23  split_type  MPI_Allreduce              2 double  max
 *   24  create      MPI_Bcast                  1 int, root 0
 *   25  create_group MPI_Reduce                3 double  sum, root 0
 *   26  dup_with_info MPI_Allgather            1 int
 * Then every communicator is freed and MPI_Finalize runs.
 *
 * Rank 0 prints one line per step with a hash of every rank's results (sent to it point to point, which
 * the agent does not intercept), so that a run under the agent can be compared with a plain one byte for
 * byte. A wrong result prints "collectives: rank R step S: ..." on stderr and the exit status is 1. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

enum { kCommunicators = 6, kMaxRanks = 64 };

static int g_rank, g_size, g_step, g_wrong;
static uint64_t g_hash = 1469598103934665603ull; /* FNV-1a over every result this rank got */

static void hashBytes(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < bytes; ++i) g_hash = (g_hash ^ p[i]) * 1099511628211ull;
}

static void expect(int ok, const char* what, int index) {
  if (ok) return;
  if (g_wrong++ < 10)
    fprintf(stderr, "collectives: rank %d step %d: %s wrong at %d\n", g_rank, g_step, what, index);
}

static void fill(float* values, int count, int base) {
  for (int i = 0; i < count; ++i) values[i] = (float)(base + i + g_rank);
}

/* The sum over ranks of (base + i + r): n (base + i) + n (n - 1) / 2. */
static void checkSum(const float* values, int count, int base, int ranks, const char* what) {
  for (int i = 0; i < count; ++i)
    expect(values[i] == (float)(ranks * (base + i) + ranks * (ranks - 1) / 2), what, i);
  hashBytes(values, sizeof(float) * (size_t)count);
}

/* A nonblocking all-reduce of `count` floats on `comm`: out of place, or in place in `out`. */
static void startSum(float* in, float* out, int count, int in_place, MPI_Comm comm, MPI_Request* request) {
  if (in_place) {
    fill(out, count, g_step);
    MPI_Iallreduce(MPI_IN_PLACE, out, count, MPI_FLOAT, MPI_SUM, comm, request);
  } else {
    fill(in, count, g_step);
    MPI_Iallreduce(in, out, count, MPI_FLOAT, MPI_SUM, comm, request);
  }
}

static void worldCalls(MPI_Comm world) {
  const int n = g_size, s = g_step, r = g_rank;
  /* 1: MPI_Reduce, 7 float. */
  float reduce_in[7], reduce_out[7];
  fill(reduce_in, 7, s);
  MPI_Reduce(reduce_in, reduce_out, 7, MPI_FLOAT, MPI_SUM, s % n, world);
  if (r == s % n) checkSum(reduce_out, 7, s, n, "MPI_Reduce");
  /* 2: MPI_Reduce_scatter, rank q receives q + 1 ints; element j is the sum of (q' j + s) over ranks q'. */
  int counts[kMaxRanks], total = 0, offset = 0;
  for (int q = 0; q < n; ++q) {
    counts[q] = q + 1;
    if (q < r) offset += counts[q];
    total += counts[q];
  }
  int* scatter_in = malloc(sizeof(int) * (size_t)total);
  int scatter_out[kMaxRanks];
  for (int j = 0; j < total; ++j) scatter_in[j] = r * j + s;
  MPI_Reduce_scatter(scatter_in, scatter_out, counts, MPI_INT, MPI_SUM, world);
  for (int i = 0; i < counts[r]; ++i)
    expect(scatter_out[i] == (offset + i) * n * (n - 1) / 2 + n * s, "MPI_Reduce_scatter", i);
  hashBytes(scatter_out, sizeof(int) * (size_t)counts[r]);
  free(scatter_in);
  /* 3: MPI_Reduce_scatter_block, 3 doubles each, max of (q + j) over ranks q: n - 1 + j. */
  double* block_in = malloc(sizeof(double) * 3 * (size_t)n);
  double block_out[3];
  for (int j = 0; j < 3 * n; ++j) block_in[j] = r + j;
  MPI_Reduce_scatter_block(block_in, block_out, 3, MPI_DOUBLE, MPI_MAX, world);
  for (int i = 0; i < 3; ++i) expect(block_out[i] == n - 1 + 3 * r + i, "MPI_Reduce_scatter_block", i);
  hashBytes(block_out, sizeof block_out);
  free(block_in);
  /* 4: MPI_Allgather, 5 ints from each rank. */
  int gather_in[5], gather_out[5 * kMaxRanks];
  for (int i = 0; i < 5; ++i) gather_in[i] = 10 * r + i + s;
  MPI_Allgather(gather_in, 5, MPI_INT, gather_out, 5, MPI_INT, world);
  for (int i = 0; i < 5 * n; ++i) expect(gather_out[i] == 10 * (i / 5) + i % 5 + s, "MPI_Allgather", i);
  hashBytes(gather_out, sizeof(int) * 5 * (size_t)n);
  /* 5: MPI_Allgather in place, 2 doubles from each rank. */
  double in_place[2 * kMaxRanks];
  for (int i = 0; i < 2; ++i) in_place[2 * r + i] = 100.0 * r + i + s;
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, in_place, 2, MPI_DOUBLE, world);
  for (int i = 0; i < 2 * n; ++i)
    expect(in_place[i] == 100.0 * (i / 2) + i % 2 + s, "MPI_Allgather in place", i);
  hashBytes(in_place, sizeof(double) * 2 * (size_t)n);
  /* 6: MPI_Bcast, 9 ints from rank (s + 1) % n. */
  const int root = (s + 1) % n;
  int bcast[9];
  for (int i = 0; i < 9; ++i) bcast[i] = r == root ? i * s + root : -1;
  MPI_Bcast(bcast, 9, MPI_INT, root, world);
  for (int i = 0; i < 9; ++i) expect(bcast[i] == i * s + root, "MPI_Bcast", i);
  hashBytes(bcast, sizeof bcast);
  /* 7: MPI_Allreduce in place, 3 long long. */
  long long big[3];
  for (int i = 0; i < 3; ++i) big[i] = (1LL << 40) * (r + 1) + i;
  MPI_Allreduce(MPI_IN_PLACE, big, 3, MPI_LONG_LONG, MPI_SUM, world);
  for (int i = 0; i < 3; ++i)
    expect(big[i] == (1LL << 40) * ((long long)n * (n + 1) / 2) + (long long)n * i, "MPI_Allreduce long long",
           i);
  hashBytes(big, sizeof big);
}

/* 8-21: fourteen MPI_Iallreduce on `dup`, of 100 + k floats, completed by each Wait and Test function. */
static void nonblockingCalls(MPI_Comm dup, MPI_Comm world) {
  enum { kCalls = 14, kMaxCount = 113 };
  static float in[kCalls][kMaxCount], out[kCalls][kMaxCount];
  MPI_Request requests[5];
  int flag = 0, index = 0, done = 0, outcount = 0, indices[5];
#define START(k, slot, in_place) startSum(in[k], out[k], 100 + (k), (in_place), dup, &requests[slot])
#define CHECK(k) checkSum(out[k], 100 + (k), g_step, g_size, "MPI_Iallreduce")
  START(0, 0, 0);
  MPI_Wait(&requests[0], MPI_STATUS_IGNORE);
  CHECK(0);

  START(1, 0, 0);
  do MPI_Test(&requests[0], &flag, MPI_STATUS_IGNORE);
  while (!flag);
  CHECK(1);

  /* Two all-reduces, a null request and a ring exchange of this step's number on the world. */
  START(2, 0, 0);
  requests[1] = MPI_REQUEST_NULL;
  START(3, 2, 0);
  int sent = g_step, received = -1;
  MPI_Irecv(&received, 1, MPI_INT, (g_rank + g_size - 1) % g_size, 7, world, &requests[3]);
  MPI_Isend(&sent, 1, MPI_INT, (g_rank + 1) % g_size, 7, world, &requests[4]);
  MPI_Waitall(5, requests, MPI_STATUSES_IGNORE);
  expect(received == g_step, "point-to-point exchange", 0);
  CHECK(2);
  CHECK(3);

  START(4, 0, 0);
  START(5, 1, 1);
  do MPI_Testall(2, requests, &flag, MPI_STATUSES_IGNORE);
  while (!flag);
  CHECK(4);
  CHECK(5);

  START(6, 0, 0);
  START(7, 1, 0);
  for (done = 0; done < 2; ++done) MPI_Waitany(2, requests, &index, MPI_STATUS_IGNORE);
  CHECK(6);
  CHECK(7);

  START(8, 0, 0);
  START(9, 1, 0);
  for (done = 0; done < 2;) {
    MPI_Testany(2, requests, &index, &flag, MPI_STATUS_IGNORE);
    if (flag && index != MPI_UNDEFINED) ++done;
  }
  CHECK(8);
  CHECK(9);

  START(10, 0, 0);
  START(11, 1, 0);
  for (done = 0; done < 2; done += outcount)
    MPI_Waitsome(2, requests, &outcount, indices, MPI_STATUSES_IGNORE);
  CHECK(10);
  CHECK(11);

  START(12, 0, 0);
  START(13, 1, 0);
  for (done = 0; done < 2;) {
    MPI_Testsome(2, requests, &outcount, indices, MPI_STATUSES_IGNORE);
    if (outcount != MPI_UNDEFINED) done += outcount;
  }
  CHECK(12);
  CHECK(13);
#undef START
#undef CHECK
}

static void createdCommunicatorCalls(MPI_Comm split, MPI_Comm split_type, MPI_Comm created,
                                     MPI_Comm created_group, MPI_Comm dup_with_info) {
  int size = 0;
  /* 22: the split (ranks of one parity). */
  float four[4];
  fill(four, 4, g_step);
  MPI_Allreduce(MPI_IN_PLACE, four, 4, MPI_FLOAT, MPI_SUM, split);
  /* The sum of (s + i + r) over the ranks r of this parity. */
  for (int i = 0; i < 4; ++i) {
    float expected = 0;
    for (int q = g_rank % 2; q < g_size; q += 2) expected += (float)(g_step + i + q);
    expect(four[i] == expected, "MPI_Allreduce on the split", i);
  }
  hashBytes(four, sizeof four);
  /* 23: the shared-memory split (one node here: every rank). */
  double two[2] = {g_rank + g_step, -g_rank}, two_out[2];
  MPI_Allreduce(two, two_out, 2, MPI_DOUBLE, MPI_MAX, split_type);
  MPI_Comm_size(split_type, &size);
  expect(two_out[0] == size - 1 + g_step && two_out[1] == 0, "MPI_Allreduce on the shared-memory split", 0);
  hashBytes(two_out, sizeof two_out);
  /* 24: MPI_Comm_create's communicator. */
  int one = g_rank == 0 ? 1000 + g_step : -1;
  MPI_Bcast(&one, 1, MPI_INT, 0, created);
  expect(one == 1000 + g_step, "MPI_Bcast on MPI_Comm_create's communicator", 0);
  hashBytes(&one, sizeof one);
  /* 25: MPI_Comm_create_group's communicator. */
  double three[3] = {g_rank, g_step, 1}, three_out[3] = {0, 0, 0};
  MPI_Reduce(three, three_out, 3, MPI_DOUBLE, MPI_SUM, 0, created_group);
  if (g_rank == 0) {
    expect(three_out[0] == g_size * (g_size - 1) / 2 && three_out[1] == g_size * g_step &&
               three_out[2] == g_size,
           "MPI_Reduce on MPI_Comm_create_group's communicator", 0);
    hashBytes(three_out, sizeof three_out);
  }
  /* 26: MPI_Comm_dup_with_info's communicator. */
  int mine = g_rank * g_rank, all[kMaxRanks];
  MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, dup_with_info);
  for (int q = 0; q < g_size; ++q) expect(all[q] == q * q, "MPI_Allgather on MPI_Comm_dup_with_info's", q);
  hashBytes(all, sizeof(int) * (size_t)g_size);
}

int main(int argc, char** argv) {
  int steps = 3;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else {
      fprintf(stderr, "collectives: unknown argument '%s'; usage: collectives [--steps N]\n", argv[i]);
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size > kMaxRanks) {
    if (g_rank == 0) fprintf(stderr, "collectives: at most %d ranks\n", kMaxRanks);
    MPI_Finalize();
    return 2;
  }
  MPI_Group world_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Comm comms[kCommunicators];
  MPI_Comm_dup(MPI_COMM_WORLD, &comms[0]);
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &comms[1]);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &comms[2]);
  MPI_Comm_create(MPI_COMM_WORLD, world_group, &comms[3]);
  MPI_Comm_create_group(MPI_COMM_WORLD, world_group, 5, &comms[4]);
  MPI_Comm_dup_with_info(MPI_COMM_WORLD, MPI_INFO_NULL, &comms[5]);
  MPI_Group_free(&world_group);

  for (g_step = 0; g_step < steps; ++g_step) {
    g_hash = 1469598103934665603ull;
    worldCalls(MPI_COMM_WORLD);
    nonblockingCalls(comms[0], MPI_COMM_WORLD);
    createdCommunicatorCalls(comms[1], comms[2], comms[3], comms[4], comms[5]);
    /* Rank 0 prints every rank's hash of this step, received point to point. */
    if (g_rank == 0) {
      printf("collectives: step %d:", g_step);
      for (int q = 0; q < g_size; ++q) {
        uint64_t hash = g_hash;
        if (q > 0) MPI_Recv(&hash, 1, MPI_UINT64_T, q, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf(" %016llx", (unsigned long long)hash);
      }
      printf("\n");
    } else {
      MPI_Send(&g_hash, 1, MPI_UINT64_T, 0, 9, MPI_COMM_WORLD);
    }
  }
  for (int i = 0; i < kCommunicators; ++i) MPI_Comm_free(&comms[i]);
  fflush(stdout);
  MPI_Finalize();
  return g_wrong != 0;
}
