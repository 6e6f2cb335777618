// The flag table (apps/flags.cc): every flag of k3 is defined there and has a row naming the
// commands that take it, so that none is silently missing from a command's --help.
#include "apps/flags.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"

namespace k3::cli {
namespace {

// The flags Abseil registered from the project's own sources (not Abseil's or GoogleTest's).
std::set<std::string> ProjectFlags() {
  std::set<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string file = flag->Filename();
    if (absl::StrContains(file, "apps/") || absl::StrContains(file, "pipeline/") ||
        absl::StrContains(file, "core/") || absl::StrContains(file, "io/")) {
      names.insert(std::string(name));
      EXPECT_TRUE(absl::EndsWith(file, "apps/flags.cc"))
          << "--" << name << " is defined in " << file << ", not with the others";
    }
  }
  return names;
}

TEST(FlagTableTest, EveryFlagHasARowThatNamesACommand) {
  const std::set<std::string> flags = ProjectFlags();
  ASSERT_GT(flags.size(), 50u);
  std::set<std::string> rows;
  for (const FlagUse& use : FlagTable()) {
    EXPECT_NE(use.commands, 0u) << "--" << TypedName(*use.flag) << " is taken by no command";
    EXPECT_TRUE(rows.insert(std::string(use.flag->Name())).second) << "two rows for --" << use.flag->Name();
  }
  EXPECT_EQ(rows, flags);
}

TEST(FlagTableTest, FindsAFlagByItsTypedNameOrItsAlias) {
  ASSERT_NE(FindFlag("n-predict"), nullptr);
  EXPECT_EQ(FindFlag("n-predict")->flag->Name(), "n_predict");
  EXPECT_EQ(FindFlag("n_predict"), nullptr);  // typed with dashes only
  ASSERT_NE(FindFlag("out-json"), nullptr);   // CLI.md's spelling for bench and cache-sim
  EXPECT_EQ(FindFlag("out-json"), FindFlag("report-json"));
  EXPECT_EQ(FindFlag("no-such-flag"), nullptr);
  EXPECT_NE(FindFlag("model")->commands & kGenerate, 0u);
  EXPECT_EQ(FindFlag("model")->commands & kSynth, 0u);  // synth writes --out
}

}  // namespace
}  // namespace k3::cli
