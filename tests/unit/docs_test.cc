// Keeps docs/schema.md true: every table of the schema is described there, and nothing else is; and
// docs/deploy.md: every export format of `gradscope recommend --format` has its row there.

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "gradscope/storage/schema.h"
#include "gradscope/tuner/exporters.h"
#include "test_util.h"

namespace {

TEST(Docs, SchemaPageListsEveryTable) {
  std::ifstream file(GRADSCOPE_SOURCE_DIR "/docs/schema.md");
  ASSERT_TRUE(file) << "docs/schema.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  // Table rows of the overview: | `name` | one row per ... |
  const std::set<std::string> documented = gradscope::test::documentedNames(text.str());
  std::set<std::string> tables;
  for (std::string_view table : gradscope::storage::tableNames()) tables.emplace(table);
  EXPECT_EQ(documented, tables);
  EXPECT_NE(text.str().find("currently **" + std::to_string(gradscope::storage::kSchemaVersion) + "**"),
            std::string::npos)
      << "docs/schema.md names another schema version than kSchemaVersion";
}

TEST(Docs, DeployPageListsEveryFormat) {
  std::ifstream file(GRADSCOPE_SOURCE_DIR "/docs/deploy.md");
  ASSERT_TRUE(file) << "docs/deploy.md is missing";
  // Rows of its overview table: | `nccl-tuner` | who reads it | ...
  const std::regex row(R"(^\| `([a-z-]+)` \|)");
  std::set<std::string> documented, formats;
  for (std::string line; std::getline(file, line);) {
    std::smatch match;
    if (std::regex_search(line, match, row)) documented.insert(match[1]);
  }
  for (const auto format : gradscope::tuner::kFormats) formats.emplace(gradscope::tuner::name(format));
  EXPECT_EQ(documented, formats);
}

}  // namespace
