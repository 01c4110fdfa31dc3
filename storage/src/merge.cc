#include "gradscope/storage/merge.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "file_util.h"
#include "gradscope/common/error.h"
#include "gradscope/storage/reader.h"
#include "gradscope/storage/writer.h"

namespace gradscope::storage {
namespace {

struct Source {
  std::string path;
  TraceReader reader;
  std::vector<RunInfo> runs;
  std::vector<RankInfo> ranks;
};

}  // namespace

std::vector<std::string> expandTraceInputs(const std::vector<std::string>& inputs,
                                           const std::string& exclude) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  const fs::path excluded = exclude.empty() ? fs::path() : fs::weakly_canonical(exclude, ec);
  for (const std::string& input : inputs) {
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(input, ec))
        if (entry.is_regular_file() && entry.path().extension() == ".db" &&
            entry.path().filename().string().front() != '.' &&
            (excluded.empty() || fs::weakly_canonical(entry.path(), ec) != excluded))
          found.push_back(entry.path().string());
      if (ec) fail("{}: cannot list directory: {}", input, ec.message());
      if (found.empty()) fail("{}: no trace files (*.db) in this directory", input);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(input);
    }
  }
  if (files.empty()) fail("no input traces given");
  return files;
}

MergeSummary mergeTraces(const std::vector<std::string>& inputs, const std::string& output,
                         const MergeOptions& options) {
  // Open and validate every input before creating anything.
  std::vector<Source> sources;
  for (const std::string& path : inputs) {
    TraceReader reader = TraceReader::open(path);
    Source source{path, std::move(reader), {}, {}};
    source.runs = source.reader.runs();
    source.ranks = source.reader.ranks();
    if (source.runs.empty()) fail("{}: has no run; it is not a complete gradscope trace", path);
    sources.push_back(std::move(source));
  }

  // Runs by uuid, and the checks that make a merge meaningful.
  struct MergedRun {
    RunInfo info;
    std::int64_t epoch_ns = 0;
    bool any_open = false;
    std::int64_t new_id = 0;
  };
  std::map<std::string, MergedRun> runs;
  std::map<std::pair<std::string, int>, std::string> rank_owner;
  for (const Source& source : sources) {
    for (const RunInfo& run : source.runs) {
      auto [it, inserted] = runs.try_emplace(run.uuid);
      MergedRun& merged = it->second;
      const std::int64_t start_abs = run.epoch_ns + run.start_ns;
      if (inserted) {
        merged.info = run;
        merged.epoch_ns = run.epoch_ns;
        merged.info.start_ns = start_abs;  // absolute until the end of the scan
        merged.info.end_ns = run.end_ns ? std::optional(run.epoch_ns + *run.end_ns) : std::nullopt;
      } else {
        merged.epoch_ns = std::min(merged.epoch_ns, run.epoch_ns);
        merged.info.start_ns = std::min(merged.info.start_ns, start_abs);
        if (run.end_ns && merged.info.end_ns)
          merged.info.end_ns = std::max(*merged.info.end_ns, run.epoch_ns + *run.end_ns);
        merged.info.world_size = std::max(merged.info.world_size, run.world_size);
      }
      if (!run.end_ns) merged.any_open = true;
    }
    for (const RankInfo& rank : source.ranks) {
      const auto run = std::find_if(source.runs.begin(), source.runs.end(),
                                    [&](const RunInfo& r) { return r.id == rank.run_id; });
      if (run == source.runs.end()) fail("{}: rank {} refers to a missing run", source.path, rank.rank);
      const auto [it, inserted] = rank_owner.try_emplace({run->uuid, rank.rank}, source.path);
      if (!inserted)
        fail("rank {} of run {} appears in both {} and {}; merge each rank's file once", rank.rank, run->uuid,
             it->second, source.path);
    }
  }
  if (runs.size() > 1 && !options.allow_different_runs) {
    auto it = runs.begin();
    fail(
        "the inputs belong to {} different runs ({}, {}, ...); pass --allow-different-runs to merge them "
        "anyway",
        runs.size(), it->first, std::next(it)->first);
  }

  detail::AtomicOutput out(output, options.overwrite, /*create_empty=*/false);
  MergeSummary summary;
  {
    TraceWriter writer = TraceWriter::create(out.temporaryPath());
    for (auto& [uuid, merged] : runs) {
      RunInfo info = merged.info;
      info.epoch_ns = merged.epoch_ns;
      info.start_ns = merged.info.start_ns - merged.epoch_ns;
      info.end_ns = merged.any_open || !merged.info.end_ns
                        ? std::nullopt
                        : std::optional(*merged.info.end_ns - merged.epoch_ns);
      merged.new_id = writer.addRun(info);
    }
    std::int64_t last_call_id = 0;
    for (Source& source : sources) {
      std::map<std::int64_t, std::int64_t> run_ids, rank_ids, comm_ids, shifts;  // old -> new
      for (const RunInfo& run : source.runs) {
        const MergedRun& merged = runs.at(run.uuid);
        run_ids[run.id] = merged.new_id;
        shifts[run.id] = run.epoch_ns - merged.epoch_ns;
      }
      std::map<std::int64_t, std::int64_t> rank_shift;
      for (RankInfo rank : source.ranks) {
        const std::int64_t old_id = rank.id;
        rank_shift[old_id] = shifts.at(rank.run_id);
        rank.run_id = run_ids.at(rank.run_id);
        rank.id = 0;
        rank_ids[old_id] = writer.addRank(rank);
      }
      for (CommInfo comm : source.reader.comms()) {
        const std::int64_t old_id = comm.id;
        const auto rank = rank_ids.find(comm.rank_id);
        if (rank == rank_ids.end())
          fail("{}: communicator {} refers to a missing rank", source.path, comm.key);
        comm.rank_id = rank->second;
        comm_ids[old_id] = writer.addComm(comm);
      }
      const auto remapRank = [&](std::int64_t old_id) {
        const auto it = rank_ids.find(old_id);
        if (it == rank_ids.end())
          fail("{}: a row refers to rank id {}, which is not in the ranks table", source.path, old_id);
        return it->second;
      };

      // Calls keep their order; ids move up by a constant so references to them stay easy to remap.
      std::int64_t call_offset = 0;
      bool first_call = true;
      std::vector<CallRecord> batch;
      batch.reserve(4096);
      source.reader.forEachCall([&](const CallRecord& original) {
        CallRecord call = original;
        if (first_call) {
          call_offset = last_call_id + 1 - original.id;
          first_call = false;
        }
        call.id = original.id + call_offset;
        const std::int64_t shift = rank_shift.count(original.rank_id) ? rank_shift[original.rank_id] : 0;
        call.rank_id = remapRank(original.rank_id);
        const auto comm = comm_ids.find(original.comm_id);
        call.comm_id = comm == comm_ids.end() ? 0 : comm->second;
        call.enqueue_ns += shift;
        call.start_ns += shift;
        call.end_ns += shift;
        batch.push_back(call);
        if (batch.size() == batch.capacity()) {
          writer.appendCalls(batch);
          batch.clear();
        }
        last_call_id = call.id;
        ++summary.calls;
        return true;
      });
      writer.appendCalls(batch);

      for (Measurement m : source.reader.measurements()) {
        m.run_id = run_ids.count(m.run_id) ? run_ids[m.run_id] : runs.begin()->second.new_id;
        if (m.rank_id) m.rank_id = remapRank(*m.rank_id);
        if (m.call_id) m.call_id = *m.call_id + call_offset;
        writer.addMeasurement(m);
        ++summary.measurements;
      }
      std::vector<ConsensusRecord> consensus = source.reader.consensus();
      for (ConsensusRecord& row : consensus) row.rank_id = remapRank(row.rank_id);
      writer.appendConsensus(consensus);
      for (RecommendationRecord recommendation : source.reader.recommendations()) {
        recommendation.run_id = run_ids.count(recommendation.run_id) ? run_ids[recommendation.run_id] : 0;
        writer.addRecommendation(recommendation);
      }
      for (const DropRecord& drop : source.reader.drops())
        writer.addDrops(remapRank(drop.rank_id), drop.kind, drop.count);
      summary.ranks += static_cast<int>(source.ranks.size());
      ++summary.files;
    }
    writer.finish();
  }
  out.commit();
  summary.runs = static_cast<int>(runs.size());
  return summary;
}

}  // namespace gradscope::storage
