#include "gradscope/common/job_environment.h"

namespace gradscope {

std::string_view modeName(Mode mode) {
  switch (mode) {
    case Mode::Explore: return "explore";
    case Mode::Apply: return "apply";
    case Mode::Observe: break;
  }
  return "observe";
}

std::optional<Mode> parseMode(std::string_view text) {
  for (const Mode mode : kModes)
    if (text == modeName(mode)) return mode;
  return std::nullopt;
}

namespace env {

const Variable* findVariable(std::string_view name) {
  for (const Variable& variable : kVariables)
    if (variable.name == name) return &variable;
  return nullptr;
}

}  // namespace env
}  // namespace gradscope
