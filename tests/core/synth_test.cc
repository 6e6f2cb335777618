#include "core/synth/synth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint/checkpoint.h"
#include "core/text/tokenizer/tokenizer.h"
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
  for (const char* name : {"tiny", "demo", "bench", "slice", "full"}) {
    auto c = SynthPresetConfig(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto bench = SynthPresetConfig("bench");
  EXPECT_EQ(bench->expert_bytes(), 17547264);  // the real expert size
  EXPECT_EQ(bench->num_experts, 128);
  // Kimi K3's own text config (MODEL.md 1.2).
  auto full = SynthPresetConfig("full");
  EXPECT_EQ(full->hidden_size, 7168);
  EXPECT_EQ(full->num_layers, 93);
  EXPECT_EQ(full->vocab_size, 163840);
  EXPECT_EQ(full->kda_width(), 96 * 128);
  EXPECT_EQ(full->num_experts, 896);
  EXPECT_EQ(full->num_experts_per_token, 16);
  EXPECT_EQ(full->intermediate_size, 33792);
  EXPECT_EQ(full->expert_bytes(), 17547264);
  EXPECT_EQ(full->full_attn_layers.size(), 24u);
  EXPECT_EQ(full->full_attn_layers.back(), 93);
  EXPECT_EQ(full->attention_kind(91), AttentionKind::kMla);
  EXPECT_EQ(full->attention_kind(92), AttentionKind::kMla);
  EXPECT_EQ(full->attention_kind(0), AttentionKind::kKda);
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

TEST(SynthTest, ALogHasHeadDimEntriesAsReleasedWithZeroPadding) {
  testing::TempDir dir;
  SynthOrDie(dir.path(), 2);  // tiny: 4 KDA heads of 16
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const TensorInfo* a = (*ckpt)->Find("language_model.model.layers.0.self_attn.A_log");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{16}));
  auto values = (*ckpt)->ReadTensorAsFloat(*a);
  ASSERT_TRUE(values.ok());
  for (int i = 0; i < 4; ++i) EXPECT_GT((*values)[i], 0.0f) << i;  // log(1 + 15 u) > 0
  for (int i = 4; i < 16; ++i) EXPECT_EQ((*values)[i], 0.0f) << i;
}

TEST(SynthTest, IndexIsWhatAJsonLibraryWouldWrite) {
  testing::TempDir dir;
  SynthOrDie(dir.path(), 4);
  const std::string text = Contents(dir / "model.safetensors.index.json");
  const nlohmann::ordered_json index = nlohmann::ordered_json::parse(text);
  EXPECT_EQ(index.dump(2) + "\n", text);
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".safetensors")) continue;
    auto ckpt_file = io::RandomAccessFile::Open(entry.path().string());
    ASSERT_TRUE(ckpt_file.ok());
    uint8_t prefix[8];
    ASSERT_TRUE((*ckpt_file)->ReadAt(0, prefix).ok());
    total += (*ckpt_file)->size() - 8 - *ParseHeaderLength(prefix, (*ckpt_file)->size(), name);
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
}

// Apparent bytes and bytes on disk of every file in a directory.
std::pair<uint64_t, uint64_t> DiskUse(const std::string& dir) {
  uint64_t apparent = 0, allocated = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    struct stat st;
    EXPECT_EQ(::stat(entry.path().c_str(), &st), 0);
    apparent += static_cast<uint64_t>(st.st_size);
    allocated += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return {apparent, allocated};
}

// A preset written sparse: headers only, the data left as holes.
SynthOptions Sparse(const std::string& preset, const std::string& dir) {
  SynthOptions opt;
  opt.preset = preset;
  opt.out_dir = dir;
  opt.sparse = true;
  return opt;
}

// The full preset at real dimensions with fewer layers and experts: 4 layers (the last two
// MLA, as released), 32 experts, written sparse.
SynthOptions ReducedFull(const std::string& dir) {
  SynthOptions opt = Sparse("full", dir);
  opt.overrides = {{"num_hidden_layers", "4"}, {"full_attn_layers", "3,4"}, {"num_experts", "32"}};
  return opt;
}

TEST(SynthTest, SparseReducedFullSizeCheckpointOpensWithTheReleaseLayout) {
  testing::TempDir dir;
  auto r = Synthesize(ReducedFull(dir.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shards, 4 + 1 + 2);  // a shard per layer, the globals, two of vision
  EXPECT_EQ(r->other_tensors, 168);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.config().hidden_size, 7168);
  EXPECT_EQ(c.config().expert_bytes(), 17547264);
  EXPECT_EQ(c.tensors().size(), static_cast<size_t>(r->language_tensors + 168));
  EXPECT_EQ(r->language_tensors,
            static_cast<int64_t>(TrunkTensorSpecs(c.config(), c.names()).size()) + 3 * 32 * 6);
  ASSERT_EQ(c.shard_paths().size(), 7u);
  auto shard_of = [&](const std::string& name) {
    const TensorInfo* t = c.Find(name);
    EXPECT_NE(t, nullptr) << name;
    return t == nullptr ? std::string()
                        : std::filesystem::path(c.shard_paths()[t->shard]).filename().string();
  };
  EXPECT_EQ(shard_of("language_model.model.layers.0.mlp.gate_proj.weight"),
            "model-00001-of-000007.safetensors");
  EXPECT_EQ(shard_of(c.names().Expert(3, 31, 5)), "model-00004-of-000007.safetensors");
  EXPECT_EQ(shard_of("language_model.lm_head.weight"), "model-00005-of-000007.safetensors");
  EXPECT_EQ(shard_of("vision_tower.patch_embed.proj.weight"), "model-00006-of-000007.safetensors");
  EXPECT_EQ(shard_of("mm_projector.proj.2.weight"), "model-00007-of-000007.safetensors");
  EXPECT_EQ(c.Find("language_model.lm_head.weight")->shape, (std::vector<int64_t>{163840, 7168}));
  // Holes: a few MB of headers on disk for GBs of tensors, and the data reads as zeros.
  const auto [apparent, allocated] = DiskUse(dir.path());
  EXPECT_GT(apparent, 10ull << 30);
  EXPECT_LT(allocated, 64ull << 20);
  const ExpertLocation& e = c.expert(2, 7);
  ASSERT_TRUE(e.contiguous());
  std::vector<uint8_t> bytes(e.total_bytes, 0xAB);
  ASSERT_TRUE(c.ReadSpan(e.spans[0], bytes).ok());
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(bytes.size()));
}

TEST(SynthTest, SingleFileHoldsTheLanguageModelWithoutAnIndex) {
  testing::TempDir dir;
  SynthOptions opt = ReducedFull(dir.path());
  opt.single_file = true;
  auto r = Synthesize(opt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shards, 1);
  EXPECT_EQ(r->other_tensors, 0);  // no vision placeholders in the one-file layout
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->shard_paths().size(), 1u);
  EXPECT_EQ((*ckpt)->tensors().size(), static_cast<size_t>(r->language_tensors));
  // Writing the sharded layout over it removes the single file, which opening would ignore.
  opt.single_file = false;
  ASSERT_TRUE(Synthesize(opt).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
}

// Kimi K3's dimensions for every tensor in 6 layers of 128 experts, written sparse (no disk):
// the trunk and experts of the real model, only fewer of them.
TEST(SynthTest, SlicePresetHasTheRealDimensionsInSixLayers) {
  testing::TempDir dir;
  auto r = Synthesize(Sparse("slice", dir.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shards, 7);  // a shard per layer and the globals; no vision placeholders
  EXPECT_EQ(r->other_tensors, 0);
  EXPECT_EQ(r->weights, SynthWeights::kGaussian);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& ck = **ckpt;
  const ModelConfig& c = ck.config();
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.full_attn_layers, (std::vector<int64_t>{4, 6}));  // one-based, as in the config
  for (int64_t l = 0; l < 6; ++l) {
    EXPECT_EQ(c.attention_kind(l), l == 3 || l == 5 ? AttentionKind::kMla : AttentionKind::kKda)
        << l;
  }
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_token, 16);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.expert_bytes(), 17547264);
  EXPECT_EQ(c.kda_num_heads, 96);
  EXPECT_EQ(c.kda_head_dim, 128);
  EXPECT_EQ(c.num_attention_heads, 96);
  // The shapes on disk, as the release has them (MODEL.md section 3).
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"model.embed_tokens.weight", {163840, 7168}},
      {"lm_head.weight", {163840, 7168}},
      {"model.layers.0.mlp.gate_proj.weight", {33792, 7168}},
      {"model.layers.0.mlp.down_proj.weight", {7168, 33792}},
      {"model.layers.1.self_attn.q_proj.weight", {96 * 128, 7168}},
      {"model.layers.1.self_attn.A_log", {128}},
      {"model.layers.3.self_attn.q_a_proj.weight", {1536, 7168}},
      {"model.layers.3.self_attn.q_b_proj.weight", {96 * (128 + 64), 1536}},
      {"model.layers.3.self_attn.kv_a_proj_with_mqa.weight", {512 + 64, 7168}},
      {"model.layers.5.self_attn.kv_b_proj.weight", {96 * (128 + 128), 512}},
      {"model.layers.5.block_sparse_moe.gate.weight", {128, 7168}},
      {"model.layers.5.block_sparse_moe.shared_experts.gate_proj.weight", {2 * 3072, 7168}},
      {"model.layers.5.block_sparse_moe.routed_expert_down_proj.weight", {3584, 7168}},
      {"model.layers.5.block_sparse_moe.experts.127.w2.weight_packed", {3584, 1536}},
  };
  for (const auto& [name, shape] : shapes) {
    const TensorInfo* t = ck.Find("language_model." + name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
  }
  EXPECT_EQ(ck.Find("language_model.model.layers.6.input_layernorm.weight"), nullptr);
  for (int64_t l = 1; l < 6; ++l) {
    for (int64_t e = 0; e < 128; ++e) ASSERT_TRUE(ck.expert(l, e).contiguous()) << l << "/" << e;
  }
  // 23.7 GB of tensors: 11,230,248,960 bytes of experts (5 x 128 x 17,547,264), the rest trunk.
  EXPECT_EQ(r->bytes_written, 23705964032ull);
  EXPECT_EQ(HistogramTotal(r->bf16_exponents), 0u);  // nothing written, nothing counted
  const auto [apparent, allocated] = DiskUse(dir.path());
  EXPECT_GT(apparent, r->bytes_written);
  EXPECT_LT(allocated, 64ull << 20);
}

// Gaussian weights on a small preset, drawn by the same code as the slice's: the exponent field
// has a trained model's entropy (uniform values have less), the RMS stays the uniform draw's,
// the counts are those of the bytes on disk, and the same seed gives the same bytes.
TEST(SynthTest, GaussianWeightsHaveATrainedModelsExponentEntropy) {
  testing::TempDir gauss, again, uniform;
  SynthOptions opt;
  opt.preset = "tiny";
  opt.weights = SynthWeights::kGaussian;
  opt.out_dir = gauss.path();
  auto g = Synthesize(opt);
  opt.out_dir = again.path();
  auto g2 = Synthesize(opt);
  opt.out_dir = uniform.path();
  opt.weights = SynthWeights::kPresetDefault;  // uniform for tiny
  auto u = Synthesize(opt);
  ASSERT_TRUE(g.ok() && g2.ok() && u.ok());
  EXPECT_EQ(g->weights, SynthWeights::kGaussian);
  EXPECT_EQ(u->weights, SynthWeights::kUniform);
  // Per tensor ~2.54 bits for a normal distribution; ~2.6 published over trained models.
  EXPECT_GT(g->bf16_tensor_entropy_bits, 2.45);
  EXPECT_LT(g->bf16_tensor_entropy_bits, 2.65);
  EXPECT_GT(EntropyBits(g->bf16_exponents), 2.3);
  EXPECT_LT(EntropyBits(g->bf16_exponents), 3.0);
  EXPECT_LT(u->bf16_tensor_entropy_bits, 2.35);  // uniform: ~2.0-2.3 depending on the scale
  auto gc = Checkpoint::Open(gauss.path());
  auto uc = Checkpoint::Open(uniform.path());
  ASSERT_TRUE(gc.ok() && uc.ok());
  ExponentHistogram on_disk{};
  for (const TensorInfo& t : (*gc)->tensors()) {
    if (t.dtype != DType::kBF16) continue;
    std::vector<uint8_t> bytes(t.byte_size);
    ASSERT_TRUE((*gc)->ReadTensor(t, bytes).ok());
    CountBf16Exponents(bytes, on_disk);
  }
  EXPECT_EQ(on_disk, g->bf16_exponents);
  auto rms = [](const Checkpoint& c, const std::string& name) {
    auto v = c.ReadTensorAsFloat(*c.Find(name));
    EXPECT_TRUE(v.ok());
    double sum = 0;
    for (float x : *v) sum += static_cast<double>(x) * x;
    return std::sqrt(sum / static_cast<double>(v->size()));
  };
  const std::string q = "language_model.model.layers.1.self_attn.q_proj.weight";
  EXPECT_NEAR(rms(**gc, q), rms(**uc, q), 0.05 * rms(**uc, q));  // 8,192 values: ~1% noise each
  for (const auto& entry : std::filesystem::directory_iterator(gauss.path())) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(Contents(gauss / name), Contents(again / name)) << name;
  }
}

// The whole release layout, written sparse (~3 s and ~140 MB of disk): the tensor counts and
// byte totals that MODEL.md section 3.1 gives for the release.
TEST(SynthTest, FullPresetHasTheReleaseTensorCountsAndSizes) {
  testing::TempDir dir;
  auto r = Synthesize(Sparse("full", dir.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shards, 96);
  EXPECT_EQ(r->language_tensors, 497052);
  EXPECT_EQ(r->other_tensors, 168);
  EXPECT_EQ(r->config.bos_token_id, 163584);
  EXPECT_EQ(r->config.eos_token_id, 163586);
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00096-of-000096.safetensors"));
  nlohmann::json config = nlohmann::json::parse(Contents(dir / "config.json"));
  EXPECT_EQ(config["pad_token_id"], 163839);
  EXPECT_EQ(config["text_config"]["linear_attn_config"]["num_heads"], 96);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensors().size(), 497220u);
  const auto [apparent, allocated] = DiskUse(dir.path());
  EXPECT_LT(allocated, 512ull << 20);
  // 1,560,860,324,864 bytes of tensors (metadata.total_size) plus 96 headers.
  EXPECT_GT((*ckpt)->total_bytes(), 1560860324864ull);
  EXPECT_LT((*ckpt)->total_bytes(), 1560860324864ull + (100ull << 20));
  EXPECT_GT(apparent, (*ckpt)->total_bytes());  // plus the index, config and tokenizer
  // The index as large as the release's (59,764,096 bytes) and its total_size exactly.
  const uint64_t index_bytes = std::filesystem::file_size(dir / "model.safetensors.index.json");
  EXPECT_NEAR(static_cast<double>(index_bytes), 59764096.0, 1e5);
  auto index = io::ReadFileToString(dir / "model.safetensors.index.json");
  ASSERT_TRUE(index.ok());
  EXPECT_THAT(index->substr(0, 100), HasSubstr("\"total_size\": 1560860324864\n"));

  // The tokenizer at the release's vocabulary size, specials where K3 has them.
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 163840);
  EXPECT_EQ(tok->num_base_tokens(), 163584);
  EXPECT_EQ(tok->Encode("[BOS]<|end_of_msg|>", true), (std::vector<TokenId>{163584, 163586}));
  EXPECT_EQ(tok->SpecialTokenId("[PAD]"), 163839);
  EXPECT_EQ(tok->SpecialTokenId("<|media_pad|>"), 163605);
  auto text = tok->Decode(std::vector<TokenId>{163700});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|reserved_token_163700|>");
  const std::string prose = "The capital of France is Paris, and 1234 {x: y}.";
  auto round = tok->Decode(tok->Encode(prose, false));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(*round, prose);
}

}  // namespace
}  // namespace k3
