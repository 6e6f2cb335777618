// The flag table (apps/options/flags.cc): every flag of k3 is defined there and has a row naming
// the commands that take it, so that none is silently missing from a command's --help.
#include "apps/options/flags.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "apps/options/engine_flags.h"
#include "pipeline/engine.h"
#include "tests/util/run_k3.h"

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
      EXPECT_TRUE(absl::EndsWith(file, "apps/options/flags.cc"))
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
    EXPECT_TRUE(rows.insert(std::string(use.flag->Name())).second)
        << "two rows for --" << use.flag->Name();
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

// The default each engine flag shows in `k3 generate --help`, as "(default: X)" at the end of its
// line; "" when it shows none.
std::string HelpDefault(const std::string& help, const std::string& flag) {
  const size_t at = help.find("\n  --" + flag + " ");
  if (at == std::string::npos) return "<no line for --" + flag + ">";
  const std::string line = help.substr(at + 1, help.find('\n', at + 1) - at - 1);
  const size_t open = line.rfind(" (default: ");
  if (open == std::string::npos || line.back() != ')') return "";
  return line.substr(open + 11, line.size() - open - 12);
}

// EngineOptions is the one place the engine's defaults are written: every engine flag's --help
// default, and what a run takes when no flag is given, are its.
TEST(EngineFlagsTest, EveryEngineFlagsHelpDefaultIsEngineOptions) {
  const testing::K3Result r = testing::RunK3({"generate", "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const EngineOptions d;
  const auto auto_or = [](int64_t n) { return n == 0 ? std::string("auto") : absl::StrCat(n); };
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ram-gb", absl::StrCat(d.memory.ram_gb)},
      {"trunk-gb", absl::StrCat(d.memory.trunk_gb)},
      {"cache-gb", absl::StrCat(d.memory.cache_gb)},
      {"trunk", d.trunk_dir},
      {"max-context", auto_or(d.max_context)},
      {"queue-depth", absl::StrCat(d.queue_depth)},
      {"storage-profile", d.storage_profile.name},
      {"prefetch-distance", absl::StrCat(d.prefetch_distance)},
      {"prefetch-width", absl::StrCat(d.prefetch_width)},
      {"prefill-prefetch-distance", absl::StrCat(d.prefill_prefetch_distance)},
      {"threads", absl::StrCat(d.threads)},
      {"prefill-chunk", auto_or(d.prefill_chunk)},
      {"ring-piece-mb", absl::StrCat(d.ring_piece_bytes >> 20)},
      {"ring-slots", absl::StrCat(d.ring_slots)},
      {"cache-policy", d.cache_policy},
  };
  for (const auto& [flag, want] : expected) {
    EXPECT_EQ(HelpDefault(r.out, flag), want) << "--" << flag;
  }
  // The lists the sweeps take have no default of their own: a single run takes EngineOptions'.
  EXPECT_EQ(EngineListFlagDefault("queue-depth"), absl::StrCat(d.queue_depth));
  EXPECT_EQ(EngineListFlagDefault("n-predict"), "");
  // And a run given no flag takes exactly these (the model directory aside).
  auto given = BaseEngineOptionsFromFlags();
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->max_context, d.max_context);
  EXPECT_EQ(given->prefill_chunk, d.prefill_chunk);
  EXPECT_EQ(given->queue_depth, d.queue_depth);
  EXPECT_EQ(given->prefetch_distance, d.prefetch_distance);
  EXPECT_EQ(given->prefill_prefetch_distance, d.prefill_prefetch_distance);
  EXPECT_EQ(given->prefetch_width, d.prefetch_width);
  EXPECT_EQ(given->threads, d.threads);
  EXPECT_EQ(given->ring_piece_bytes, d.ring_piece_bytes);
  EXPECT_EQ(given->ring_slots, d.ring_slots);
  EXPECT_EQ(given->cache_policy, d.cache_policy);
  EXPECT_EQ(given->storage_profile.name, d.storage_profile.name);
  EXPECT_EQ(given->storage_profile.Describe(), d.storage_profile.Describe());
  EXPECT_TRUE(given->volumes.empty());
  EXPECT_EQ(given->overlap, d.overlap);
}

}  // namespace
}  // namespace k3::cli
