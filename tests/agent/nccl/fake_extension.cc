// libgradscope-agent-nccl.so for the agent's NCCL tests on machines without a GPU: an Extension
// (agent/core/extension.h) over the fake NCCL's one-rank communicators on host memory. It tests the
// agent's side of explore and apply for NCCL (when it joins, samples, defers group members, records
// measurements and applied calls, passes the extension's own calls through unrecorded), which the real
// extension (agent/extensions/nccl_extension.cc) shares; the real one needs a GPU (scripts/gpu_check.sh).
//
// check_nccl.py puts it beside a link to the agent, where the agent looks for its extension. Its work
// is real NCCL calls on a duplicate made with ncclCommSplit, so the fake NCCL runs them, through the
// agent's wrappers:
//   join     ncclCommSplit of the job's communicator (colour 0);
//   capture  copies the input;
//   explore  times `reps` ncclAllReduce calls of the copy on the duplicate as "sum/native" and
//            "sum/rs_ag" (after `warmup_reps`), compares the result with the copy (a one-rank sum);
//            fp32 buffers also get consensus diagnostics (one rank: α = ‖g‖/(‖g‖+ε), cosine 1);
//   apply    ncclAllReduce on the duplicate, from the job's buffers, on the job's stream; it refuses
//            "sum/reduce_bcast" (the test's rule that cannot run);
//   forget   ncclCommDestroy of the duplicate.
// Each call is also written to the file GRADSCOPE_FAKE_EXTENSION_LOG names, one line each.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/extension.h"
#include "core/nccl_types.h"

using namespace gradscope;
using namespace gradscope::agent;
using namespace gradscope::agent::nccl;

extern "C" {
#define GS_NCCL_FUNCTION(NAME, RESULT, PARAMS, ARGS) RESULT NAME PARAMS;
#include "interpose/nccl_functions.def"
#undef GS_NCCL_FUNCTION
}

namespace {

__attribute__((format(printf, 1, 2))) void note(const char* format, ...) {
  const char* path = std::getenv("GRADSCOPE_FAKE_EXTENSION_LOG");
  if (path == nullptr) return;
  FILE* file = std::fopen(path, "a");
  if (file == nullptr) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(file, format, args);
  va_end(args);
  std::fputc('\n', file);
  std::fclose(file);
}

ncclComm_t jobComm(const ShadowCall& call) {
  return *static_cast<const ncclComm_t*>(call.comm);
}

class FakeNcclExtension final : public Extension {
 public:
  bool start(const ExploreSettings& settings, const std::string& local_problem, std::string& error) override {
    settings_ = settings;
    note("start %s", local_problem.c_str());
    error = local_problem;
    return local_problem.empty();
  }

  bool join(const ShadowCall& call, std::string& error) override {
    const std::lock_guard lock(mutex_);
    ncclComm_t duplicate = nullptr;
    if (ncclCommSplit(jobComm(call), 0, call.comm_rank, &duplicate, nullptr) != ncclSuccess || !duplicate) {
      error = "ncclCommSplit failed";
      return false;
    }
    duplicates_[call.comm_index] = duplicate;
    note("join %u seq %lld", call.comm_index, static_cast<long long>(call.seq));
    return true;
  }

  // NCCL joins each communicator at its first explorable all-reduce instead.
  void prepare(const ShadowCall&) override {}
  bool preparesAtCreation() const override { return false; }

  bool capture(const ShadowCall& call, const void* input) override {
    const std::lock_guard lock(mutex_);
    const auto* bytes = static_cast<const unsigned char*>(input);
    captured_[call.comm_index].assign(bytes, bytes + call.count * sizeOf(call.dtype));
    note("capture %u seq %lld", call.comm_index, static_cast<long long>(call.seq));
    return true;
  }

  ExploreResult explore(const ShadowCall& call, const BudgetState&) override {
    const std::lock_guard lock(mutex_);
    ExploreResult result;
    const std::vector<unsigned char>& input = captured_[call.comm_index];
    std::vector<unsigned char> output(input.size());
    const ncclComm_t duplicate = duplicates_[call.comm_index];
    for (const char* strategy : {"sum/native", "sum/rs_ag"}) {
      StrategyTiming timing;
      timing.strategy = strategy;
      timing.reps = settings_.reps;
      for (int i = 0; i < settings_.warmup_reps; ++i) run(call, input.data(), output.data(), duplicate);
      std::vector<double> times;
      for (int i = 0; i < settings_.reps; ++i) {
        const auto start = std::chrono::steady_clock::now();
        run(call, input.data(), output.data(), duplicate);
        times.push_back(
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      timing.min_ns = times.front();
      timing.max_ns = times.back();
      timing.median_ns = times[times.size() / 2];
      timing.p90_ns = times[times.size() - 1];
      const bool exact = output == input;
      timing.rel_l2_error = exact ? 0.0 : 1.0;
      timing.max_abs_error = exact ? 0.0 : 1.0;
      timing.cosine = exact ? 1.0 : 0.0;
      result.timings.push_back(timing);
    }
    if (call.dtype == DType::Fp32) {
      double norm2 = 0;
      for (std::size_t i = 0; i < call.count; ++i) {
        float v;
        std::memcpy(&v, input.data() + 4 * i, 4);
        norm2 += static_cast<double>(v) * static_cast<double>(v);
      }
      ConsensusSample sample;
      sample.grad_norm = std::sqrt(norm2);
      sample.alpha = sample.grad_norm / (sample.grad_norm + 1e-8);
      sample.cosine_to_mean = 1.0;
      sample.diversity = 1.0;
      result.consensus = sample;
    }
    result.explored = true;
    note("explore %u seq %lld", call.comm_index, static_cast<long long>(call.seq));
    return result;
  }

  bool apply(const ShadowCall& call, const void* send, void* recv, const std::string& strategy,
             std::string& error) override {
    const std::lock_guard lock(mutex_);
    if (strategy == "sum/reduce_bcast") {
      error = "the fake extension refuses sum/reduce_bcast";
      return false;
    }
    const ncclResult_t rc = ncclAllReduce(
        send != nullptr ? send : recv, recv, call.count, static_cast<ncclDataType_t>(call.dtype), ncclSum,
        duplicates_[call.comm_index], static_cast<cudaStream_t>(call.stream));
    note("apply %u seq %lld %s", call.comm_index, static_cast<long long>(call.seq), strategy.c_str());
    if (rc != ncclSuccess) error = "ncclAllReduce failed";
    return rc == ncclSuccess;
  }

  void forget(std::uint32_t comm_index) override {
    const std::lock_guard lock(mutex_);
    if (const auto it = duplicates_.find(comm_index); it != duplicates_.end()) {
      ncclCommDestroy(it->second);
      duplicates_.erase(it);
    }
    note("forget %u", comm_index);
  }

  void stop() override { note("stop"); }
  bool follows(const ShadowCall&) override { return false; }
  ExploreResult follow(const ShadowCall&, const BudgetState&) override { return {}; }

 private:
  void run(const ShadowCall& call, const void* in, void* out, ncclComm_t duplicate) {
    if (ncclAllReduce(in, out, call.count, static_cast<ncclDataType_t>(call.dtype), ncclSum, duplicate,
                      static_cast<cudaStream_t>(call.stream)) != ncclSuccess)
      std::fprintf(stderr, "fake extension: ncclAllReduce failed\n");
  }

  std::mutex mutex_;
  ExploreSettings settings_;
  std::map<std::uint32_t, ncclComm_t> duplicates_;
  std::map<std::uint32_t, std::vector<unsigned char>> captured_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) Extension* gradscope_agent_extension(
    int abi, const gradscope::agent::AgentHooks*) {
  if (abi != kExtensionAbi) return nullptr;
  return new FakeNcclExtension;
}
