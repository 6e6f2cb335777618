#include "core/checkpoint/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The released Kimi K3 config.json as MODEL.md section 1 describes it.
json ReleaseConfig() {
  json full = json::array(), kda = json::array();
  for (int l = 1; l <= 93; ++l) {
    if ((l % 4 == 0 && l <= 92) || l == 93) {
      full.push_back(l);
    } else {
      kda.push_back(l);
    }
  }
  return {
      {"architectures", {"KimiK3ForConditionalGeneration"}},
      {"model_type", "kimi_k3"},
      {"bos_token_id", 163584},
      {"eos_token_id", 163586},
      {"pad_token_id", 163839},
      {"tie_word_embeddings", false},
      {"text_config",
       {{"hidden_size", 7168},
        {"num_hidden_layers", 93},
        {"vocab_size", 163840},
        {"rms_norm_eps", 1e-5},
        {"hidden_act", "situ"},
        {"activation_situ_beta", 4.0},
        {"activation_situ_linear_beta", 25.0},
        {"first_k_dense_replace", 1},
        {"intermediate_size", 33792},
        {"moe_layer_freq", 1},
        {"num_attention_heads", 96},
        {"num_key_value_heads", 96},
        {"q_lora_rank", 1536},
        {"kv_lora_rank", 512},
        {"qk_nope_head_dim", 128},
        {"qk_rope_head_dim", 64},
        {"v_head_dim", 128},
        {"mla_use_nope", true},
        {"mla_use_output_gate", true},
        {"linear_attn_config",
         {{"num_heads", 96},
          {"head_dim", 128},
          {"short_conv_kernel_size", 4},
          {"gate_lower_bound", -5.0},
          {"use_full_rank_gate", true},
          {"full_attn_layers", full},
          {"kda_layers", kda}}},
        {"num_experts", 896},
        {"num_experts_per_token", 16},
        {"num_shared_experts", 2},
        {"moe_intermediate_size", 3072},
        {"routed_expert_hidden_size", 3584},
        {"latent_moe_use_norm", true},
        {"moe_router_activation_func", "sigmoid"},
        {"moe_renormalize", true},
        {"routed_scaling_factor", 1.0},
        {"use_grouped_topk", true},
        {"topk_method", "noaux_tc"},
        {"num_expert_group", 1},
        {"topk_group", 1},
        {"attn_res_block_size", 12},
        {"max_position_embeddings", 1048576},
        {"num_nextn_predict_layers", 0},
        {"top_k", 50}}},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"},
        {"format", "mxfp4-pack-quantized"},
        {"config_groups",
         {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", 32}, {"type", "float"}}}}}}}}}};
}

json FixtureFlatConfig() {
  auto text = io::ReadFileToString(testing::SharedDir() + "/fixtures/reference-tiny/config.json");
  EXPECT_TRUE(text.ok()) << text.status();
  return json::parse(*text);
}

TEST(ConfigTest, ReleaseFormGivesTheLayerMapOfTheSpec) {
  auto c = ParseModelConfig(ReleaseConfig(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->num_experts_per_token, 16);  // not top_k = 50, the sampling default
  EXPECT_EQ(c->kda_num_heads, 96);
  EXPECT_EQ(c->situ_linear_beta, 25.0);
  EXPECT_EQ(c->bos_token_id, 163584);
  EXPECT_EQ(c->eos_token_id, 163586);
  std::vector<int64_t> mla;
  for (int64_t l = 0; l < c->num_layers; ++l) {
    if (c->attention_kind(l) == AttentionKind::kMla) mla.push_back(l);
  }
  // MODEL.md 1.4: zero-based MLA layers 3, 7, ..., 87, 91, 92.
  ASSERT_EQ(mla.size(), 24u);
  EXPECT_EQ(mla.front(), 3);
  EXPECT_EQ(mla[21], 87);
  EXPECT_EQ(mla[22], 91);
  EXPECT_EQ(mla[23], 92);
  EXPECT_TRUE(c->is_dense(0));
  EXPECT_FALSE(c->is_dense(1));
  EXPECT_TRUE(c->is_block_boundary(84));
  EXPECT_EQ(c->expert_bytes(), 17547264);
}

TEST(ConfigTest, FlatFormOfTheFixtureParses) {
  auto c = ParseModelConfig(FixtureFlatConfig(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 13);
  EXPECT_EQ(c->kda_head_dim, 16);
  EXPECT_EQ(c->attn_res_block_size, 3);
  EXPECT_EQ(c->kda_layers.size(), 9u);  // derived: the complement of full_attn_layers
  EXPECT_EQ(c->attention_kind(3), AttentionKind::kMla);
  EXPECT_EQ(c->attention_kind(12), AttentionKind::kMla);
  EXPECT_EQ(c->attention_kind(0), AttentionKind::kKda);
}

TEST(ConfigTest, ReleaseJsonRoundTrips) {
  auto c = ParseModelConfig(FixtureFlatConfig(), "config.json");
  ASSERT_TRUE(c.ok());
  auto again = ParseModelConfig(ToReleaseConfigJson(*c), "written");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ToFlatConfigJson(*again), ToFlatConfigJson(*c));
  EXPECT_EQ(again->Fingerprint(), c->Fingerprint());
}

TEST(ConfigTest, FingerprintChangesWithTheArithmetic) {
  auto c = ParseModelConfig(FixtureFlatConfig(), "config.json");
  ASSERT_TRUE(c.ok());
  auto other = ApplyConfigOverrides(*c, {{"rms_norm_eps", "1e-6"}});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->Fingerprint(), c->Fingerprint());
}

struct InvalidCase {
  const char* name;
  bool release;  // mutate the release form (else the flat fixture form)
  std::function<void(json&)> mutate;
  std::vector<std::string> expected;  // substrings of the message
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, IsRefusedForTheRightReason) {
  const InvalidCase& c = GetParam();
  json j = c.release ? ReleaseConfig() : FixtureFlatConfig();
  c.mutate(j);
  auto parsed = ParseModelConfig(j, "bad/config.json");
  ASSERT_FALSE(parsed.ok()) << c.name;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("bad/config.json"));
  for (const std::string& e : c.expected) EXPECT_THAT(message, HasSubstr(e)) << c.name;
}

json& Text(json& j) { return j["text_config"]; }
json& Linear(json& j) { return j["text_config"]["linear_attn_config"]; }

const InvalidCase kInvalid[] = {
    {"missing_hidden_size",
     true,
     [](json& j) { Text(j).erase("hidden_size"); },
     {"text_config.hidden_size: missing"}},
    {"missing_flat_kda_heads",
     false,
     [](json& j) { j.erase("kda_num_heads"); },
     {"kda_num_heads: missing"}},
    {"zero_layers",
     false,
     [](json& j) { j["num_hidden_layers"] = 0; },
     {"num_hidden_layers: must be positive"}},
    {"negative_vocab",
     true,
     [](json& j) { Text(j)["vocab_size"] = -5; },
     {"text_config.vocab_size: must be positive, found -5"}},
    {"topk_exceeds_experts",
     false,
     [](json& j) { j["num_experts_per_token"] = 9; },
     {"num_experts_per_token: 9 exceeds num_experts (8)"}},
    {"latent_not_multiple_of_32",
     false,
     [](json& j) { j["routed_expert_hidden_size"] = 80; },
     {"routed_expert_hidden_size: 80 is not a multiple of 32"}},
    {"expert_width_not_multiple_of_32",
     true,
     [](json& j) { Text(j)["moe_intermediate_size"] = 3000; },
     {"moe_intermediate_size: 3000 is not a multiple of 32"}},
    {"unknown_activation",
     true,
     [](json& j) { Text(j)["hidden_act"] = "gelu"; },
     {"unknown activation \"gelu\""}},
    {"layer_out_of_range",
     false,
     [](json& j) {
       j["full_attn_layers"] = {4, 8, 12, 14};
     },
     {"layer 14 is outside 1..13"}},
    {"layer_zero_based_by_mistake",
     false,
     [](json& j) {
       j["full_attn_layers"] = {0, 3, 7, 11};
     },
     {"layer 0 is outside 1..13 (the lists are one-based)"}},
    {"lists_overlap",
     true,
     [](json& j) { Linear(j)["kda_layers"].push_back(4); },
     {"layer 4 is in both full_attn_layers and kda_layers"}},
    {"lists_leave_a_gap",
     true,
     [](json& j) {
       json& kda = Linear(j)["kda_layers"];
       kda.erase(kda.begin());
     },
     {"layers 1 are in neither"}},
    {"duplicate_layer",
     false,
     [](json& j) {
       j["full_attn_layers"] = {4, 4, 8, 12, 13};
     },
     {"layer 4 is listed twice"}},
    {"wrong_type",
     true,
     [](json& j) { Text(j)["num_attention_heads"] = "96"; },
     {"text_config.num_attention_heads: must be an integer, found \"96\""}},
    {"list_of_strings",
     false,
     [](json& j) { j["full_attn_layers"] = {"4"}; },
     {"full_attn_layers: must be a list of integers"}},
    {"router_softmax",
     true,
     [](json& j) { Text(j)["moe_router_activation_func"] = "softmax"; },
     {"moe_router_activation_func: must be \"sigmoid\""}},
    {"expert_groups",
     true,
     [](json& j) { Text(j)["num_expert_group"] = 8; },
     {"num_expert_group: must be 1"}},
    {"grouped_kv_heads",
     true,
     [](json& j) { Text(j)["num_key_value_heads"] = 8; },
     {"num_key_value_heads: 8 differs from num_attention_heads 96"}},
    {"quantization_group_size",
     true,
     [](json& j) {
       j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
     },
     {"group_size: must be 32, found 16"}},
    {"quantization_format",
     true,
     [](json& j) { j["quantization_config"]["format"] = "nvfp4-pack-quantized"; },
     {"must be \"mxfp4-pack-quantized\""}},
    {"negative_eps",
     false,
     [](json& j) { j["rms_norm_eps"] = -1e-5; },
     {"rms_norm_eps: must be a positive number"}},
    {"positive_gate_bound",
     true,
     [](json& j) { Linear(j)["gate_lower_bound"] = 5.0; },
     {"gate_lower_bound: must be a negative number"}},
    {"dense_count_beyond_layers",
     false,
     [](json& j) { j["first_k_dense_replace"] = 20; },
     {"first_k_dense_replace: must be in 0..num_hidden_layers"}},
    {"eos_outside_vocab",
     true,
     [](json& j) { j["eos_token_id"] = 200000; },
     {"special id 200000 is outside the vocabulary"}},
    {"neither_form",
     false,
     [](json& j) {
       j = json{{"model_type", "llama"}};
     },
     {"neither the release form"}},
    {"not_an_object",
     false,
     [](json& j) {
       j = json::array({1, 2});
     },
     {"must be a JSON object"}},
    {"every_problem_at_once",
     true,
     [](json& j) {
       Text(j).erase("vocab_size");
       Text(j)["num_experts_per_token"] = 1000;
       Text(j)["hidden_act"] = "relu";
     },
     {"(3 problems)", "vocab_size: missing", "1000 exceeds num_experts", "\"relu\""}},
};

INSTANTIATE_TEST_SUITE_P(All, InvalidConfigTest, ::testing::ValuesIn(kInvalid),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigTest, NotJsonNamesTheFile) {
  auto parsed = ParseModelConfigText("{\"hidden_size\": 12,", "x/config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("x/config.json: not valid JSON"));
}

TEST(ConfigTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  auto parsed = LoadModelConfig(dir / "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(dir / "config.json"));
}

TEST(ConfigTest, OverridesAcceptListsAndRejectUnknownKeys) {
  auto c = ParseModelConfig(FixtureFlatConfig(), "config.json");
  ASSERT_TRUE(c.ok());
  auto changed =
      ApplyConfigOverrides(*c, {{"num_hidden_layers", "9"}, {"full_attn_layers", "4,9"}});
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->num_layers, 9);
  EXPECT_EQ(changed->kda_layers.size(), 7u);
  auto unknown = ApplyConfigOverrides(*c, {{"hiden_size", "3"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown config key \"hiden_size\""));
}

}  // namespace
}  // namespace k3
