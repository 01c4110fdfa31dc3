// libgradscope-agent-nccl.so: explore and apply over NCCL communicators (extension.h says why this is a
// library of its own; strategy_extension.h holds everything that is not NCCL's). Built with CUDA and
// NCCL; the agent loads it at the job's first NCCL communicator, and its libnccl dependency binds to
// the job's copy.
//
// NCCL specifics:
// - No world to agree over at start: start() is local, and the agent calls join() at the first
//   explorable all-reduce of every communicator, on every rank configured for explore or apply. join()
//   splits the job's communicator; a rank that could not start splits with NCCL_SPLIT_NOCOLOR, so the
//   others get a smaller duplicate, and every rank then leaves that communicator alone.
// - Memory: one device arena per GPU (GRADSCOPE_SHADOW_BYTES, cudaMalloc'd at the first capture on that
//   GPU; a failure there is final for the GPU and agreed on per exploration like any missing room) and
//   one host arena of the same size (mapped at start, touched only as used) that mirrors each slice for
//   the references and error metrics.
// - Ordering, never a host wait on the job's stream: the input copy is enqueued on the job's stream
//   ahead of its call; the duplicate's stream waits for an event recorded on the job's stream after
//   the call; in apply mode the job's stream waits in turn for an event recorded after the strategy.

#include <map>
#include <mutex>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "extensions/strategy_extension.h"
#include "gradscope/comm/nccl.h"
#include "gradscope/common/error.h"

namespace gradscope::agent {
namespace {

void checkCuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("{} failed: {}", what, cudaGetErrorString(status));
}

ncclComm_t jobComm(const ShadowCall& call) {
  return *static_cast<const ncclComm_t*>(call.comm);
}

// The GPU of the job's communicator.
int deviceOf(const ShadowCall& call) {
  int device = -1;
  if (const ncclResult_t rc = ncclCommCuDevice(jobComm(call), &device); rc != ncclSuccess)
    fail("ncclCommCuDevice failed: {}", ncclGetErrorString(rc));
  return device;
}

// Makes `device` current on this thread; the public entry points put the job's choice back (KeepDevice).
void useDevice(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device)
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
}

// `waiter` runs its next work after what `signaller` holds now. The event is destroyed at once; CUDA
// releases it when the wait is done.
void order(cudaStream_t signaller, cudaStream_t waiter) {
  cudaEvent_t event = nullptr;
  checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  const cudaError_t recorded = cudaEventRecord(event, signaller);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(waiter, event, 0) : recorded;
  cudaEventDestroy(event);
  checkCuda(recorded, "cudaEventRecord");
  checkCuda(waited, "cudaStreamWaitEvent");
}

// The calling thread's current GPU, put back when the scope ends: the strategies make the duplicate's
// GPU current, and the job's thread must find its own choice after every call.
class KeepDevice {
 public:
  KeepDevice() {
    if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
  }
  ~KeepDevice() {
    int current = -1;
    if (device_ >= 0 && cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
  }
  KeepDevice(const KeepDevice&) = delete;
  KeepDevice& operator=(const KeepDevice&) = delete;

 private:
  int device_ = -1;
};

class NcclExtension final : public StrategyExtension {
 public:
  using StrategyExtension::StrategyExtension;

  bool join(const ShadowCall& call, std::string& error) override {
    const KeepDevice keep;
    return StrategyExtension::join(call, error);
  }
  bool capture(const ShadowCall& call, const void* input) override {
    const KeepDevice keep;
    return StrategyExtension::capture(call, input);
  }
  ExploreResult explore(const ShadowCall& call, const BudgetState& budget) override {
    const KeepDevice keep;
    return StrategyExtension::explore(call, budget);
  }
  bool apply(const ShadowCall& call, const void* send, void* recv, const std::string& strategy,
             std::string& error) override {
    const KeepDevice keep;
    return StrategyExtension::apply(call, send, recv, strategy, error);
  }
  void forget(std::uint32_t comm_index) override {
    const KeepDevice keep;
    StrategyExtension::forget(comm_index);
  }

 protected:
  // Each rank alone: NCCL jobs have no world communicator to agree over; join() agrees per communicator.
  bool agreeToStart(const std::string& local_problem, std::string& error) override {
    error = local_problem;
    return local_problem.empty();
  }

  bool reserve(std::size_t bytes) override {
    bytes_ = bytes;
    return host_.mapHost(bytes);
  }

  std::unique_ptr<comm::Communicator> duplicate(const ShadowCall& call, bool join, bool) override {
    std::unique_ptr<comm::Communicator> copy = comm::ncclDuplicateOf(jobComm(call), join);
    if (copy && copy->size() != call.comm_size)
      fail(
          "{} of the communicator's {} ranks could not start explore or apply (each says why in its first "
          "line)",
          call.comm_size - copy->size(), call.comm_size);
    return copy;
  }

  bool take(const ShadowCall& call, std::size_t input_bytes, bool want_gather, Capture& capture) override {
    const int device = deviceOf(call);
    SliceArena* arena = deviceArena(device);
    if (arena == nullptr) return false;
    // A slice on the GPU and its host mirror, or neither.
    const auto take_both = [&](std::size_t bytes, bool with_gather) {
      std::byte* slice = arena->take(bytes);
      std::byte* host_slice = slice != nullptr ? host_.take(bytes) : nullptr;
      if (host_slice == nullptr) {
        arena->give(slice);
        return false;
      }
      capture = Capture::layout(slice, host_slice, input_bytes, call.count, with_gather);
      capture.device = device;
      return true;
    };
    const std::size_t base = Capture::baseBytes(input_bytes, call.count);
    return (want_gather && take_both(base + Capture::gatherBytes(call.count, call.comm_size), true)) ||
           take_both(base, false);
  }

  void give(Capture& capture) override {
    if (capture.slice != nullptr) {
      const std::lock_guard lock(devices_mutex_);
      if (const auto it = devices_.find(capture.device); it != devices_.end())
        it->second.arena.give(capture.slice);
    }
    host_.give(capture.host_slice);
    capture = {};
  }

  void copyInput(const ShadowCall& call, void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    useDevice(deviceOf(call));
    checkCuda(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(call.stream)),
        "cudaMemcpyAsync");
  }

  void afterJob(const ShadowCall& call, comm::Communicator& duplicate) override {
    useDevice(deviceOf(call));
    order(static_cast<cudaStream_t>(call.stream), static_cast<cudaStream_t>(comm::ncclStreamOf(duplicate)));
  }

  void beforeJob(const ShadowCall& call, comm::Communicator& duplicate) override {
    useDevice(deviceOf(call));
    order(static_cast<cudaStream_t>(comm::ncclStreamOf(duplicate)), static_cast<cudaStream_t>(call.stream));
  }

 private:
  struct DeviceMemory {
    void* memory = nullptr;  // nullptr: the allocation failed, and is not retried
    SliceArena arena;
  };

  // The GPU's arena, allocated at its first use; nullptr when it could not be.
  SliceArena* deviceArena(int device) {
    const std::lock_guard lock(devices_mutex_);
    auto [it, inserted] = devices_.try_emplace(device);
    if (inserted && bytes_ > 0) {
      useDevice(device);
      if (cudaMalloc(&it->second.memory, bytes_) != cudaSuccess) {
        it->second.memory = nullptr;
        cudaGetLastError();  // not sticky: the job's next call must not see it
        log(fmt::format(
            "explore: cannot allocate the {}-byte shadow arena on GPU {} (GRADSCOPE_SHADOW_BYTES); "
            "calls there are not explored",
            bytes_, device));
      } else {
        it->second.arena.assign(static_cast<std::byte*>(it->second.memory), bytes_);
      }
    }
    return it->second.memory != nullptr ? &it->second.arena : nullptr;
  }

  std::size_t bytes_ = 0;
  SliceArena host_;
  std::mutex devices_mutex_;
  std::map<int, DeviceMemory> devices_;
};

}  // namespace
}  // namespace gradscope::agent

extern "C" __attribute__((visibility("default"))) gradscope::agent::Extension* gradscope_agent_extension(
    int abi, const gradscope::agent::AgentHooks* hooks) {
  if (abi != gradscope::agent::kExtensionAbi) return nullptr;
  // Never destroyed: job threads may be inside it while the process exits, and NCCL communicators must
  // not be destroyed from an exit handler.
  return new gradscope::agent::NcclExtension(*hooks);
}
