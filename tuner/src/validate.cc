// Proof in the job: see validate.h.

#include "gradscope/tuner/validate.h"

#include <algorithm>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gradscope/storage/step_model.h"

namespace gradscope::tuner {
namespace {

constexpr int kBootstrapResamples = 2000;
constexpr std::uint64_t kBootstrapSeed = 1;

enum class Kind : std::uint8_t { None, With, Without, Mixed };

Kind combine(Kind a, Kind b) {
  if (a == Kind::None) return b;
  return a == b ? a : Kind::Mixed;
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5)];
}

}  // namespace

std::optional<Validation> validateRun(const storage::TraceReader& reader, const Recommendation& plan,
                                      std::int64_t window_calls) {
  if (window_calls <= 0) return std::nullopt;
  std::unordered_map<std::int64_t, int> comm_size;
  for (const auto& comm : reader.comms()) comm_size[comm.id] = comm.size;
  // The rule a call of the trace falls under, if the agent's windows switch it.
  const auto ruleOf = [&](const storage::CallRecord& call) -> const RecommendationRule* {
    if (call.op != ReduceOp::Sum || call.seq < 0) return nullptr;
    const auto size = comm_size.find(call.comm_id);
    const RecommendationRule* rule =
        plan.match(call.api, call.dtype, call.bytes, size == comm_size.end() ? 0 : size->second);
    return rule == nullptr || rule->strategy.starts_with("sum/nccl.") ? nullptr : rule;
  };
  // Windows of steps when the job marked its steps (the agent then switched at step boundaries), else of
  // calls of each communicator.
  bool by_step = false;
  for (const auto& run : reader.runs()) {
    const auto config = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
    by_step |= config.is_object() && (config.contains("step_calls") || config.contains("step_nvtx"));
  }
  const auto withPlan = [&](const storage::CallRecord& call) {
    return ((by_step ? call.step : call.seq) / window_calls) % 2 == 0;
  };

  // Each step's kind, and each rule's calls in the steps without the plan.
  std::map<std::int64_t, Kind> kinds;
  std::map<const RecommendationRule*, std::int64_t> calls_without;
  reader.forEachCall([&](const storage::CallRecord& call) {
    if (call.step < 0) return true;
    const RecommendationRule* rule = ruleOf(call);
    Kind& kind = kinds[call.step];
    if (rule != nullptr) kind = combine(kind, withPlan(call) ? Kind::With : Kind::Without);
    return true;
  });
  reader.forEachCall([&](const storage::CallRecord& call) {
    if (const RecommendationRule* rule = ruleOf(call); rule != nullptr && kinds[call.step] == Kind::Without)
      ++calls_without[rule];
    return true;
  });

  // Windows: runs of consecutive steps of one kind; their mean step times.
  const storage::StepModel model = storage::computeStepModel(reader, [&](const storage::CallRecord& call) {
    const auto kind = kinds.find(call.step);
    return kind != kinds.end() && kind->second == Kind::Without;
  });
  const std::vector<storage::StepTotals> steps = storage::stepTotals(model.steps);
  Validation out;
  out.window_calls = window_calls;
  out.window_steps = by_step;
  std::vector<double> with, without;  // window means
  std::vector<double> window;
  Kind window_kind = Kind::None;
  bool first_with = true, first_without = true;
  std::int64_t ranks = 1;
  const auto close = [&] {
    if (window.empty()) return;
    bool& first = window_kind == Kind::With ? first_with : first_without;
    if (!first) (window_kind == Kind::With ? with : without).push_back(mean(window));
    first = false;
    window.clear();
  };
  double with_sum = 0, without_sum = 0;
  for (const auto& step : steps) {
    ranks = std::max<std::int64_t>(ranks, step.ranks);
    const auto kind = kinds.find(step.step);
    const Kind k = kind == kinds.end() ? Kind::None : kind->second;
    if (k != window_kind) close();
    window_kind = k;
    if (k != Kind::With && k != Kind::Without) {
      ++out.steps_left_out;
      continue;
    }
    window.push_back(static_cast<double>(step.span_ns));
    if (k == Kind::With) ++out.steps_with, with_sum += static_cast<double>(step.span_ns);
    else ++out.steps_without, without_sum += static_cast<double>(step.span_ns);
  }
  close();
  out.windows_with = static_cast<int>(with.size());
  out.windows_without = static_cast<int>(without.size());
  if (with.size() < 2 || without.size() < 2) return std::nullopt;
  out.step_with_ns = mean(with);
  out.step_without_ns = mean(without);
  out.change = out.step_with_ns / out.step_without_ns - 1;
  std::mt19937_64 random(kBootstrapSeed);
  std::vector<double> ratios, resample_with(with.size()), resample_without(without.size());
  for (int i = 0; i < kBootstrapResamples; ++i) {
    for (double& v : resample_with)
      v = with[std::uniform_int_distribution<std::size_t>(0, with.size() - 1)(random)];
    for (double& v : resample_without)
      v = without[std::uniform_int_distribution<std::size_t>(0, without.size() - 1)(random)];
    ratios.push_back(mean(resample_with) / mean(resample_without) - 1);
  }
  out.change_low = percentile(ratios, 0.025);
  out.change_high = percentile(ratios, 0.975);

  // The prediction: what each rule saves per step given how its calls were exposed (stepSavingNs: a faster
  // transport saves at most the exposed time, a slower one costs what its hidden part cannot absorb).
  double saving = 0, saving_low = 0, saving_high = 0;
  bool predicted = false;
  for (const auto& [rule, count] : calls_without) {
    if (!rule->predicted || !rule->baseline || out.steps_without == 0) continue;
    double calls = 0, exposed = 0, transport = 0;
    for (const auto& entry : model.exposure)
      if (entry.api == rule->api && entry.dtype == rule->dtype && entry.bytes >= rule->min_bytes &&
          entry.bytes <= rule->max_bytes) {
        calls += static_cast<double>(entry.calls);
        exposed += entry.exposed_ns * static_cast<double>(entry.calls);
        transport += entry.transport_ns * static_cast<double>(entry.calls);
      }
    if (calls <= 0) continue;
    exposed /= calls;
    transport /= calls;
    const double per_step = static_cast<double>(count) / static_cast<double>(out.steps_without * ranks);
    const auto capped = [&](double faster) {
      return per_step * storage::stepSavingNs(faster, transport, exposed);
    };
    saving += capped(rule->baseline->median_ns - rule->predicted->median_ns);
    saving_low += capped(rule->baseline->low_ns - rule->predicted->high_ns);
    saving_high += capped(rule->baseline->high_ns - rule->predicted->low_ns);
    predicted = true;
  }
  // A plan that says what it saves on the step (async rules change the step, not the call) is held to that.
  if (plan.step_saving) {
    saving = plan.step_saving->median_ns;
    saving_low = plan.step_saving->low_ns;
    saving_high = plan.step_saving->high_ns;
    predicted = true;
  }
  if (predicted && without_sum > 0) {
    const double step = without_sum / static_cast<double>(out.steps_without);
    out.predicted_change = -saving / step;
    out.predicted_low = -saving_high / step;
    out.predicted_high = -saving_low / step;
  }
  return out;
}

std::string describe(const Validation& v) {
  const auto pct = [](double x) { return fmt::format("{:+.2f}%", 100 * x); };
  std::string text = fmt::format(
      "step time with the plan {} [{}, {}] against without ({} windows with it, {} without, of {} {}; {} and "
      "{} "
      "steps)",
      pct(v.change), pct(v.change_low), pct(v.change_high), v.windows_with, v.windows_without, v.window_calls,
      v.window_steps ? "steps" : "calls a communicator", v.steps_with, v.steps_without);
  if (!v.predicted_change) return text + "; no prediction (the plan's rules carry no times)";
  const bool inside = v.change >= *v.predicted_low && v.change <= *v.predicted_high;
  const bool overlap = v.change_high >= *v.predicted_low && v.change_low <= *v.predicted_high;
  const bool cannot_tell = *v.predicted_change >= v.change_low && *v.predicted_change <= v.change_high;
  return text +
         fmt::format(
             "; predicted {} [{}, {}]: {}", pct(*v.predicted_change), pct(*v.predicted_low),
             pct(*v.predicted_high),
             inside ? "the measurement is inside the prediction's interval"
             : cannot_tell
                 ? "the prediction is inside the measurement's interval (the run cannot tell them apart)"
             : overlap ? "the measurement is outside the prediction's interval, their intervals overlap"
                       : "the measurement and the prediction disagree");
}

std::string validationJson(const Validation& v) {
  nlohmann::json json = {{"window_calls", v.window_calls},       {"window_steps", v.window_steps},
                         {"steps_with", v.steps_with},           {"steps_without", v.steps_without},
                         {"steps_left_out", v.steps_left_out},   {"windows_with", v.windows_with},
                         {"windows_without", v.windows_without}, {"step_with_ns", v.step_with_ns},
                         {"step_without_ns", v.step_without_ns}, {"change", v.change},
                         {"change_low", v.change_low},           {"change_high", v.change_high}};
  if (v.predicted_change)
    json["predicted"] = {
        {"change", *v.predicted_change}, {"low", *v.predicted_low}, {"high", *v.predicted_high}};
  return json.dump();
}

std::optional<Validation> parseValidation(const std::string& json_text) {
  const auto json = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("change") || !json["change"].is_number()) return std::nullopt;
  Validation v;
  try {
    v.window_calls = json.value("window_calls", std::int64_t{0});
    v.window_steps = json.value("window_steps", false);
    v.steps_with = json.value("steps_with", std::int64_t{0});
    v.steps_without = json.value("steps_without", std::int64_t{0});
    v.steps_left_out = json.value("steps_left_out", std::int64_t{0});
    v.windows_with = json.value("windows_with", 0);
    v.windows_without = json.value("windows_without", 0);
    v.step_with_ns = json.value("step_with_ns", 0.0);
    v.step_without_ns = json.value("step_without_ns", 0.0);
    v.change = json.value("change", 0.0);
    v.change_low = json.value("change_low", 0.0);
    v.change_high = json.value("change_high", 0.0);
    if (const auto p = json.find("predicted"); p != json.end() && p->is_object()) {
      v.predicted_change = p->value("change", 0.0);
      v.predicted_low = p->value("low", 0.0);
      v.predicted_high = p->value("high", 0.0);
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return v;
}

std::optional<Validation> storedValidation(const storage::RunInfo& run) {
  const auto config = nlohmann::json::parse(run.config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("validation")) return std::nullopt;
  return parseValidation(config["validation"].dump());
}

}  // namespace gradscope::tuner
