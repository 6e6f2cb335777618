#include "core/synth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

SynthResult SynthOrDie(const std::string& dir, uint64_t seed,
                       std::vector<std::pair<std::string, std::string>> overrides = {}) {
  SynthOptions opt;
  opt.out_dir = dir;
  opt.seed = seed;
  opt.overrides = std::move(overrides);
  auto r = Synthesize(opt);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SynthResult{};
}

std::string Contents(const std::string& path) {
  auto s = io::ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

TEST(SynthTest, SameSeedSameBytesOtherSeedOtherBytes) {
  testing::TempDir a, b, c;
  SynthOrDie(a.path(), 11);
  SynthOrDie(b.path(), 11);
  SynthOrDie(c.path(), 12);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(a.path())) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(Contents(a / name), Contents(b / name)) << name;
    if (name.ends_with(".safetensors")) {
      EXPECT_NE(Contents(a / name), Contents(c / name)) << name;
    }
    ++files;
  }
  EXPECT_EQ(files, 14 + 4);  // shards, index, config, two tokenizer files
}

TEST(SynthTest, PresetsAreValidAndShapedAsDocumented) {
  for (const char* name : {"tiny", "demo", "bench"}) {
    auto c = SynthPresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto bench = SynthPresetConfig("bench");
  EXPECT_EQ(bench->expert_bytes(), 17547264);  // the real expert size
  EXPECT_EQ(bench->num_experts, 128);
  auto bad = SynthPresetConfig("huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown preset \"huge\""));
}

TEST(SynthTest, WrittenCheckpointOpensWithTheRequestedOverrides) {
  testing::TempDir dir;
  SynthOrDie(dir.path(), 3,
             {{"num_hidden_layers", "5"},
              {"full_attn_layers", "2,5"},
              {"num_experts", "64"},
              {"num_experts_per_token", "8"}});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelConfig& c = (*ckpt)->config();
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.attention_kind(1), AttentionKind::kMla);
  EXPECT_EQ(c.attention_kind(4), AttentionKind::kMla);
  // The release layout: nested config with quantization_config, index, adjacent experts.
  nlohmann::json config = nlohmann::json::parse(Contents(dir / "config.json"));
  EXPECT_TRUE(config.contains("text_config"));
  EXPECT_EQ(config["quantization_config"]["format"], "mxfp4-pack-quantized");
  for (int64_t l = 1; l < 5; ++l) {
    for (int64_t e = 0; e < 64; ++e) ASSERT_TRUE((*ckpt)->expert(l, e).contiguous());
  }
}

TEST(SynthTest, InvalidOverrideIsRefusedBeforeWriting) {
  testing::TempDir dir;
  SynthOptions opt;
  opt.out_dir = dir / "model";
  opt.overrides = {{"num_experts_per_token", "99"}};
  auto r = Synthesize(opt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir / "model"));
}

TEST(SynthTest, ExpertScalesAreNeverNaN) {
  testing::TempDir dir;
  SynthOrDie(dir.path(), 5);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  std::set<uint8_t> codes;
  for (const TensorInfo& t : (*ckpt)->tensors()) {
    if (!t.name.ends_with("weight_scale")) continue;
    std::vector<uint8_t> bytes(t.byte_size);
    ASSERT_TRUE((*ckpt)->ReadTensor(t, bytes).ok());
    codes.insert(bytes.begin(), bytes.end());
  }
  EXPECT_EQ(codes.count(0xFF), 0u);
  EXPECT_GE(codes.size(), 2u);  // two exponents per matrix, as in the release
}

TEST(SynthTest, TokenizerFilesAreWellFormed) {
  testing::TempDir dir;
  SynthOptions opt;
  opt.preset = "demo";
  opt.out_dir = dir.path();
  opt.overrides = {{"num_hidden_layers", "2"}, {"full_attn_layers", "2"}};  // keep it small
  auto r = Synthesize(opt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::set<std::string> tokens;
  int64_t rank = 0;
  for (absl::string_view line :
       absl::StrSplit(Contents(dir / "tiktoken.model"), '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    ASSERT_EQ(parts.size(), 2u);
    std::string bytes;
    ASSERT_TRUE(absl::Base64Unescape(parts[0], &bytes));
    EXPECT_TRUE(tokens.insert(bytes).second) << "duplicate token at rank " << rank;
    EXPECT_EQ(parts[1], std::to_string(rank++));
  }
  EXPECT_EQ(rank, 4096 - 256);
  nlohmann::json tc = nlohmann::json::parse(Contents(dir / "tokenizer_config.json"));
  EXPECT_EQ(tc["added_tokens_decoder"].size(), 256u);
  EXPECT_EQ(tc["added_tokens_decoder"]["3842"]["content"], "<|end_of_msg|>");
  EXPECT_EQ(r->config.eos_token_id, 3842);
  EXPECT_EQ(r->config.bos_token_id, 3840);
}

TEST(SynthTest, ExistingFilesAreReplacedOnlyWhole) {
  testing::TempDir dir;
  SynthOrDie(dir.path(), 1);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_FALSE(entry.path().string().ends_with(".partial")) << entry.path();
    EXPECT_FALSE(entry.path().string().ends_with(".tmp")) << entry.path();
  }
}

}  // namespace
}  // namespace k3
