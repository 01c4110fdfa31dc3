// Keeps docs/schema.md true: every table of the schema is described there, and nothing else is.

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "gradscope/storage/schema.h"

namespace {

TEST(Docs, SchemaPageListsEveryTable) {
  std::ifstream file(GRADSCOPE_SOURCE_DIR "/docs/schema.md");
  ASSERT_TRUE(file) << "docs/schema.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  // Table rows of the overview: | `name` | one row per ... |
  const std::regex row(R"(^\| `([a-z_]+)` \|)");
  std::set<std::string> documented;
  std::string line;
  while (std::getline(text, line)) {
    std::smatch match;
    if (std::regex_search(line, match, row)) documented.insert(match[1]);
  }
  std::set<std::string> tables;
  for (std::string_view table : gradscope::storage::tableNames()) tables.emplace(table);
  EXPECT_EQ(documented, tables);
  EXPECT_NE(text.str().find("currently **" + std::to_string(gradscope::storage::kSchemaVersion) + "**"),
            std::string::npos)
      << "docs/schema.md names another schema version than kSchemaVersion";
}

}  // namespace
