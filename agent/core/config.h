#pragma once

// The agent's configuration: the GRADSCOPE_* variables of gradscope/common/job_environment.def read by
// AgentConfig (docs/agent.md has the table). Parsing is a pure function of an environment map so that
// tests cover every value without touching the process environment.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gradscope/common/job_environment.h"
#include "gradscope/common/launcher.h"

namespace gradscope::agent {

// Explore mode (GRADSCOPE_EXPLORE_*): what to sample and how much time it may take.
struct ExploreConfig {
  double budget = 0.10;  // GRADSCOPE_EXPLORE_BUDGET: fraction of the run, 0 < x <= 1 (1: no limit)
  int samples = 3;       // GRADSCOPE_EXPLORE_SAMPLES: explorations per (api, dtype, size)
  int warmup = 2;        // GRADSCOPE_EXPLORE_WARMUP: occurrences skipped first
  int spacing = 1;       // GRADSCOPE_EXPLORE_SPACING: occurrences between explorations
  int reps = 10;         // GRADSCOPE_EXPLORE_REPS: timed repetitions per strategy
  int warmup_reps = 2;   // GRADSCOPE_EXPLORE_WARMUP_REPS
  std::vector<std::string> strategies;   // GRADSCOPE_EXPLORE_STRATEGIES (comma-separated); empty: all
  std::int64_t shadow_bytes = 64 << 20;  // GRADSCOPE_SHADOW_BYTES: host shadow arena
  int links = 1;  // GRADSCOPE_EXPLORE_LINKS: 1: time the links between the job's hosts at start
};

// The recording rate limit is enforced over windows of this length: a thread records at most
// max_call_rate × kCallRateWindowNs / 1 s calls per window (5,000 by default), so a burst of that many
// consecutive calls is recorded whole at any rate.
inline constexpr std::int64_t kCallRateWindowNs = 100'000'000;

// GRADSCOPE_GPU_WINDOWS: when the agent keeps the GPU's kernels for the step model (cupti_tracer.h,
// "Windows"). Marked steps: `steps` steps from step 1 of every `every_steps` (1..steps, every+1..); not
// marked: the first `time_ns` of every `every_ns` of the Unix epoch. "off": never.
struct GpuWindowConfig {
  bool off = false;
  std::int64_t steps = 4, every_steps = 100;
  std::int64_t time_ns = 1'000'000'000, every_ns = 20'000'000'000;
  // Whether marked step `step` is inside a window.
  bool stepSampled(std::int64_t step) const { return !off && step >= 1 && (step - 1) % every_steps < steps; }
  // Whether Unix-epoch time `epoch_ns` is inside a window.
  bool timeSampled(std::int64_t epoch_ns) const { return !off && epoch_ns % every_ns < time_ns; }
};

struct Config {
  bool disabled = false;                        // GRADSCOPE_DISABLE=1
  Mode mode = Mode::Observe;                    // GRADSCOPE_MODE
  std::string output = "gradscope-%h-%p.db";    // GRADSCOPE_OUTPUT (template)
  std::string run_id;                           // GRADSCOPE_RUN_ID, or derived from the launcher
  std::string command;                          // GRADSCOPE_COMMAND, or /proc/self/cmdline
  std::int64_t flush_interval_ns = 50'000'000;  // GRADSCOPE_FLUSH_INTERVAL
  std::uint32_t buffer_calls = 65536;           // GRADSCOPE_BUFFER_CALLS (power of two)
  std::int64_t max_call_rate = 50'000;          // GRADSCOPE_MAX_CALL_RATE (calls/s/thread, 0 = all)
  std::int64_t step_calls = 0;                  // GRADSCOPE_STEP_CALLS, 0 = not set
  std::string step_nvtx;                        // GRADSCOPE_STEP_NVTX, empty = not set
  GpuWindowConfig gpu_windows;                  // GRADSCOPE_GPU_WINDOWS
  bool writer_any_cpu = true;                   // GRADSCOPE_WRITER_CPUS=any (true) or rank
  std::optional<int> env_rank, env_world_size;  // from the launcher's variables (detectLaunch), if any
  ExploreConfig explore;
  std::string recommendation;          // GRADSCOPE_RECOMMENDATION: the file apply mode follows
  bool allow_semantic_change = false;  // GRADSCOPE_ALLOW_SEMANTIC_CHANGE=1: AdaCons/AdaSum rules may apply
  // GRADSCOPE_VALIDATE_WINDOW: apply mode follows the plan in alternate windows of this many calls of
  // each communicator (seq / window even: the plan; odd: the job's own calls), so that the run measures
  // what the plan saves (gradscope run --validate). 0: the plan throughout.
  std::int64_t validate_window = 0;
};

// The launcher-derived values and the output template are shared with the NCCL profiler plugin
// (gradscope/common/launcher.h).
using gradscope::Environment;
using gradscope::expandOutputTemplate;
using gradscope::hostName;
using gradscope::randomUuid;
using gradscope::runIdFromLauncher;

// Parses the configuration. Every invalid value is one line in `errors` (naming the variable, the
// value, what is accepted); a configuration with errors must not record (fail open).
Config parseConfig(const Environment& env, std::vector<std::string>& errors);

}  // namespace gradscope::agent
