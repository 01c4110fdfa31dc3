#pragma once

// The environment of a profiled job: the contract between `gradscope run`, the agent and the other parts
// that read GRADSCOPE_* variables. The variables are declared once, in job_environment.def; everything
// here is generated from it. A name is always written as its constant (env::kOutput), never as a string.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace gradscope {

// The agent's mode (GRADSCOPE_MODE, `gradscope run --mode`); runs.mode stores its name.
enum class Mode : std::uint8_t { Observe, Explore, Apply };
inline constexpr std::array<Mode, 3> kModes = {Mode::Observe, Mode::Explore, Mode::Apply};
std::string_view modeName(Mode mode);                  // "observe", "explore", "apply"
std::optional<Mode> parseMode(std::string_view text);  // exactly those names; nullopt otherwise

namespace env {

// Columns of job_environment.def; the file says what each value means.
enum class ReadBy : std::uint8_t { AgentConfig, Agent, Launcher, Methods, TunerPlugin, Run, Foreign };
enum class Audience : std::uint8_t { Setting, Internal };

// Every gradscope variable starts with this; `gradscope run` passes all of them on through a launcher,
// those it does not know included (a newer agent's).
inline constexpr std::string_view kPrefix = "GRADSCOPE_";

#define GS_JOB_ENV(ID, NAME, READ_BY, AUDIENCE) inline constexpr char k##ID[] = NAME;
#include "gradscope/common/job_environment.def"
#undef GS_JOB_ENV

struct Variable {
  std::string_view name;
  ReadBy read_by;
  Audience audience;
};

inline constexpr Variable kVariables[] = {
#define GS_JOB_ENV(ID, NAME, READ_BY, AUDIENCE) {NAME, ReadBy::READ_BY, Audience::AUDIENCE},
#include "gradscope/common/job_environment.def"
#undef GS_JOB_ENV
};

// The row of `name`, or nullptr for a variable outside the contract.
const Variable* findVariable(std::string_view name);

}  // namespace env
}  // namespace gradscope
