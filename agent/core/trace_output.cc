#include "core/trace_output.h"

#include <sched.h>

#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/recorder.h"
#include "gradscope/common/error.h"

namespace gradscope::agent {
namespace {
// The CPUs this process may run on (its affinity): whether ranks share cores (tuner/async.h, cpuSharing).
int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}
}  // namespace

namespace {

bool createDirectories(const std::filesystem::path& directory, std::string& error) {
  if (directory.empty()) return true;
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    error = fmt::format("cannot create directory {}: {}", directory.string(), ec.message());
    return false;
  }
  return true;
}

nlohmann::json runConfig(const std::string& config_json) {
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) config = nlohmann::json::object();
  return config;
}

}  // namespace

TraceOutput::TraceOutput(storage::TraceWriter writer, std::int64_t run_id, std::int64_t rank_id,
                         std::int64_t epoch_ns, std::string config_json)
    : writer_(std::move(writer)),
      run_id_(run_id),
      rank_id_(rank_id),
      epoch_ns_(epoch_ns),
      config_json_(std::move(config_json)) {}

TraceOutput TraceOutput::create(const std::string& path, const storage::RunInfo& run,
                                storage::RankInfo rank) {
  std::string error;
  if (!createDirectories(std::filesystem::path(path).parent_path(), error)) fail("{}", error);
  storage::TraceWriter writer = storage::TraceWriter::create(path);
  const std::int64_t run_id = writer.addRun(run);
  rank.run_id = run_id;
  const std::int64_t rank_id = writer.addRank(rank);
  writer.commit();
  return TraceOutput(std::move(writer), run_id, rank_id, run.epoch_ns, run.config_json);
}

void TraceOutput::addComms(CommRegistry& registry) {
  for (std::size_t i = comm_rows_.size(); i < registry.size(); ++i) {
    const CommDescription description = registry.description(i);
    storage::CommInfo comm;
    comm.rank_id = rank_id_;
    comm.key = description.key;
    comm.backend = description.backend;
    comm.size = description.size;
    comm.comm_rank = description.rank;
    comm_rows_.push_back(writer_.addComm(comm));
  }
}

void TraceOutput::writeExploration(const ExploreRecord& record, std::optional<std::int64_t> call_id) {
  for (const StrategyTiming& timing : record.result.timings) {
    storage::Measurement m;
    m.run_id = run_id_;
    m.rank_id = rank_id_;
    m.call_id = call_id;
    m.strategy = timing.strategy;
    m.api = record.api;
    m.dtype = record.dtype;
    m.bytes = record.bytes;
    m.world = record.world;
    m.reps = timing.reps;
    m.min_ns = timing.min_ns;
    m.median_ns = timing.median_ns;
    m.p90_ns = timing.p90_ns;
    m.max_ns = timing.max_ns;
    m.algbw_gbs = timing.median_ns > 0 ? static_cast<double>(record.bytes) / timing.median_ns : 0.0;
    m.busbw_gbs = m.algbw_gbs * busBandwidthFactor(Collective::AllReduce, record.world);
    m.rel_l2_error = timing.rel_l2_error;
    m.max_abs_error = timing.max_abs_error;
    m.cosine = timing.cosine;
    m.overflow_count = timing.overflow_count;
    writer_.addMeasurement(m);
  }
  if (const auto& sample = record.result.consensus) {
    storage::ConsensusRecord row;
    row.rank_id = rank_id_;
    row.step = record.step;
    row.call_id = call_id;
    row.alpha = sample->alpha;
    row.cosine_to_mean = sample->cosine_to_mean;
    row.grad_norm = sample->grad_norm;
    row.diversity = sample->diversity;
    writer_.appendConsensus(std::span(&row, 1));
  }
}

void TraceOutput::addDrops(const DropCounts& drops) {
  for (std::size_t i = 0; i < kDropKinds; ++i)
    if (drops[i] > 0) writer_.addDrops(rank_id_, std::string(name(static_cast<DropKind>(i))), drops[i]);
}

void TraceOutput::commit() {
  writer_.commit();
  restoreIfRemoved();
}

void TraceOutput::restoreIfRemoved() {
  if (!writer_.removed()) return;
  const std::string path = writer_.path();
  const auto lost = [&](const std::string& why) {
    fail("{} was removed while the job ran and cannot be written again ({})", path, why);
  };
  std::string error;
  if (!createDirectories(std::filesystem::path(path).parent_path(), error)) lost(error);
  try {
    writer_.recreate();
  } catch (const std::exception& failure) {
    lost(failure.what());
  }
  log("{} was removed while the job ran; written again with the {} calls recorded so far, recording goes on",
      path, writer_.callCount());
}

void TraceOutput::finish(const AgentStatistics& stats, std::int64_t end_epoch_ns, bool signalled) {
  nlohmann::json config = runConfig(config_json_);
  config["agent"] = {
      {"calls_recorded", stats.calls_recorded},
      {"calls_dropped", stats.calls_dropped},
      {"hot_path_ns", stats.hot_path_ns},
      {"dropped_call_ns", stats.dropped_call_ns},
      {"flusher_cpu_ns", stats.flusher_cpu_ns},
      {"buffer_bytes", stats.buffer_bytes},
      {"cpus", usableCpus()},
  };
  if (!stats.gpu_spans.empty()) {
    config["agent"]["gpu_spans"] = stats.gpu_spans;
    if (!stats.gpu_spans_note.empty()) config["agent"]["gpu_spans_note"] = stats.gpu_spans_note;
  }
  if (agent::config().mode != Mode::Observe) {
    const ShadowStats shadow = shadowStats();
    config["agent"]["shadow"] = {
        {"mode", shadowModeName()},
        {"explored", shadow.explored},
        {"followed", shadow.followed},
        {"skipped_budget", shadow.skipped_budget},
        {"skipped_other", shadow.skipped_other},
        {"explore_ns", shadow.spent_ns},
        {"applied", shadow.applied},
        {"apply_failed", shadow.apply_failed},
    };
    nlohmann::json untouched = nlohmann::json::object();
    for (std::size_t i = 0; i < kUntouchedReasons; ++i)
      if (shadow.untouched[i] > 0)
        untouched[std::string(name(static_cast<Untouched>(i)))] = shadow.untouched[i];
    config["agent"]["shadow"]["untouched"] = untouched;
    if (!shadow.links.empty()) {
      nlohmann::json links = nlohmann::json::array();
      for (const LinkSample& link : shadow.links)
        links.push_back({{"host", link.host}, {"peer", link.peer}, {"bytes", link.bytes}, {"ns", link.ns}});
      config["agent"]["shadow"]["links"] = links;
    }
  }
  writer_.setRunConfig(run_id_, config.dump());
  if (signalled) writer_.finishQuickly(end_epoch_ns - epoch_ns_);
  else writer_.finish(end_epoch_ns - epoch_ns_);
}

void TraceOutput::closeAfterFailure(const DropCounts& drops, std::int64_t calls_recorded,
                                    std::int64_t calls_dropped, const std::string& why,
                                    std::int64_t end_epoch_ns) {
  std::vector<std::pair<std::string, std::int64_t>> rows;
  for (std::size_t i = 0; i < kDropKinds; ++i)
    if (drops[i] > 0) rows.emplace_back(name(static_cast<DropKind>(i)), drops[i]);
  nlohmann::json config = runConfig(config_json_);
  config["agent"] = {
      {"calls_recorded", calls_recorded}, {"calls_dropped", calls_dropped}, {"recording_stopped", why}};
  try {
    writer_.closeAfterFailure(run_id_, rank_id_, rows, config.dump(), end_epoch_ns - epoch_ns_);
  } catch (const std::exception&) {
  }
}

}  // namespace gradscope::agent
