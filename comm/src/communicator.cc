#include "gradscope/comm/communicator.h"

#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "gradscope/comm/mpi.h"
#include "gradscope/common/error.h"

namespace gradscope::comm {

std::size_t elementBytes(Element element) {
  const bool fp8 = element.dtype == DType::Fp8E4M3 || element.dtype == DType::Fp8E5M2;
  if (element.block > 0) {
    if (!fp8)
      fail("element {} with block {}: only fp8 elements have scaled blocks", name(element.dtype),
           element.block);
    return sizeof(float) + element.block;
  }
  const std::size_t bytes = sizeOf(element.dtype);
  if (bytes == 0) fail("element {}: no fixed size", name(element.dtype));
  return bytes;
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      release_(std::exchange(other.release_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    release_ = std::exchange(other.release_, nullptr);
  }
  return *this;
}

void Buffer::reset() {
  if (data_ != nullptr && release_ != nullptr) release_(data_);
  data_ = nullptr;
  bytes_ = 0;
  release_ = nullptr;
}

Communicator::Hierarchy Communicator::hierarchy() {
  Hierarchy made;
  made.node = split(nodeColor(), rank());
  // Only the node leaders use theirs; the other ranks' communicator just completes the collective split.
  made.leaders = split(made.node->rank() == 0 ? 0 : 1, rank());
  return made;
}

namespace {
class CompleteReduction final : public PendingReduction {
 public:
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<PendingReduction> Communicator::startAllReduce(const void* send, void* recv,
                                                               std::size_t count, Element type, ReduceOp op) {
  allReduce(send, recv, count, type, op);
  synchronize();
  return std::make_unique<CompleteReduction>();
}

std::unique_ptr<Communicator> Communicator::concurrentCopy(std::string& why_not) {
  why_not = fmt::format("{} cannot run collectives concurrently here", gradscope::name(backend()));
  return nullptr;
}

std::unique_ptr<QueueMark> Communicator::markQueue() {
  return nullptr;
}

void Communicator::waitForMark(const QueueMark&) {}

namespace {
constexpr std::string_view kMpiThreadNames[] = {"single", "funneled", "serialized", "multiple"};
}  // namespace

std::string_view name(MpiThreads threads) {
  return kMpiThreadNames[static_cast<int>(threads)];
}

std::optional<MpiThreads> parseMpiThreads(std::string_view text) {
  for (int level = 0; level < 4; ++level)
    if (text == kMpiThreadNames[level]) return static_cast<MpiThreads>(level);
  return std::nullopt;
}

// Here rather than in the MPI backend: a build without MPI can still tell that it was started by a launcher.
bool underMpiLauncher() {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(variable) != nullptr) return true;
  return false;
}

}  // namespace gradscope::comm
