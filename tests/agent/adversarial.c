/* What MPI jobs do around their gradient reductions that a profiler must survive: the adversarial job of
 * check_adversarial.py (docs/reliability.md, "The job is never broken"). Run plain and under the agent
 * in every mode, its output must be the same byte for byte.
 *
 *   adversarial [--level single|funneled|serialized|multiple] [--threads-only]
 *
 * Cases, in this order (the threads case only when MPI provides MPI_THREAD_MULTIPLE):
 *   intercomm  an intercommunicator between the even and the odd world ranks: MPI_Allreduce (fp32 and
 *              fp64 sums: each group gets the other group's sum), MPI_Iallreduce, MPI_Bcast (MPI_ROOT /
 *              MPI_PROC_NULL), MPI_Allgather, MPI_Reduce, MPI_Reduce_scatter_block; then
 *              MPI_Intercomm_merge and a sum on the merged intracommunicator
 *   threads    three threads at once, each on its own duplicate of MPI_COMM_WORLD: two reduce (fp32 and
 *              fp64 sums of several sizes), the third creates, uses and frees communicators meanwhile and
 *              reads Open MPI's coll_tuned_allreduce_algorithm through MPI_T, which must stay 0 (no
 *              algorithm forced on the job's communicators); sums on MPI_COMM_WORLD before and after
 *   failing    MPI_ERRORS_RETURN on MPI_COMM_WORLD: MPI_Comm_free of MPI_COMM_WORLD and MPI_COMM_SELF, an
 *              MPI_Allreduce with count -1 and one on MPI_COMM_NULL (each prints its error class), then
 *              sums as usual (they must be recorded)
 *   types      a derived datatype (three floats) with a commutative user operator, an int vector type
 *              with a non-commutative one (2x2 matrix products, in rank order), MPI_IN_PLACE, zero counts,
 *              MPI_COMM_SELF, a size-1 communicator (blocking and nonblocking), max and int sums
 *   fork       fork() and system(): a child that computes and exits, the parent reduces on
 *   spawn      MPI_Comm_spawn of one more process of this program (--spawned), a world of its own: it sums
 *              over itself and broadcasts the result to the parents
 *
 * Inputs are small integers, so every sum is exact in any order: a strategy that replaces a sum
 * (apply mode) gives the library's bits. Each rank prints its results as "r<rank> <line> <case> ..."
 * lines (sorted by the checker: ranks write concurrently), the thread level before and after, and, last,
 * how many calls of each intercepted API it made, and how many of them on MPI_COMM_WORLD ("r0 9999 calls
 * MPI_Allreduce=12 ... world=9"), which the checker compares with the trace. Exit status 0, or 1 after
 * "adversarial: ..." on stderr. */

#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

/* ---- output and bookkeeping ------------------------------------------------------------------------- */

enum Api { kAllreduce, kIallreduce, kReduce, kReduceScatterBlock, kAllgather, kBcast, kApis };
static const char* const kApiNames[kApis] = {"MPI_Allreduce", "MPI_Iallreduce",
                                             "MPI_Reduce",    "MPI_Reduce_scatter_block",
                                             "MPI_Allgather", "MPI_Bcast"};
static int g_calls[kApis];
static int g_world_calls;  /* of them on MPI_COMM_WORLD: the trace must keep them on "world" */
static int g_single_calls; /* all-reduces on intracommunicators of one rank: explore leaves them untouched */
static pthread_mutex_t g_calls_mutex = PTHREAD_MUTEX_INITIALIZER;
static int g_rank, g_size, g_line, g_failed;

static void counted(enum Api api, MPI_Comm comm) {
  pthread_mutex_lock(&g_calls_mutex);
  ++g_calls[api];
  if (comm == MPI_COMM_WORLD) ++g_world_calls;
  if ((api == kAllreduce || api == kIallreduce) && comm != MPI_COMM_NULL) {
    int inter = 0, size = 0;
    MPI_Comm_test_inter(comm, &inter);
    MPI_Comm_size(comm, &size);
    if (!inter && size == 1) ++g_single_calls;
  }
  pthread_mutex_unlock(&g_calls_mutex);
}

static void fail(const char* what, int code) {
  fprintf(stderr, "adversarial: rank %d: %s (code %d)\n", g_rank, what, code);
  g_failed = 1;
}

static void ok(int code, const char* what) {
  if (code != MPI_SUCCESS) fail(what, code);
}

static uint64_t hash(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* One result line: the bytes' hash and the first values as numbers. */
static void printFloats(const char* label, const float* values, int n) {
  printf("r%d %04d %s n=%d hash=%016llx", g_rank, g_line++, label, n,
         (unsigned long long)hash(values, sizeof(float) * (size_t)(n > 0 ? n : 0)));
  for (int i = 0; i < n && i < 4; ++i) printf(" %g", values[i]);
  printf("\n");
}

static void printDoubles(const char* label, const double* values, int n) {
  printf("r%d %04d %s n=%d hash=%016llx", g_rank, g_line++, label, n,
         (unsigned long long)hash(values, sizeof(double) * (size_t)(n > 0 ? n : 0)));
  for (int i = 0; i < n && i < 4; ++i) printf(" %g", values[i]);
  printf("\n");
}

static void printInts(const char* label, const int* values, int n) {
  printf("r%d %04d %s n=%d", g_rank, g_line++, label, n);
  for (int i = 0; i < n && i < 8; ++i) printf(" %d", values[i]);
  printf("\n");
}

static void printText(const char* label, const char* text) {
  printf("r%d %04d %s %s\n", g_rank, g_line++, label, text);
}

/* Small integers, different on every rank and element: sums are exact in any order. */
static void fillFloats(float* values, int n, int salt) {
  for (int i = 0; i < n; ++i) values[i] = (float)(((g_rank + 1) * 31 + i * 7 + salt) % 17 - 8);
}

static void fillDoubles(double* values, int n, int salt) {
  for (int i = 0; i < n; ++i) values[i] = (double)(((g_rank + 1) * 13 + i * 5 + salt) % 19 - 9);
}

static const char* levelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "single";
    case MPI_THREAD_FUNNELED: return "funneled";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_MULTIPLE: return "multiple";
    default: return "unknown";
  }
}

static void printLevel(const char* when) {
  int level = -1;
  MPI_Query_thread(&level);
  char label[64];
  snprintf(label, sizeof label, "thread-level-%s", when);
  printText(label, levelName(level));
}

static void printErrorClass(const char* label, int code) {
  int error_class = code;
  if (code != MPI_SUCCESS) MPI_Error_class(code, &error_class);
  char text[32];
  snprintf(text, sizeof text, "error-class=%d", error_class);
  printText(label, text);
}

/* A sum on `comm` of n floats, printed under `label`. */
static void sumFloats(MPI_Comm comm, int n, int salt, const char* label) {
  float* in = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  float* out = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  fillFloats(in, n, salt);
  ok(MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, comm), label);
  counted(kAllreduce, comm);
  printFloats(label, out, n);
  free(in);
  free(out);
}

/* ---- intercomm ---------------------------------------------------------------------------------------- */

static void caseIntercomm(void) {
  if (g_size < 2) return;
  const int color = g_rank % 2;
  MPI_Comm local, inter, merged;
  ok(MPI_Comm_split(MPI_COMM_WORLD, color, g_rank, &local), "split");
  /* Local leaders: world ranks 0 (even group) and 1 (odd group). */
  ok(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, color == 0 ? 1 : 0, 77, &inter), "intercomm_create");
  int local_rank, remote_size;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_remote_size(inter, &remote_size);

  enum { kN = 1000 };
  float in[kN], out[kN];
  fillFloats(in, kN, 1);
  ok(MPI_Allreduce(in, out, kN, MPI_FLOAT, MPI_SUM, inter), "inter allreduce f32");
  counted(kAllreduce, inter);
  printFloats("intercomm allreduce-f32", out, kN);

  double din[kN], dout[kN];
  fillDoubles(din, kN, 2);
  ok(MPI_Allreduce(din, dout, kN, MPI_DOUBLE, MPI_SUM, inter), "inter allreduce f64");
  counted(kAllreduce, inter);
  printDoubles("intercomm allreduce-f64", dout, kN);

  MPI_Request request;
  fillFloats(in, 64, 3);
  ok(MPI_Iallreduce(in, out, 64, MPI_FLOAT, MPI_SUM, inter, &request), "inter iallreduce");
  counted(kIallreduce, inter);
  ok(MPI_Wait(&request, MPI_STATUS_IGNORE), "inter wait");
  printFloats("intercomm iallreduce-f32", out, 64);

  /* The even group's rank 0 broadcasts to the odd group. */
  int values[16];
  for (int i = 0; i < 16; ++i) values[i] = color == 0 ? 100 + i : -1;
  const int root = color == 0 ? (local_rank == 0 ? MPI_ROOT : MPI_PROC_NULL) : 0;
  ok(MPI_Bcast(values, 16, MPI_INT, root, inter), "inter bcast");
  counted(kBcast, inter);
  printInts("intercomm bcast", values, 16);

  int mine = 1000 * color + g_rank;
  int* gathered = malloc(sizeof(int) * (size_t)remote_size);
  ok(MPI_Allgather(&mine, 1, MPI_INT, gathered, 1, MPI_INT, inter), "inter allgather");
  counted(kAllgather, inter);
  printInts("intercomm allgather", gathered, remote_size);
  free(gathered);

  /* The odd group reduces to the even group's rank 0. */
  fillFloats(in, 8, 4);
  const int reduce_root = color == 1 ? 0 : (local_rank == 0 ? MPI_ROOT : MPI_PROC_NULL);
  for (int i = 0; i < 8; ++i) out[i] = -99.0f;
  ok(MPI_Reduce(in, out, 8, MPI_FLOAT, MPI_SUM, reduce_root, inter), "inter reduce");
  counted(kReduce, inter);
  printFloats("intercomm reduce", out, 8);

  /* Reduce-scatter over an intercommunicator: each group scatters the other group's sum; recvcount is
   * the same in both groups, so each rank sends recvcount x (its own group's size) elements. */
  int local_size;
  MPI_Comm_size(local, &local_size);
  float* scatter_in = malloc(sizeof(float) * 4 * (size_t)local_size);
  fillFloats(scatter_in, 4 * local_size, 5);
  float scatter_out[4];
  if (local_size == remote_size) {
    ok(MPI_Reduce_scatter_block(scatter_in, scatter_out, 4, MPI_FLOAT, MPI_SUM, inter),
       "inter reduce_scatter");
    counted(kReduceScatterBlock, inter);
    printFloats("intercomm reduce-scatter-block", scatter_out, 4);
  }
  free(scatter_in);

  ok(MPI_Intercomm_merge(inter, color, &merged), "intercomm_merge");
  sumFloats(merged, 300, 6, "intercomm merged-allreduce");
  MPI_Comm_free(&merged);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&local);
}

/* ---- threads ------------------------------------------------------------------------------------------ */

enum { kReducers = 2, kIterations = 12 };

struct Reducer {
  MPI_Comm comm;
  int use_double;
  uint64_t hash; /* of every result, in order */
};

static void* reduce(void* argument) {
  struct Reducer* self = argument;
  static const int kSizes[] = {1, 1024, 16384, 8};
  double* in = malloc(sizeof(double) * 16384);
  double* out = malloc(sizeof(double) * 16384);
  self->hash = 1469598103934665603ull;
  for (int i = 0; i < kIterations; ++i) {
    const int n = kSizes[i % 4];
    int rc;
    if (self->use_double) {
      fillDoubles(in, n, i);
      rc = MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, self->comm);
      self->hash ^= hash(out, sizeof(double) * (size_t)n) + (uint64_t)i;
    } else {
      float* fin = (float*)in;
      float* fout = (float*)out;
      fillFloats(fin, n, i);
      rc = MPI_Allreduce(fin, fout, n, MPI_FLOAT, MPI_SUM, self->comm);
      self->hash ^= hash(fout, sizeof(float) * (size_t)n) + (uint64_t)i;
    }
    counted(kAllreduce, self->comm);
    if (rc != MPI_SUCCESS) fail("thread allreduce", rc);
  }
  free(in);
  free(out);
  return NULL;
}

struct Creator {
  MPI_Comm comm;
  uint64_t hash;
  int forced_seen; /* the largest coll_tuned_allreduce_algorithm read meanwhile; -1: cannot be read */
};

/* Open MPI's forced all-reduce algorithm, as a job reading MPI_T sees it (-1 where there is none). */
static int forcedAlgorithm(void) {
  static MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  static int tried;
  if (!tried) {
    tried = 1;
    int provided, index, count;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return -1;
    if (MPI_T_cvar_get_index("coll_tuned_allreduce_algorithm", &index) != MPI_SUCCESS) return -1;
    if (MPI_T_cvar_handle_alloc(index, NULL, &handle, &count) != MPI_SUCCESS) return -1;
  }
  if (handle == MPI_T_CVAR_HANDLE_NULL) return -1;
  int value = -1;
  MPI_T_cvar_read(handle, &value);
  return value;
}

static void* create(void* argument) {
  struct Creator* self = argument;
  self->hash = 1469598103934665603ull;
  self->forced_seen = forcedAlgorithm();
  for (int i = 0; i < kIterations; ++i) {
    MPI_Comm duplicate, part;
    ok(MPI_Comm_dup(self->comm, &duplicate), "thread dup");
    ok(MPI_Comm_split(duplicate, g_rank % 2, -g_rank, &part), "thread split");
    const int value = forcedAlgorithm();
    if (value > self->forced_seen) self->forced_seen = value;
    float in[32], out[32];
    fillFloats(in, 32, i);
    ok(MPI_Allreduce(in, out, 32, MPI_FLOAT, MPI_SUM, part), "thread allreduce on a new communicator");
    counted(kAllreduce, part);
    self->hash ^= hash(out, sizeof out) + (uint64_t)i;
    MPI_Comm_free(&part);
    MPI_Comm_free(&duplicate);
  }
  return NULL;
}

static void caseThreads(void) {
  int level;
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE) return;
  sumFloats(MPI_COMM_WORLD, 4096, 7, "threads world-before");
  struct Reducer reducers[kReducers];
  struct Creator creator;
  pthread_t threads[kReducers + 1];
  for (int i = 0; i < kReducers; ++i) {
    ok(MPI_Comm_dup(MPI_COMM_WORLD, &reducers[i].comm), "dup");
    reducers[i].use_double = i % 2;
  }
  ok(MPI_Comm_dup(MPI_COMM_WORLD, &creator.comm), "dup");
  for (int i = 0; i < kReducers; ++i) pthread_create(&threads[i], NULL, reduce, &reducers[i]);
  pthread_create(&threads[kReducers], NULL, create, &creator);
  for (int i = 0; i <= kReducers; ++i) pthread_join(threads[i], NULL);
  char text[64];
  for (int i = 0; i < kReducers; ++i) {
    snprintf(text, sizeof text, "hash=%016llx", (unsigned long long)reducers[i].hash);
    printText(i == 0 ? "threads reducer-f32" : "threads reducer-f64", text);
    MPI_Comm_free(&reducers[i].comm);
  }
  snprintf(text, sizeof text, "hash=%016llx", (unsigned long long)creator.hash);
  printText("threads creator", text);
  snprintf(text, sizeof text, "largest=%d", creator.forced_seen > 0 ? creator.forced_seen : 0);
  printText("threads forced-algorithm-seen", text);
  MPI_Comm_free(&creator.comm);
  sumFloats(MPI_COMM_WORLD, 4096, 8, "threads world-after");
}

/* ---- failing calls ------------------------------------------------------------------------------------ */

static void caseFailing(void) {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  MPI_Comm world = MPI_COMM_WORLD, self = MPI_COMM_SELF;
  printErrorClass("failing free-world", MPI_Comm_free(&world));
  printErrorClass("failing free-self", MPI_Comm_free(&self));
  float in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
  printErrorClass("failing negative-count", MPI_Allreduce(in, out, -1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  counted(kAllreduce, MPI_COMM_WORLD);
  printErrorClass("failing null-comm", MPI_Allreduce(in, out, 4, MPI_FLOAT, MPI_SUM, MPI_COMM_NULL));
  /* Not counted: a call on MPI_COMM_NULL names no communicator, and is not recorded. */
  for (int i = 0; i < 3; ++i) sumFloats(MPI_COMM_WORLD, 2048, 10 + i, "failing then-world");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
}

/* ---- datatypes, operators, buffers, small communicators ----------------------------------------------- */

/* Sum of float triples (commutative). */
static void tripleSum(void* in, void* inout, int* length, MPI_Datatype* type) {
  (void)type;
  const float* a = in;
  float* b = inout;
  for (int i = 0; i < 3 * *length; ++i) b[i] += a[i];
}

/* 2x2 integer matrix products, b = a * b (not commutative: MPI applies the ranks in order). Entries are
 * kept small by working modulo 97. */
static void matrixProduct(void* in, void* inout, int* length, MPI_Datatype* type) {
  (void)type;
  const int* a = in;
  int* b = inout;
  for (int k = 0; k < *length; ++k, a += 4, b += 4) {
    const int c0 = (a[0] * b[0] + a[1] * b[2]) % 97, c1 = (a[0] * b[1] + a[1] * b[3]) % 97;
    const int c2 = (a[2] * b[0] + a[3] * b[2]) % 97, c3 = (a[2] * b[1] + a[3] * b[3]) % 97;
    b[0] = c0, b[1] = c1, b[2] = c2, b[3] = c3;
  }
}

static void caseTypes(void) {
  MPI_Datatype triple, matrix;
  MPI_Op triple_sum, product;
  ok(MPI_Type_contiguous(3, MPI_FLOAT, &triple), "type_contiguous");
  ok(MPI_Type_commit(&triple), "commit");
  ok(MPI_Type_vector(2, 2, 2, MPI_INT, &matrix), "type_vector");
  ok(MPI_Type_commit(&matrix), "commit");
  ok(MPI_Op_create(tripleSum, 1, &triple_sum), "op_create");
  ok(MPI_Op_create(matrixProduct, 0, &product), "op_create");

  float triples[3 * 50], triples_out[3 * 50];
  fillFloats(triples, 150, 20);
  ok(MPI_Allreduce(triples, triples_out, 50, triple, triple_sum, MPI_COMM_WORLD), "derived allreduce");
  counted(kAllreduce, MPI_COMM_WORLD);
  printFloats("types derived-user-sum", triples_out, 150);

  int matrices[4 * 10], matrices_out[4 * 10];
  for (int i = 0; i < 40; ++i) matrices[i] = (g_rank * 7 + i * 3) % 11 + 1;
  ok(MPI_Allreduce(matrices, matrices_out, 10, matrix, product, MPI_COMM_WORLD), "noncommutative allreduce");
  counted(kAllreduce, MPI_COMM_WORLD);
  printInts("types noncommutative", matrices_out, 40);
  ok(MPI_Reduce(matrices, matrices_out, 10, matrix, product, g_size - 1, MPI_COMM_WORLD),
     "noncommutative reduce");
  counted(kReduce, MPI_COMM_WORLD);
  if (g_rank == g_size - 1) printInts("types noncommutative-reduce", matrices_out, 40);

  float inplace[777];
  fillFloats(inplace, 777, 21);
  ok(MPI_Allreduce(MPI_IN_PLACE, inplace, 777, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "in place");
  counted(kAllreduce, MPI_COMM_WORLD);
  printFloats("types in-place", inplace, 777);

  float empty_in[1] = {5}, empty_out[1] = {-1};
  ok(MPI_Allreduce(empty_in, empty_out, 0, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "zero count");
  counted(kAllreduce, MPI_COMM_WORLD);
  printFloats("types zero-count", empty_out, 1);
  ok(MPI_Allreduce(MPI_IN_PLACE, empty_out, 0, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "zero count in place");
  counted(kAllreduce, MPI_COMM_WORLD);
  ok(MPI_Bcast(empty_out, 0, MPI_FLOAT, 0, MPI_COMM_WORLD), "zero bcast");
  counted(kBcast, MPI_COMM_WORLD);

  sumFloats(MPI_COMM_SELF, 1000, 22, "types self");
  MPI_Comm alone;
  ok(MPI_Comm_split(MPI_COMM_WORLD, g_rank, 0, &alone), "split alone");
  sumFloats(alone, 5000, 23, "types size-one");
  float in[256], out[256];
  fillFloats(in, 256, 24);
  MPI_Request request;
  ok(MPI_Iallreduce(in, out, 256, MPI_FLOAT, MPI_SUM, alone, &request), "iallreduce alone");
  counted(kIallreduce, alone);
  ok(MPI_Wait(&request, MPI_STATUS_IGNORE), "wait");
  printFloats("types size-one-nonblocking", out, 256);
  MPI_Comm_free(&alone);

  /* A duplicate the agent does not see made (MPI_Comm_idup is not wrapped): at MPI_THREAD_MULTIPLE explore
   * and apply leave its sum untouched (not prepared). */
  MPI_Comm duplicate;
  ok(MPI_Comm_idup(MPI_COMM_WORLD, &duplicate, &request), "idup");
  ok(MPI_Wait(&request, MPI_STATUS_IGNORE), "idup wait");
  sumFloats(duplicate, 64, 30, "types idup");
  MPI_Comm_free(&duplicate);

  fillFloats(in, 256, 25);
  ok(MPI_Allreduce(in, out, 256, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD), "max");
  counted(kAllreduce, MPI_COMM_WORLD);
  printFloats("types max", out, 256);
  int ints[100], ints_out[100];
  for (int i = 0; i < 100; ++i) ints[i] = g_rank * 1000 + i;
  ok(MPI_Allreduce(ints, ints_out, 100, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "int sum");
  counted(kAllreduce, MPI_COMM_WORLD);
  printInts("types int-sum", ints_out, 100);

  MPI_Op_free(&product);
  MPI_Op_free(&triple_sum);
  MPI_Type_free(&matrix);
  MPI_Type_free(&triple);
}

/* ---- fork ---------------------------------------------------------------------------------------------- */

static void caseFork(void) {
  sumFloats(MPI_COMM_WORLD, 512, 30, "fork before");
  fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    /* A data loader or a helper: computes, prints nothing, exits through exit() (atexit handlers). */
    volatile double x = 0;
    for (int i = 0; i < 100000; ++i) x += i;
    exit(x > 0 ? 3 : 4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  char text[32];
  snprintf(text, sizeof text, "exit=%d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  printText("fork child", text);
  snprintf(text, sizeof text, "status=%d", system("exit 5") >> 8);
  printText("fork system", text);
  sumFloats(MPI_COMM_WORLD, 512, 31, "fork after");
}

/* ---- spawn --------------------------------------------------------------------------------------------- */

/* One process of this program started with MPI_Comm_spawn: a world of its own (a run of its own in the
 * trace), which sums over itself and broadcasts the result to the parents. */
static int spawnedChild(void) {
  MPI_Comm parent;
  MPI_Comm_get_parent(&parent);
  float in[8], out[8];
  fillFloats(in, 8, 40);
  ok(MPI_Allreduce(in, out, 8, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "child allreduce");
  ok(MPI_Bcast(out, 8, MPI_FLOAT, g_rank == 0 ? MPI_ROOT : MPI_PROC_NULL, parent), "child bcast");
  MPI_Comm_disconnect(&parent);
  MPI_Finalize();
  return g_failed;
}

static void caseSpawn(const char* program) {
  MPI_Comm children;
  char* arguments[] = {"--spawned", NULL};
  int code = MPI_SUCCESS;
  ok(MPI_Comm_spawn(program, arguments, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &children, &code), "spawn");
  float values[8];
  ok(MPI_Bcast(values, 8, MPI_FLOAT, 0, children), "bcast from the child");
  counted(kBcast, children);
  printFloats("spawn child-sum", values, 8);
  MPI_Comm_disconnect(&children);
}

/* ---- main ---------------------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  int required = MPI_THREAD_MULTIPLE;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--spawned") == 0) {
      MPI_Init(&argc, &argv);
      MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
      return spawnedChild();
    }
    if (strcmp(argv[i], "--level") == 0 && i + 1 < argc) {
      const char* level = argv[++i];
      required = strcmp(level, "single") == 0       ? MPI_THREAD_SINGLE
                 : strcmp(level, "funneled") == 0   ? MPI_THREAD_FUNNELED
                 : strcmp(level, "serialized") == 0 ? MPI_THREAD_SERIALIZED
                                                    : MPI_THREAD_MULTIPLE;
    } else {
      fprintf(stderr, "usage: adversarial [--level single|funneled|serialized|multiple]\n");
      return 2;
    }
  }
  int provided;
  if (required == MPI_THREAD_SINGLE) MPI_Init(&argc, &argv);
  else MPI_Init_thread(&argc, &argv, required, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  printLevel("before");
  sumFloats(MPI_COMM_WORLD, 100, 0, "start world");
  caseIntercomm();
  caseThreads();
  caseFailing();
  caseTypes();
  caseFork();
  caseSpawn(argv[0]);
  printLevel("after");
  printf("r%d 9999 calls", g_rank);
  for (int i = 0; i < kApis; ++i) printf(" %s=%d", kApiNames[i], g_calls[i]);
  printf(" world=%d single=%d\n", g_world_calls, g_single_calls);
  fflush(stdout);
  MPI_Finalize();
  return g_failed;
}
