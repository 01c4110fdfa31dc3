// gradscope bench: the table, CSV and JSON outputs and the progress line.

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/cli/bench.h"
#include "gradscope/common/version.h"

namespace gradscope::cli::bench {
namespace {

constexpr std::string_view kNotApplicable = "n/a";

std::string bandwidthFormula(const BenchContext& context) {
  if (context.backend == Backend::Local)
    return "algbw = size / median time; busbw = bytes the sum moves in memory, (K+1)·size (accumulate_n: "
           "3(K-1)·size), / median time";
  return fmt::format(
      "algbw = size / median time; busbw = algbw · 2(n-1)/n = algbw · {:.3g} (nccl-tests all-reduce)",
      busBandwidthFactor(Collective::AllReduce, context.world_size));
}

nlohmann::ordered_json optionalNumber(const std::optional<double>& value) {
  return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
}

}  // namespace

TableFormat::TableFormat(const std::vector<std::string>& strategies) : strategy_width_(8) {
  for (const auto& name : strategies) strategy_width_ = std::max(strategy_width_, name.size());
}

std::string TableFormat::header(const BenchContext& context, const BenchOptions& options) const {
  const auto w = strategy_width_;
  std::string text;
  text += fmt::format("# gradscope bench {}: {}\n", kVersion, context.description);
  text += fmt::format("# {} rank{}, dtype {}, warm-up {}, iterations {}, check {}, out-of-place\n",
                      context.world_size, context.world_size == 1 ? "" : "s", benchDTypeName(options.dtype),
                      options.warmup_iters, options.iters, options.check ? "on" : "off");
  text += fmt::format("# time: {}; min/median/max over ranks\n", context.timing);
  text += fmt::format("# {}\n", bandwidthFormula(context));
  text +=
      "# #wrong: result elements not bit-identical to the exact sum of verifiable inputs, over ranks (n/a: "
      "lossy); rel_err: relative L2 error vs fp64 on random inputs, worst rank\n";
  text += "#\n";
  text += fmt::format("#  {:<{}} {:>12} {:>12} {:^32} {:>9} {:>9}\n", "", w, "", "", "time (us)", "algbw",
                      "busbw");
  text += fmt::format("#  {:<{}} {:>12} {:>12} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9}\n", "strategy", w,
                      "size(B)", "count", "min", "median", "max", "(GB/s)", "(GB/s)", "#wrong", "rel_err");
  return text;
}

std::string TableFormat::row(const BenchPoint& point) const {
  const std::string wrong = point.wrong ? std::to_string(*point.wrong) : std::string(kNotApplicable);
  const std::string error =
      point.error ? fmt::format("{:.2e}", point.error->rel_l2) : std::string(kNotApplicable);
  return fmt::format("   {:<{}} {:>12} {:>12} {:>10.2f} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f} {:>8} {:>9}\n",
                     point.strategy, strategy_width_, point.bytes, point.count, point.time.min_us,
                     point.time.median_us, point.time.max_us, point.algbw_gbs, point.busbw_gbs, wrong, error);
}

std::string formatCsvHeader() {
  return "strategy,backend,dtype,ranks,bytes,count,reps,time_min_us,time_median_us,time_p90_us,time_max_us,"
         "median_call_us,algbw_gbs,busbw_gbs,wrong,rel_err,max_abs_err,cosine,overflow,nan\n";
}

std::string formatCsvRow(const BenchPoint& point, const BenchContext& context, DType dtype) {
  // Unset values are empty fields; numbers are written in full (shortest round-trip form).
  const std::string wrong = point.wrong ? std::to_string(*point.wrong) : "";
  std::string errors = ",,,,";
  if (point.error)
    errors = fmt::format("{},{},{},{},{}", point.error->rel_l2, point.error->max_abs, point.error->cosine,
                         point.error->overflow, point.error->nan);
  return fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", point.strategy,
                     name(context.backend), benchDTypeName(dtype), context.world_size, point.bytes,
                     point.count, point.reps, point.time.min_us, point.time.median_us, point.time.p90_us,
                     point.time.max_us, point.median_call.median_us, point.algbw_gbs, point.busbw_gbs, wrong,
                     errors);
}

std::string formatJson(const BenchContext& context, const BenchOptions& options,
                       const std::vector<BenchPoint>& points) {
  nlohmann::ordered_json document = {
      {"tool", "gradscope bench"},
      {"version", kVersion},
      {"backend", name(context.backend)},
      {"description", context.description},
      {"world_size", context.world_size},
      {"dtype", benchDTypeName(options.dtype)},
      {"warmup_iters", options.warmup_iters},
      {"iters", options.iters},
      {"check", options.check},
      {"timing", context.timing},
      {"bandwidth", bandwidthFormula(context)},
  };
  auto& rows = document["points"] = nlohmann::ordered_json::array();
  for (const auto& point : points) {
    nlohmann::ordered_json row = {
        {"strategy", point.strategy},
        {"bytes", point.bytes},
        {"count", point.count},
        {"reps", point.reps},
        {"time_us",
         {{"min", point.time.min_us},
          {"median", point.time.median_us},
          {"p90", point.time.p90_us},
          {"max", point.time.max_us}}},
        {"median_call_us",
         {{"min", point.median_call.min_us},
          {"median", point.median_call.median_us},
          {"p90", point.median_call.p90_us},
          {"max", point.median_call.max_us}}},
        {"algbw_gbs", point.algbw_gbs},
        {"busbw_gbs", point.busbw_gbs},
        {"wrong", point.wrong ? nlohmann::ordered_json(*point.wrong) : nlohmann::ordered_json(nullptr)},
    };
    const auto& error = point.error;
    row["rel_err"] = optionalNumber(error ? std::optional(error->rel_l2) : std::nullopt);
    row["max_abs_err"] = optionalNumber(error ? std::optional(error->max_abs) : std::nullopt);
    row["cosine"] = optionalNumber(error ? std::optional(error->cosine) : std::nullopt);
    row["overflow"] = error ? nlohmann::ordered_json(error->overflow) : nlohmann::ordered_json(nullptr);
    row["nan"] = error ? nlohmann::ordered_json(error->nan) : nlohmann::ordered_json(nullptr);
    rows.push_back(std::move(row));
  }
  return document.dump(2) + "\n";
}

std::string formatProgress(std::size_t done, std::size_t total, const std::string& label, std::size_t width) {
  constexpr std::size_t kBar = 24;
  const std::size_t filled = total == 0 ? kBar : done * kBar / total;
  std::string line = fmt::format("[{}{}] {}/{} {}", std::string(filled, '#'), std::string(kBar - filled, '.'),
                                 done, total, label);
  line.resize(width, ' ');  // pads over the previous line, truncates what would wrap
  return line;
}

}  // namespace gradscope::cli::bench
