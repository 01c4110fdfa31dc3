// gradscope-mpi: the gradscope command as one process of an MPI job, which `gradscope` becomes under an
// MPI launcher for report, recommend, export and merge (main.cc). Process 0 runs the command and merges
// a directory's rank files; the other processes read their share of them and send it to process 0
// (storage/merge.h MergeLink), then exit with process 0's status.

#include <algorithm>
#include <climits>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <mpi.h>

#include "command_line.h"
#include "gradscope/common/error.h"
#include "gradscope/storage/merge.h"

namespace {

// The link over MPI: messages are byte strings on a duplicate of MPI_COMM_WORLD, control (process 0 to a
// reader) and data (a reader to process 0) on tags of their own. MPI orders messages per sender, tag and
// communicator, as MergeLink requires; the data messages (up to a batch of 4096 calls, about 0.5 MiB)
// are above every transport's eager limit, so a reader's send waits for process 0 to take it.
class MpiMergeLink final : public gradscope::storage::MergeLink {
 public:
  MpiMergeLink() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm node;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &on_node_);
    MPI_Comm_free(&node);
  }
  ~MpiMergeLink() override { MPI_Comm_free(&comm_); }
  MpiMergeLink(const MpiMergeLink&) = delete;
  MpiMergeLink& operator=(const MpiMergeLink&) = delete;

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void sendControl(int to, std::string message) override { send(message, to, kControl); }
  std::string receiveControl() override { return receive(0, kControl); }
  std::optional<std::string> pollControl() override {
    int waiting = 0;
    MPI_Iprobe(0, kControl, comm_, &waiting, MPI_STATUS_IGNORE);
    if (!waiting) return std::nullopt;
    return receive(0, kControl);
  }
  void sendData(std::string message) override { send(message, 0, kData); }
  std::string receiveData(int from) override { return receive(from, kData); }

  int processesOnThisNode() const { return on_node_; }

 private:
  static constexpr int kControl = 1, kData = 2;

  void send(const std::string& message, int to, int tag) {
    if (message.size() > static_cast<std::size_t>(INT_MAX))
      gradscope::fail("merge: a message of {} bytes is more than MPI sends at once", message.size());
    MPI_Send(message.data(), static_cast<int>(message.size()), MPI_BYTE, to, tag, comm_);
  }
  std::string receive(int from, int tag) {
    MPI_Status status;
    MPI_Probe(from, tag, comm_, &status);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::string message(static_cast<std::size_t>(bytes), '\0');
    MPI_Recv(message.data(), bytes, MPI_BYTE, from, tag, comm_, MPI_STATUS_IGNORE);
    return message;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 1, rank_ = 0, on_node_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  // Only this thread calls MPI; the merge's reading threads do not.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int status = gradscope::cli::kExitError;
  {
    MpiMergeLink link;
    if (link.rank() == 0) {
      status = gradscope::cli::commandLine(argc, argv, &link);
      try {
        gradscope::storage::endMerges(link, status);
      } catch (const std::exception& error) {
        fmt::print(stderr, "gradscope: internal error: {}\n", error.what());
      }
    } else {
      // The node's cores, shared among its processes.
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      try {
        status = gradscope::storage::serveMerges(link, std::max(1, cores / link.processesOnThisNode()));
        if (status < 0) status = gradscope::cli::kExitError;  // stopped: a merge failed
      } catch (const std::exception& error) {
        // Not the user's problem to read (process 0 says what failed); the exit status carries it.
        status = gradscope::cli::kExitError;
        fmt::print(stderr, "gradscope: process {}: internal error: {}\n", link.rank(), error.what());
      }
    }
  }
  MPI_Finalize();
  return status;
}
