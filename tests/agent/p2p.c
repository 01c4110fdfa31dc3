/* Every point-to-point, all-to-all, barrier and nonblocking MPI function the agent records, with the
 * argument forms that must keep working under it, and results the program checks itself (integer values:
 * every copy and sum is exact).
 *
 *   p2p [--steps N]    (default 2; any number of ranks from 2)
 *
 * Each step, on MPI_COMM_WORLD (s: the step, r: this rank, n: the world size, next/prev: r ± 1 mod n):
 *    1  MPI_Send 4 double to next, tag 10 + s; MPI_Recv 4 double from prev, tag 10 + s
 *       (even ranks send first, odd ranks receive first; MPI_STATUS_IGNORE)
 *    2  MPI_Ssend 3 int to prev, tag 12; MPI_Recv 3 int from next, tag 12 (same order)
 *    3  ranks > 0: MPI_Send 2 int (value r) to 0, tag 20 + r; rank 0: n - 1 MPI_Recv from MPI_ANY_SOURCE
 *       with MPI_ANY_TAG (a status it reads); then MPI_Barrier (no later message may match them)
 *    4  MPI_Irecv 5 int from prev, tag 40, and MPI_Isend 5 int to next, tag 40; the receive completed by
 *       MPI_Wait, the send by MPI_Test in a loop
 *    5  MPI_Sendrecv 5 float to next (tag 30) from prev (tag 30)
 *    6  MPI_Sendrecv_replace 6 int to prev (tag 31) from next (tag 31)
 *    7  MPI_Send of a derived vector type (2 blocks of 2 int, stride 3) to next, tag 50, received as 4 int
 *    8  MPI_Barrier
 *    9  MPI_Alltoall 2 int per peer; then MPI_Alltoall in place, 1 int per peer
 *   10  MPI_Alltoallv: r + j + 1 int to peer j
 *   11  MPI_Gather 3 int to root 0; MPI_Scatter 2 int from root n - 1; MPI_Allgatherv r + 1 int
 *   12  MPI_Ibcast 4 int (root 0), MPI_Ireduce 3 int sum (root 0), MPI_Iallgather 2 int,
 *       MPI_Ireduce_scatter (recvcounts 1), MPI_Ireduce_scatter_block 2 int, MPI_Ialltoall 1 int per peer,
 *       MPI_Ibarrier: completed by one MPI_Waitall (MPI_STATUSES_IGNORE)
 *   13  two MPI_Irecv from MPI_ANY_SOURCE (tag 60) completed by MPI_Waitany, and their two MPI_Isend (to
 *       next and prev, tag 60) by MPI_Waitsome in a loop
 *   14  a persistent send/receive pair (MPI_Send_init/MPI_Recv_init, MPI_Start, MPI_Wait): not recorded
 *   15  an MPI_Irecv from self that is cancelled (MPI_Cancel, MPI_Wait): not recorded
 *   16  MPI_Isend 1 int to next, tag 70, released with MPI_Request_free; MPI_Recv 1 int from prev, tag 70
 *   17  MPI_Send and MPI_Recv with MPI_PROC_NULL (recorded with no peer and no bytes)
 *   18  a window of 32 MPI_Irecv of 1 int from prev and 32 MPI_Isend to next (tag 95), one MPI_Waitall, as
 *       osu_bw does: Open MPI returns one shared request for every eager send that completed as it was
 *       posted
 *
 * Rank 0 prints one line per step with a hash of every rank's results (gathered with MPI_Gather), so that a
 * run under the agent can be compared with a plain one byte for byte. A wrong result prints
 * "p2p: rank R step S: ..." on stderr and the exit status is 1. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

enum { kMaxRanks = 64 };

static int g_rank, g_size, g_step, g_wrong;
static uint64_t g_hash = 1469598103934665603ull; /* FNV-1a over every result this rank got */

static void hashBytes(const void* data, size_t bytes) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < bytes; ++i) g_hash = (g_hash ^ p[i]) * 1099511628211ull;
}

static void expect(int ok, const char* what, int index) {
  if (ok) return;
  if (g_wrong++ < 10) fprintf(stderr, "p2p: rank %d step %d: %s wrong at %d\n", g_rank, g_step, what, index);
}

/* The value rank `rank` puts at position i of buffer `id` this step. */
static int value(int id, int rank, int i) {
  return id * 100000 + g_step * 1000 + rank * 10 + i;
}

static void sendRecvPair(int first_send, void (*send)(void), void (*recv)(void)) {
  if (first_send) {
    send();
    recv();
  } else {
    recv();
    send();
  }
}

static int next(void) {
  return (g_rank + 1) % g_size;
}
static int prev(void) {
  return (g_rank + g_size - 1) % g_size;
}

static double g_d_out[4], g_d_in[4];
static int g_i_out[8], g_i_in[8];
static void send1(void) {
  for (int i = 0; i < 4; ++i) g_d_out[i] = value(1, g_rank, i);
  MPI_Send(g_d_out, 4, MPI_DOUBLE, next(), 10 + g_step, MPI_COMM_WORLD);
}
static void recv1(void) {
  MPI_Recv(g_d_in, 4, MPI_DOUBLE, prev(), 10 + g_step, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  for (int i = 0; i < 4; ++i) expect(g_d_in[i] == value(1, prev(), i), "MPI_Recv double", i);
  hashBytes(g_d_in, sizeof g_d_in);
}
static void send2(void) {
  for (int i = 0; i < 3; ++i) g_i_out[i] = value(2, g_rank, i);
  MPI_Ssend(g_i_out, 3, MPI_INT, prev(), 12, MPI_COMM_WORLD);
}
static void recv2(void) {
  MPI_Recv(g_i_in, 3, MPI_INT, next(), 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  for (int i = 0; i < 3; ++i) expect(g_i_in[i] == value(2, next(), i), "MPI_Ssend int", i);
  hashBytes(g_i_in, 3 * sizeof(int));
}

static void anySource(void) {
  if (g_rank > 0) {
    const int out[2] = {g_rank, value(3, g_rank, 0)};
    MPI_Send(out, 2, MPI_INT, 0, 20 + g_rank, MPI_COMM_WORLD);
    return;
  }
  int seen[kMaxRanks] = {0};
  for (int k = 1; k < g_size; ++k) {
    int in[2];
    MPI_Status status;
    MPI_Recv(in, 2, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
    const int from = status.MPI_SOURCE;
    expect(from > 0 && from < g_size && in[0] == from && status.MPI_TAG == 20 + from &&
               in[1] == value(3, from, 0),
           "MPI_ANY_SOURCE receive", k);
    if (from > 0 && from < g_size) seen[from] = in[1];
  }
  hashBytes(seen, sizeof(int) * (size_t)g_size);
}

static void nonblockingPair(void) {
  int out[5], in[5];
  for (int i = 0; i < 5; ++i) out[i] = value(4, g_rank, i);
  MPI_Request receive, send;
  MPI_Irecv(in, 5, MPI_INT, prev(), 40, MPI_COMM_WORLD, &receive);
  MPI_Isend(out, 5, MPI_INT, next(), 40, MPI_COMM_WORLD, &send);
  MPI_Wait(&receive, MPI_STATUS_IGNORE);
  int done = 0;
  while (!done) MPI_Test(&send, &done, MPI_STATUS_IGNORE);
  for (int i = 0; i < 5; ++i) expect(in[i] == value(4, prev(), i), "MPI_Irecv", i);
  hashBytes(in, sizeof in);
}

static void sendRecvCalls(void) {
  float out[5], in[5];
  for (int i = 0; i < 5; ++i) out[i] = (float)value(5, g_rank, i);
  MPI_Sendrecv(out, 5, MPI_FLOAT, next(), 30, in, 5, MPI_FLOAT, prev(), 30, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  for (int i = 0; i < 5; ++i) expect(in[i] == (float)value(5, prev(), i), "MPI_Sendrecv", i);
  hashBytes(in, sizeof in);
  int buffer[6];
  for (int i = 0; i < 6; ++i) buffer[i] = value(6, g_rank, i);
  MPI_Status status;
  MPI_Sendrecv_replace(buffer, 6, MPI_INT, prev(), 31, next(), 31, MPI_COMM_WORLD, &status);
  expect(status.MPI_SOURCE == next() && status.MPI_TAG == 31, "MPI_Sendrecv_replace status", 0);
  for (int i = 0; i < 6; ++i) expect(buffer[i] == value(6, next(), i), "MPI_Sendrecv_replace", i);
  hashBytes(buffer, sizeof buffer);
}

static void derivedType(void) {
  MPI_Datatype vector;
  MPI_Type_vector(2, 2, 3, MPI_INT, &vector);
  MPI_Type_commit(&vector);
  int out[5], in[4];
  for (int i = 0; i < 5; ++i) out[i] = value(7, g_rank, i);
  MPI_Request receive;
  MPI_Irecv(in, 4, MPI_INT, prev(), 50, MPI_COMM_WORLD, &receive);
  MPI_Send(out, 1, vector, next(), 50, MPI_COMM_WORLD);
  MPI_Wait(&receive, MPI_STATUS_IGNORE);
  const int picked[4] = {0, 1, 3, 4};
  for (int i = 0; i < 4; ++i) expect(in[i] == value(7, prev(), picked[i]), "derived type", i);
  hashBytes(in, sizeof in);
  MPI_Type_free(&vector);
}

static void allToAll(void) {
  int out[2 * kMaxRanks], in[2 * kMaxRanks];
  for (int j = 0; j < g_size; ++j)
    for (int i = 0; i < 2; ++i) out[2 * j + i] = value(9, g_rank, 2 * j + i);
  MPI_Alltoall(out, 2, MPI_INT, in, 2, MPI_INT, MPI_COMM_WORLD);
  for (int j = 0; j < g_size; ++j)
    for (int i = 0; i < 2; ++i) expect(in[2 * j + i] == value(9, j, 2 * g_rank + i), "MPI_Alltoall", j);
  hashBytes(in, sizeof(int) * 2 * (size_t)g_size);
  int place[kMaxRanks];
  for (int j = 0; j < g_size; ++j) place[j] = value(10, g_rank, j);
  MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, place, 1, MPI_INT, MPI_COMM_WORLD);
  for (int j = 0; j < g_size; ++j) expect(place[j] == value(10, j, g_rank), "MPI_Alltoall in place", j);
  hashBytes(place, sizeof(int) * (size_t)g_size);

  /* Alltoallv: r + j + 1 to peer j. */
  int sendcounts[kMaxRanks], sdispls[kMaxRanks], recvcounts[kMaxRanks], rdispls[kMaxRanks];
  int sent = 0, received = 0;
  for (int j = 0; j < g_size; ++j) {
    sendcounts[j] = g_rank + j + 1;
    sdispls[j] = sent;
    sent += sendcounts[j];
    recvcounts[j] = j + g_rank + 1;
    rdispls[j] = received;
    received += recvcounts[j];
  }
  int* vout = malloc(sizeof(int) * (size_t)sent);
  int* vin = malloc(sizeof(int) * (size_t)received);
  for (int i = 0; i < sent; ++i) vout[i] = value(11, g_rank, i);
  MPI_Alltoallv(vout, sendcounts, sdispls, MPI_INT, vin, recvcounts, rdispls, MPI_INT, MPI_COMM_WORLD);
  for (int j = 0; j < g_size; ++j) {
    int their_displ = 0; /* where peer j's block for this rank starts in j's buffer */
    for (int k = 0; k < g_rank; ++k) their_displ += j + k + 1;
    for (int i = 0; i < recvcounts[j]; ++i)
      expect(vin[rdispls[j] + i] == value(11, j, their_displ + i), "MPI_Alltoallv", j);
  }
  hashBytes(vin, sizeof(int) * (size_t)received);
  free(vout);
  free(vin);
}

static void rootedCalls(void) {
  int out[3], gathered[3 * kMaxRanks];
  for (int i = 0; i < 3; ++i) out[i] = value(12, g_rank, i);
  MPI_Gather(out, 3, MPI_INT, gathered, 3, MPI_INT, 0, MPI_COMM_WORLD);
  if (g_rank == 0) {
    for (int j = 0; j < g_size; ++j)
      for (int i = 0; i < 3; ++i) expect(gathered[3 * j + i] == value(12, j, i), "MPI_Gather", j);
    hashBytes(gathered, sizeof(int) * 3 * (size_t)g_size);
  }
  int scattered[2 * kMaxRanks], piece[2];
  for (int i = 0; i < 2 * g_size; ++i) scattered[i] = value(13, g_rank, i);
  MPI_Scatter(scattered, 2, MPI_INT, piece, 2, MPI_INT, g_size - 1, MPI_COMM_WORLD);
  for (int i = 0; i < 2; ++i) expect(piece[i] == value(13, g_size - 1, 2 * g_rank + i), "MPI_Scatter", i);
  hashBytes(piece, sizeof piece);
  int counts[kMaxRanks], displs[kMaxRanks], total = 0;
  for (int j = 0; j < g_size; ++j) {
    counts[j] = j + 1;
    displs[j] = total;
    total += counts[j];
  }
  int mine[kMaxRanks], all[kMaxRanks * (kMaxRanks + 1) / 2];
  for (int i = 0; i <= g_rank; ++i) mine[i] = value(14, g_rank, i);
  MPI_Allgatherv(mine, g_rank + 1, MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD);
  for (int j = 0; j < g_size; ++j)
    for (int i = 0; i < counts[j]; ++i) expect(all[displs[j] + i] == value(14, j, i), "MPI_Allgatherv", j);
  hashBytes(all, sizeof(int) * (size_t)total);
}

static void nonblockingCollectives(void) {
  MPI_Request requests[7];
  int bcast[4];
  for (int i = 0; i < 4; ++i) bcast[i] = g_rank == 0 ? value(15, 0, i) : -1;
  MPI_Ibcast(bcast, 4, MPI_INT, 0, MPI_COMM_WORLD, &requests[0]);
  int reduce_in[3], reduce_out[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) reduce_in[i] = value(16, g_rank, i);
  MPI_Ireduce(reduce_in, reduce_out, 3, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD, &requests[1]);
  int gather_in[2], gather_out[2 * kMaxRanks];
  for (int i = 0; i < 2; ++i) gather_in[i] = value(17, g_rank, i);
  MPI_Iallgather(gather_in, 2, MPI_INT, gather_out, 2, MPI_INT, MPI_COMM_WORLD, &requests[2]);
  int rs_in[kMaxRanks], rs_out = 0, ones[kMaxRanks];
  for (int j = 0; j < g_size; ++j) {
    rs_in[j] = value(18, g_rank, j);
    ones[j] = 1;
  }
  MPI_Ireduce_scatter(rs_in, &rs_out, ones, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &requests[3]);
  int rsb_in[2 * kMaxRanks], rsb_out[2];
  for (int i = 0; i < 2 * g_size; ++i) rsb_in[i] = value(19, g_rank, i);
  MPI_Ireduce_scatter_block(rsb_in, rsb_out, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &requests[4]);
  int a2a_in[kMaxRanks], a2a_out[kMaxRanks];
  for (int j = 0; j < g_size; ++j) a2a_in[j] = value(20, g_rank, j);
  MPI_Ialltoall(a2a_in, 1, MPI_INT, a2a_out, 1, MPI_INT, MPI_COMM_WORLD, &requests[5]);
  MPI_Ibarrier(MPI_COMM_WORLD, &requests[6]);
  MPI_Waitall(7, requests, MPI_STATUSES_IGNORE);
  for (int i = 0; i < 4; ++i) expect(bcast[i] == value(15, 0, i), "MPI_Ibcast", i);
  if (g_rank == 0)
    for (int i = 0; i < 3; ++i) {
      int sum = 0;
      for (int j = 0; j < g_size; ++j) sum += value(16, j, i);
      expect(reduce_out[i] == sum, "MPI_Ireduce", i);
    }
  for (int j = 0; j < g_size; ++j)
    for (int i = 0; i < 2; ++i) expect(gather_out[2 * j + i] == value(17, j, i), "MPI_Iallgather", j);
  int sum = 0;
  for (int j = 0; j < g_size; ++j) sum += value(18, j, g_rank);
  expect(rs_out == sum, "MPI_Ireduce_scatter", 0);
  for (int i = 0; i < 2; ++i) {
    int block = 0;
    for (int j = 0; j < g_size; ++j) block += value(19, j, 2 * g_rank + i);
    expect(rsb_out[i] == block, "MPI_Ireduce_scatter_block", i);
  }
  for (int j = 0; j < g_size; ++j) expect(a2a_out[j] == value(20, j, g_rank), "MPI_Ialltoall", j);
  hashBytes(bcast, sizeof bcast);
  if (g_rank == 0) hashBytes(reduce_out, sizeof reduce_out);
  hashBytes(gather_out, sizeof(int) * 2 * (size_t)g_size);
  hashBytes(&rs_out, sizeof rs_out);
  hashBytes(rsb_out, sizeof rsb_out);
  hashBytes(a2a_out, sizeof(int) * (size_t)g_size);
}

static void anyAndSome(void) {
  int in[2][2] = {{0, 0}, {0, 0}}, out[2][2];
  MPI_Request receives[2], sends[2];
  MPI_Irecv(in[0], 2, MPI_INT, MPI_ANY_SOURCE, 60, MPI_COMM_WORLD, &receives[0]);
  MPI_Irecv(in[1], 2, MPI_INT, MPI_ANY_SOURCE, 60, MPI_COMM_WORLD, &receives[1]);
  const int to[2] = {next(), prev()};
  for (int k = 0; k < 2; ++k) {
    out[k][0] = g_rank;
    out[k][1] = value(21, g_rank, k);
    MPI_Isend(out[k], 2, MPI_INT, to[k], 60, MPI_COMM_WORLD, &sends[k]);
  }
  for (int k = 0; k < 2; ++k) {
    int index = -1;
    MPI_Status status;
    MPI_Waitany(2, receives, &index, &status);
    expect(index >= 0 && status.MPI_SOURCE == in[index][0] && status.MPI_TAG == 60, "MPI_Waitany status", k);
  }
  int remaining = 2;
  while (remaining > 0) {
    int outcount = 0, indices[2];
    MPI_Waitsome(2, sends, &outcount, indices, MPI_STATUSES_IGNORE);
    if (outcount != MPI_UNDEFINED) remaining -= outcount;
  }
  /* Which receive took which message depends on arrival: compare and hash them sorted. prev sent its
   * first message (k = 0) to this rank, next its second (k = 1); with 2 ranks they are one rank. */
  int want[2][2] = {{prev(), value(21, prev(), 0)}, {next(), value(21, next(), 1)}};
  const int swap_in = in[0][0] > in[1][0] || (in[0][0] == in[1][0] && in[0][1] > in[1][1]);
  const int swap_want = want[0][0] > want[1][0] || (want[0][0] == want[1][0] && want[0][1] > want[1][1]);
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 2; ++i)
      expect(in[swap_in ? 1 - k : k][i] == want[swap_want ? 1 - k : k][i], "MPI_ANY_SOURCE nonblocking", k);
  hashBytes(in[swap_in ? 1 : 0], sizeof in[0]);
  hashBytes(in[swap_in ? 0 : 1], sizeof in[0]);
}

static void unrecordedRequests(void) {
  /* Persistent: not recorded; must work. */
  int out = value(22, g_rank, 0), in = -1;
  MPI_Request persistent[2];
  MPI_Recv_init(&in, 1, MPI_INT, prev(), 80, MPI_COMM_WORLD, &persistent[0]);
  MPI_Send_init(&out, 1, MPI_INT, next(), 80, MPI_COMM_WORLD, &persistent[1]);
  MPI_Startall(2, persistent);
  MPI_Wait(&persistent[0], MPI_STATUS_IGNORE);
  MPI_Wait(&persistent[1], MPI_STATUS_IGNORE);
  expect(in == value(22, prev(), 0), "persistent request", 0);
  hashBytes(&in, sizeof in);
  MPI_Request_free(&persistent[0]);
  MPI_Request_free(&persistent[1]);

  /* Cancelled: a receive nobody sends to. */
  int never = 0;
  MPI_Request cancelled;
  MPI_Irecv(&never, 1, MPI_INT, g_rank, 99, MPI_COMM_WORLD, &cancelled);
  MPI_Cancel(&cancelled);
  MPI_Status status;
  MPI_Wait(&cancelled, &status);
  int flag = 0;
  MPI_Test_cancelled(&status, &flag);
  expect(flag, "cancelled receive", 0);

  /* Freed before completion. */
  int freed_out = value(23, g_rank, 0), freed_in = -1;
  MPI_Request freed;
  MPI_Isend(&freed_out, 1, MPI_INT, next(), 70, MPI_COMM_WORLD, &freed);
  MPI_Request_free(&freed);
  MPI_Recv(&freed_in, 1, MPI_INT, prev(), 70, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  expect(freed_in == value(23, prev(), 0), "freed send", 0);
  hashBytes(&freed_in, sizeof freed_in);

  /* MPI_PROC_NULL. */
  int nothing = 5;
  MPI_Send(&nothing, 1, MPI_INT, MPI_PROC_NULL, 90, MPI_COMM_WORLD);
  MPI_Recv(&nothing, 1, MPI_INT, MPI_PROC_NULL, 90, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  expect(nothing == 5, "MPI_PROC_NULL receive", 0);
}

static void window(void) {
  enum { kWindow = 32 };
  int out[kWindow], in[kWindow];
  MPI_Request requests[2 * kWindow];
  for (int i = 0; i < kWindow; ++i) {
    out[i] = value(24, g_rank, i);
    MPI_Irecv(&in[i], 1, MPI_INT, prev(), 95, MPI_COMM_WORLD, &requests[i]);
  }
  for (int i = 0; i < kWindow; ++i)
    MPI_Isend(&out[i], 1, MPI_INT, next(), 95, MPI_COMM_WORLD, &requests[kWindow + i]);
  MPI_Waitall(2 * kWindow, requests, MPI_STATUSES_IGNORE);
  for (int i = 0; i < kWindow; ++i) expect(in[i] == value(24, prev(), i), "window", i);
  hashBytes(in, sizeof in);
}

int main(int argc, char** argv) {
  int steps = 2;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: p2p [--steps N]\n");
      return 2;
    }
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size < 2 || g_size > kMaxRanks) {
    if (g_rank == 0) fprintf(stderr, "p2p: needs 2 to %d ranks, got %d\n", kMaxRanks, g_size);
    MPI_Finalize();
    return 2;
  }
  const int even = g_rank % 2 == 0;
  for (g_step = 0; g_step < steps; ++g_step) {
    sendRecvPair(even, send1, recv1);
    sendRecvPair(even, send2, recv2);
    anySource();
    MPI_Barrier(MPI_COMM_WORLD);
    nonblockingPair();
    sendRecvCalls();
    derivedType();
    MPI_Barrier(MPI_COMM_WORLD);
    allToAll();
    rootedCalls();
    nonblockingCollectives();
    anyAndSome();
    unrecordedRequests();
    window();
    uint64_t hashes[kMaxRanks];
    MPI_Gather(&g_hash, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
      uint64_t all = 1469598103934665603ull;
      for (int q = 0; q < g_size; ++q) all = (all ^ hashes[q]) * 1099511628211ull;
      printf("p2p: step %d hash %016llx\n", g_step, (unsigned long long)all);
    }
  }
  MPI_Finalize();
  return g_wrong == 0 ? 0 : 1;
}
