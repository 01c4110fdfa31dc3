/* gradscope_osu_allreduce: an independent latency reference for `gradscope bench --backend mpi`,
 * written after the OSU Micro-Benchmarks' osu_allreduce (MPI_Allreduce of floats with MPI_SUM): for each
 * size, `warm-up` untimed calls, then `iterations` calls each timed alone with MPI_Wtime, an
 * MPI_Barrier after every call; a rank's latency is its average, and the line reports the average over
 * ranks (with -f also the min and max over ranks and the iteration count), as osu_allreduce does.
 *
 * Plain C and MPI on purpose: it shares no code with gradscope, so agreement between the two is evidence.
 *
 *   mpirun -np 2 gradscope_osu_allreduce [-m MAX_BYTES] [-i ITERATIONS] [-x WARMUP] [-f] [-t funneled]
 *
 * Sizes run from 8 bytes to MAX_BYTES (default 1 MiB), doubling. Iterations follow OSU's defaults:
 * 1000 timed after 100 warm-up up to 8 KiB, 100 after 10 above (OSU's "large message" split);
 * -i and -x override both. MPI starts as osu_allreduce starts it, with MPI_Init (MPI_THREAD_SINGLE);
 * -t funneled starts it with MPI_Init_thread(MPI_THREAD_FUNNELED) instead, as `gradscope bench
 * --mpi-threads funneled` does: Open MPI then locks in its progress loop, which costs small messages
 * measurably. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

enum { kLargeMessageBytes = 8192 };

struct options {
  size_t min_bytes;
  size_t max_bytes;
  int iterations; /* 0: OSU's default for the size */
  int warmup;     /* -1: OSU's default for the size */
  int full;
  int funneled;
  int digits; /* decimals of the latencies: OSU prints 2 */
};

static int parse_options(int argc, char** argv, struct options* options) {
  options->min_bytes = 8;
  options->max_bytes = 1 << 20;
  options->iterations = 0;
  options->warmup = -1;
  options->full = 0;
  options->funneled = 0;
  options->digits = 2;
  for (int i = 1; i < argc; ++i) {
    const int has_value = i + 1 < argc;
    if (strcmp(argv[i], "-n") == 0 && has_value) {
      options->min_bytes = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "-m") == 0 && has_value) {
      options->max_bytes = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "-i") == 0 && has_value) {
      options->iterations = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-x") == 0 && has_value) {
      options->warmup = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-p") == 0 && has_value) {
      options->digits = atoi(argv[++i]);
      if (options->digits < 0 || options->digits > 6) return 0;
    } else if (strcmp(argv[i], "-f") == 0) {
      options->full = 1;
    } else if (strcmp(argv[i], "-t") == 0 && has_value && strcmp(argv[i + 1], "funneled") == 0) {
      options->funneled = 1;
      ++i;
    } else {
      return 0;
    }
  }
  return options->min_bytes >= 8 && options->max_bytes >= options->min_bytes && options->iterations >= 0;
}

int main(int argc, char** argv) {
  /* Parsed before MPI starts (the thread level is an option); reported once MPI says who rank 0 is. */
  struct options options;
  const int parsed = parse_options(argc, argv, &options);
  if (parsed && options.funneled) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  if (!parsed) {
    if (rank == 0)
      fprintf(stderr,
              "usage: mpirun -np N %s [-n MIN_BYTES (>= 8)] [-m MAX_BYTES] [-i ITERATIONS] [-x WARMUP] [-f] "
              "[-t funneled] [-p DIGITS]\n",
              argv[0]);
    MPI_Finalize();
    return 2;
  }

  const size_t max_count = options.max_bytes / sizeof(float);
  float* send = malloc(max_count * sizeof(float));
  float* recv = malloc(max_count * sizeof(float));
  if (send == NULL || recv == NULL) {
    fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n", argv[0], options.max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  for (size_t i = 0; i < max_count; ++i) {
    send[i] = 1.0f;
    recv[i] = 0.0f;
  }

  if (rank == 0) {
    printf("# gradscope_osu_allreduce (after OSU osu_allreduce), %d ranks, MPI_FLOAT MPI_SUM, %s\n", ranks,
           options.funneled ? "MPI_THREAD_FUNNELED" : "MPI_Init");
    if (options.full)
      printf("%-10s%18s%18s%18s%12s\n", "# Size", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)",
             "Iterations");
    else printf("%-10s%18s\n", "# Size", "Avg Latency(us)");
    fflush(stdout);
  }

  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const int count = (int)(bytes / sizeof(float));
    const int large = bytes > kLargeMessageBytes;
    const int iterations = options.iterations > 0 ? options.iterations : large ? 100 : 1000;
    const int warmup = options.warmup >= 0 ? options.warmup : large ? 10 : 100;

    MPI_Barrier(MPI_COMM_WORLD);
    double timer = 0.0;
    for (int i = 0; i < iterations + warmup; ++i) {
      const double start = MPI_Wtime();
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double stop = MPI_Wtime();
      if (i >= warmup) timer += stop - start;
      MPI_Barrier(MPI_COMM_WORLD);
    }

    const double latency = timer * 1e6 / iterations;
    double min_latency = 0.0, max_latency = 0.0, sum_latency = 0.0;
    MPI_Reduce(&latency, &min_latency, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&latency, &max_latency, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&latency, &sum_latency, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double average = sum_latency / ranks;
      if (options.full)
        printf("%-10zu%18.*f%18.*f%18.*f%12d\n", bytes, options.digits, average, options.digits, min_latency,
               options.digits, max_latency, iterations);
      else printf("%-10zu%18.*f\n", bytes, options.digits, average);
      fflush(stdout);
    }
  }

  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
