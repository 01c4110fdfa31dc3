// The NCCL backend of a build without CUDA: every entry point says so.

#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"

namespace gradscope::comm {
namespace {

constexpr const char* kReason =
    "this build has no NCCL backend (configured without CUDA; GRADSCOPE_WITH_CUDA)";

}  // namespace

bool ncclAvailable(std::string* reason) {
  if (reason != nullptr) *reason = kReason;
  return false;
}

std::unique_ptr<Communicator> ncclWorld() {
  fail("NCCL: {}", kReason);
}

std::string ncclNewUniqueId() {
  fail("NCCL: {}", kReason);
}

std::unique_ptr<Communicator> ncclFromUniqueId(std::string_view, int, int, int) {
  fail("NCCL: {}", kReason);
}

std::unique_ptr<Communicator> ncclDuplicateOf(void*, bool) {
  fail("NCCL: {}", kReason);
}

void* ncclStreamOf(Communicator&) {
  fail("NCCL: {}", kReason);
}

}  // namespace gradscope::comm
