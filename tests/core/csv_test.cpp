// Reading CSV records back (measured runs): RFC 4180 quoting and the column of every cell.
#include "core/csv.hpp"

#include <gtest/gtest.h>

namespace ptdp {

TEST(CsvSplit, QuotedCommasDoubledQuotesAndColumns) {
  std::vector<CsvCell> cells;
  ASSERT_TRUE(csv_split("a.yaml, \"x=1;y=\"\"2,3\"\"\" ,42\r", cells));
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_EQ(cells[0].text, "a.yaml");
  EXPECT_EQ(cells[1].text, "x=1;y=\"2,3\"");
  EXPECT_EQ(cells[2].text, "42");
  EXPECT_EQ(cells[0].column, 1);
  EXPECT_EQ(cells[1].column, 8);
  EXPECT_EQ(cells[2].column, 26);
  // A record written by csv_record reads back the same.
  ASSERT_TRUE(csv_split(csv_record({"p,q", "say \"hi\"", ""}).substr(0, csv_record({"p,q", "say \"hi\"", ""}).size() - 1), cells));
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_EQ(cells[0].text, "p,q");
  EXPECT_EQ(cells[1].text, "say \"hi\"");
  EXPECT_EQ(cells[2].text, "");
  EXPECT_FALSE(csv_split("\"open", cells));
}

}  // namespace ptdp
