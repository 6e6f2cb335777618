#include "apps/reports/tables.h"

#include <gtest/gtest.h>

namespace k3::cli {
namespace {

TEST(MarkdownTableTest, HeaderRuleAndRows) {
  MarkdownTable table({"policy", "8 GB", "note"}, {false, true});
  table.AddRow({"lru", "36.24 %", ""});
  table.AddRow({"a|b", "1.00 %", "x"});
  EXPECT_EQ(table.text(),
            "| policy | 8 GB | note |\n"
            "|---|---:|---|\n"
            "| lru | 36.24 % |  |\n"
            "| a\\|b | 1.00 % | x |\n");
}

TEST(CsvTableTest, HeaderAndRowsWithQuotedText) {
  CsvTable csv({"volume", "profile", "gbps"});
  csv.AddRow({CsvTable::Text("/models/a,b"), CsvTable::Text("say \"hi\""), "1.2500"});
  csv.AddRow({CsvTable::Text(""), CsvTable::Text("direct"), ""});
  EXPECT_EQ(csv.text(),
            "volume,profile,gbps\n"
            "\"/models/a,b\",\"say \"\"hi\"\"\",1.2500\n"
            "\"\",\"direct\",\n");
}

}  // namespace
}  // namespace k3::cli
