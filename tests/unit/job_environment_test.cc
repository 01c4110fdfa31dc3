// The job's environment, declared once (gradscope/common/job_environment.def): docs/agent.md lists every
// variable, no source of the agent, the CLI, common, methods or the plugins spells a GRADSCOPE_ name as a
// string of its own, the agent reads exactly its rows and `gradscope run` sets only rows.

#include "gradscope/common/job_environment.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "gradscope/cli/run.h"
#include "gradscope/common/launcher.h"
#include "test_util.h"

namespace gradscope {
namespace {

namespace fs = std::filesystem;

TEST(JobEnvironment, AgentPageListsEveryVariableAndMarksTheInternalOnes) {
  const std::string page = test::readFile(GRADSCOPE_SOURCE_DIR "/docs/agent.md");
  const std::string heading = "## Contract between `gradscope run` and the agent";
  const std::size_t begin = page.find(heading);
  ASSERT_NE(begin, std::string::npos) << "docs/agent.md has no section '" << heading << "'";
  const std::size_t end = page.find("\n## ", begin + heading.size());
  std::istringstream section(page.substr(begin, end - begin));
  // Table rows: | `NAME` | meaning | default |
  const std::regex row(R"(^\| `([A-Za-z0-9_]+)` \|(.*)$)");
  std::map<std::string, std::string> documented;
  std::string line;
  while (std::getline(section, line)) {
    std::smatch match;
    if (std::regex_search(line, match, row)) documented.emplace(match[1], match[2]);
  }
  std::set<std::string> declared;
  for (const env::Variable& variable : env::kVariables) {
    declared.emplace(variable.name);
    const auto it = documented.find(std::string(variable.name));
    if (it == documented.end()) continue;  // reported by the comparison below
    const bool says_internal = it->second.find("*internal*") != std::string::npos;
    EXPECT_EQ(says_internal, variable.audience == env::Audience::Internal)
        << variable.name << ": the table and docs/agent.md disagree on whether it is internal";
  }
  std::set<std::string> names;
  for (const auto& [name, text] : documented) names.insert(name);
  EXPECT_EQ(names, declared) << "docs/agent.md's contract table and job_environment.def list other variables";
}

TEST(JobEnvironment, NoSourceSpellsAGradscopeVariableOutsideTheTable) {
  const std::regex literal("\"GRADSCOPE_[A-Z]");
  std::vector<std::string> found;
  for (const char* part : {"agent", "cli", "comm", "common", "methods", "plugins"}) {
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(GRADSCOPE_SOURCE_DIR) / part)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || entry.path().filename() == "job_environment.def") continue;
      // A benchmark program's own variables (where to put its files) are not the job's.
      if (entry.path().stem().string().ends_with("_bench")) continue;
      if (extension != ".cc" && extension != ".h" && extension != ".cu" && extension != ".def" &&
          extension != ".in")
        continue;
      std::istringstream text(test::readFile(entry.path().string()));
      std::string line;
      for (int number = 1; std::getline(text, line); ++number)
        if (std::regex_search(line, literal))
          found.push_back(fs::relative(entry.path(), GRADSCOPE_SOURCE_DIR).string() + ":" +
                          std::to_string(number) + ": " + line);
    }
  }
  EXPECT_TRUE(found.empty()) << "use gradscope::env::k<Name> (job_environment.h) instead:\n"
                             << [&] {
                                  std::string all;
                                  for (const std::string& place : found) all += place + "\n";
                                  return all;
                                }();
}

TEST(JobEnvironment, NamesAreUniqueAndOursCarryThePrefix) {
  std::set<std::string_view> names;
  for (const env::Variable& variable : env::kVariables) {
    EXPECT_TRUE(names.insert(variable.name).second) << variable.name << " is declared twice";
    EXPECT_EQ(variable.name.starts_with(env::kPrefix), variable.read_by != env::ReadBy::Foreign)
        << variable.name;
    EXPECT_EQ(env::findVariable(variable.name), &variable);
  }
  EXPECT_EQ(env::findVariable("GRADSCOPE_NO_SUCH_SETTING"), nullptr);
  EXPECT_EQ(std::string_view(env::kOutput), "GRADSCOPE_OUTPUT");
}

TEST(JobEnvironment, ModeNamesRoundTrip) {
  for (const Mode mode : kModes) EXPECT_EQ(parseMode(modeName(mode)), mode) << modeName(mode);
  EXPECT_EQ(modeName(Mode::Observe), "observe");
  EXPECT_EQ(modeName(Mode::Explore), "explore");
  EXPECT_EQ(modeName(Mode::Apply), "apply");
  EXPECT_FALSE(parseMode("Observe").has_value());
  EXPECT_FALSE(parseMode("").has_value());
  EXPECT_FALSE(parseMode("bench").has_value());
}

// The agent's configuration looks up every AgentConfig row and, besides them, only the run id and the
// launchers' own variables.
TEST(JobEnvironment, TheAgentReadsExactlyItsRows) {
  std::set<std::string> asked;
  const Environment recording = [&asked](const char* name) -> const char* {
    asked.insert(name);
    return nullptr;
  };
  std::vector<std::string> errors;
  agent::parseConfig(recording, errors);
  EXPECT_TRUE(errors.empty());
  std::set<std::string> ours, expected;
  for (const std::string& name : asked)
    if (name.starts_with(env::kPrefix)) ours.insert(name);
  for (const env::Variable& variable : env::kVariables)
    if (variable.read_by == env::ReadBy::AgentConfig || variable.read_by == env::ReadBy::Launcher)
      expected.emplace(variable.name);
  EXPECT_EQ(ours, expected);
}

// Whatever `gradscope run` puts into the job's environment is a row of the table, and it passes every
// row present on through a launcher.
TEST(JobEnvironment, GradscopeRunSetsAndForwardsOnlyRows) {
  for (const Mode mode : kModes) {
    cli::RunOptions options;
    options.mode = mode;
    options.recommendation = "/plans/plan.json";
    options.explore_budget = "5%";
    cli::Environment job =
        cli::jobEnvironment({{"HOME", "/root"}, {env::kStepNvtx, "step"}}, "/a/agent.so", "/out", "u", "x");
    cli::setModeEnvironment(job, options);
    cli::setNcclPluginEnvironment(job, {"/a/tuner.so", "/a/profiler.so"}, options);
    const std::vector<std::string> forwarded = cli::variablesToForward(job);
    for (const auto& [name, value] : job) {
      if (name == "HOME") continue;
      EXPECT_NE(env::findVariable(name), nullptr) << modeName(mode) << ": " << name << " is set but no row";
      EXPECT_NE(std::find(forwarded.begin(), forwarded.end(), name), forwarded.end())
          << modeName(mode) << ": " << name << " is not forwarded";
    }
    EXPECT_EQ(std::find(forwarded.begin(), forwarded.end(), "HOME"), forwarded.end());
    EXPECT_EQ(forwarded.front(), env::kLdPreload);
  }
}

}  // namespace
}  // namespace gradscope
