// algorithm-spy: an LD_PRELOAD library that says which of Open MPI's all-reduce algorithms ran each
// MPI_Allreduce. Open MPI 4.1 release builds print nothing about coll_tuned's decisions (its messages are
// OPAL_OUTPUT, compiled into --enable-debug builds only), so this is the direct evidence tests/ompi_rules
// uses: coll_tuned (mca_coll_tuned.so) calls the algorithm it chose through these exported functions of
// libmpi (ompi/mca/coll/base/coll_base_allreduce.c; their numbers are coll_tuned_allreduce_decision.c's),
// and a preloaded definition of the same name is found first. Each call is passed on unchanged.
//
// One line per call, written with one write(2), to $ALGORITHM_SPY_DIR/spy-<pid>.log (stderr when unset):
//   algorithm-spy: rank R comm_size N bytes B algorithm NAME
// and, when that algorithm hands the call to another one (ring below one element per rank, rabenseifner
// for few elements or non-commutative operations), a second line for the one that ran it:
//   algorithm-spy: rank R comm_size N bytes B fallback NAME
//
// Build: mpicc -shared -fPIC -o algorithm-spy.so algorithm_spy.c -ldl
// Use:   mpirun -x LD_PRELOAD=$PWD/algorithm-spy.so ... (LD_PRELOAD must reach the ranks, not only mpirun)

#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

typedef int (*AllreduceAlgorithm)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, void*);
typedef int (*SegmentedAlgorithm)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, void*, uint32_t);

// Nesting depth on this thread: an algorithm entered inside another is that one's fallback.
static __thread int depth;

static int logFile(void) {
  static int fd = -2;
  if (fd == -2) {
    const char* dir = getenv("ALGORITHM_SPY_DIR");
    fd = 2;
    if (dir && *dir) {
      char path[4096];
      snprintf(path, sizeof path, "%s/spy-%ld.log", dir, (long)getpid());
      const int opened = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (opened >= 0) fd = opened;
    }
  }
  return fd;
}

static void report(const char* algorithm, int count, MPI_Datatype type, MPI_Comm comm) {
  int rank = -1, size = 0, type_size = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(comm, &size);
  PMPI_Type_size(type, &type_size);
  char line[256];
  const int length =
      snprintf(line, sizeof line, "algorithm-spy: rank %d comm_size %d bytes %lld %s %s\n", rank, size,
               (long long)count * type_size, depth == 0 ? "algorithm" : "fallback", algorithm);
  if (length > 0 && write(logFile(), line, (size_t)length) < 0) {
    // Nothing to do: the evidence is missing and the test says so.
  }
}

// The definition `symbol` would have had without this library, stored into `*function` (memcpy: ISO C has
// no cast from an object pointer to a function pointer).
static void next(const char* symbol, void* function, size_t size) {
  void* found = dlsym(RTLD_NEXT, symbol);
  if (!found) {
    fprintf(stderr, "algorithm-spy: %s not found in the libraries after this one\n", symbol);
    abort();
  }
  memcpy(function, &found, size);
}

#define SPY(symbol, name)                                                                             \
  int symbol(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, \
             void* module) {                                                                          \
    static AllreduceAlgorithm real;                                                                   \
    if (!real) next(#symbol, &real, sizeof real);                                                     \
    report(name, count, type, comm);                                                                  \
    ++depth;                                                                                          \
    const int result = real(send, receive, count, type, op, comm, module);                            \
    --depth;                                                                                          \
    return result;                                                                                    \
  }

SPY(ompi_coll_base_allreduce_intra_basic_linear, "basic_linear")
SPY(ompi_coll_base_allreduce_intra_nonoverlapping, "nonoverlapping")
SPY(ompi_coll_base_allreduce_intra_recursivedoubling, "recursive_doubling")
SPY(ompi_coll_base_allreduce_intra_ring, "ring")
SPY(ompi_coll_base_allreduce_intra_redscat_allgather, "rabenseifner")

int ompi_coll_base_allreduce_intra_ring_segmented(const void* send, void* receive, int count,
                                                  MPI_Datatype type, MPI_Op op, MPI_Comm comm, void* module,
                                                  uint32_t segment) {
  static SegmentedAlgorithm real;
  if (!real) next("ompi_coll_base_allreduce_intra_ring_segmented", &real, sizeof real);
  report("segmented_ring", count, type, comm);
  ++depth;
  const int result = real(send, receive, count, type, op, comm, module, segment);
  --depth;
  return result;
}
