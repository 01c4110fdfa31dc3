// The job of tests/ompi_rules: MPI_Allreduce of fp32 sums at the byte sizes given as arguments, on
// MPI_COMM_WORLD and, with 3 or more ranks, on a communicator of all ranks but the last, so that one job
// has two communicator sizes. Every result is checked exactly (small integers, representable in fp32). It
// also prints what Open MPI's MPI_T interface says of the two variables that load a coll_tuned rules file.
//
//   allreduce-sizes BYTES...      (each a multiple of 4)
//
// Output (rank 0 prints the cvars and, at the end, the summary; every rank prints its mismatches):
//   cvar coll_tuned_use_dynamic_rules=<value>
//   cvar coll_tuned_dynamic_rules_filename=<value>
//   rank R: MISMATCH comm_size N bytes B element I: got X, expected Y
//   allreduce-sizes: N calls per rank, every result exact
// Exit status 0 when every result on every rank is exact, 1 otherwise, 2 on bad arguments.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

// Reads the control variable `name` as a string ("(not found)" when this MPI has none of that name).
static void readControlVariable(const char* name, char* value, size_t size) {
  snprintf(value, size, "(not found)");
  int count = 0;
  if (MPI_T_cvar_get_num(&count) != MPI_SUCCESS) return;
  for (int index = 0; index < count; ++index) {
    char found[256], description[1024];
    int name_length = sizeof found, description_length = sizeof description, verbosity = 0, binding = 0,
        scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    if (MPI_T_cvar_get_info(index, found, &name_length, &verbosity, &type, &enumtype, description,
                            &description_length, &binding, &scope) != MPI_SUCCESS ||
        strcmp(found, name) != 0)
      continue;
    MPI_T_cvar_handle handle;
    int elements = 0;
    if (MPI_T_cvar_handle_alloc(index, NULL, &handle, &elements) != MPI_SUCCESS) return;
    if (type == MPI_CHAR) {
      char text[4096] = {0};
      if (elements < (int)sizeof text && MPI_T_cvar_read(handle, text) == MPI_SUCCESS)
        snprintf(value, size, "%s", text);
    } else if (type == MPI_INT) {
      int number = 0;
      if (MPI_T_cvar_read(handle, &number) == MPI_SUCCESS) snprintf(value, size, "%d", number);
    } else if (type == MPI_C_BOOL) {  // Open MPI's bool variables
      _Bool flag = 0;
      if (MPI_T_cvar_read(handle, &flag) == MPI_SUCCESS) snprintf(value, size, "%s", flag ? "true" : "false");
    } else {
      snprintf(value, size, "(of a type this program does not read)");
    }
    MPI_T_cvar_handle_free(&handle);
    return;
  }
}

// One all-reduce of `bytes` on `comm`, checked element by element; returns the number of wrong elements.
static long checkedAllreduce(MPI_Comm comm, long bytes, int world_rank) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int count = (int)(bytes / 4);
  float* send = malloc((size_t)bytes);
  float* receive = malloc((size_t)bytes);
  // rank r contributes (r + 1) * (i % 13 + 1): the sum is (i % 13 + 1) * size * (size + 1) / 2, exact.
  for (int i = 0; i < count; ++i) send[i] = (float)((rank + 1) * (i % 13 + 1));
  MPI_Allreduce(send, receive, count, MPI_FLOAT, MPI_SUM, comm);
  long wrong = 0;
  for (int i = 0; i < count; ++i) {
    const float expected = (float)((i % 13 + 1) * size * (size + 1) / 2);
    if (receive[i] != expected && wrong++ == 0)
      printf("rank %d: MISMATCH comm_size %d bytes %ld element %d: got %g, expected %g\n", world_rank, size,
             bytes, i, (double)receive[i], (double)expected);
  }
  free(send);
  free(receive);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 1; i < argc; ++i) {
    const long bytes = strtol(argv[i], NULL, 10);
    if (bytes <= 0 || bytes % 4 != 0) {
      if (rank == 0) fprintf(stderr, "allreduce-sizes: %s is not a positive multiple of 4 bytes\n", argv[i]);
      MPI_Finalize();
      return 2;
    }
  }
  int provided = 0;
  MPI_T_init_thread(MPI_THREAD_SINGLE, &provided);
  if (rank == 0) {
    char value[4096];
    readControlVariable("coll_tuned_use_dynamic_rules", value, sizeof value);
    printf("cvar coll_tuned_use_dynamic_rules=%s\n", value);
    readControlVariable("coll_tuned_dynamic_rules_filename", value, sizeof value);
    printf("cvar coll_tuned_dynamic_rules_filename=%s\n", value);
    fflush(stdout);
  }
  MPI_T_finalize();

  // All ranks but the last (only with 3 or more ranks: a communicator of one rank is coll/self's).
  MPI_Comm smaller = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, size >= 3 && rank < size - 1 ? 0 : MPI_UNDEFINED, rank, &smaller);
  long wrong = 0, calls = 0;
  for (int i = 1; i < argc; ++i) {
    const long bytes = strtol(argv[i], NULL, 10);
    wrong += checkedAllreduce(MPI_COMM_WORLD, bytes, rank);
    ++calls;
    if (smaller != MPI_COMM_NULL) {
      wrong += checkedAllreduce(smaller, bytes, rank);
      ++calls;
    }
  }
  if (smaller != MPI_COMM_NULL) MPI_Comm_free(&smaller);
  long total = 0;
  MPI_Reduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    if (total == 0) printf("allreduce-sizes: %ld calls on rank 0, every result exact\n", calls);
    else printf("allreduce-sizes: %ld wrong elements\n", total);
  }
  MPI_Bcast(&total, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
