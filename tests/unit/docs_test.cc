// Keeps docs/schema.md true: every table of the schema is described there, and nothing else is.

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "gradscope/storage/schema.h"
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

}  // namespace
