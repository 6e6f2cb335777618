#include "core/checkpoint/config.h"

#include <cmath>
#include <limits>
#include <set>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/util/problem_list.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using json = nlohmann::json;
using Member = std::variant<int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                            std::string ModelConfig::*, std::vector<int64_t> ModelConfig::*>;

// One configuration field: its flat name, where the release nests it, and whether a config
// without it is refused (optional fields keep the full-size model's value).
struct Field {
  const char* flat;
  const char* nested;  // path below the wrapper, '.'-separated
  Member member;
  bool required;
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> kFields = {
      {"hidden_size", "text_config.hidden_size", &ModelConfig::hidden_size, true},
      {"num_hidden_layers", "text_config.num_hidden_layers", &ModelConfig::num_layers, true},
      {"vocab_size", "text_config.vocab_size", &ModelConfig::vocab_size, true},
      {"rms_norm_eps", "text_config.rms_norm_eps", &ModelConfig::rms_norm_eps, false},
      {"hidden_act", "text_config.hidden_act", &ModelConfig::hidden_act, false},
      {"situ_beta", "text_config.activation_situ_beta", &ModelConfig::situ_beta, false},
      {"situ_linear_beta", "text_config.activation_situ_linear_beta",
       &ModelConfig::situ_linear_beta, false},
      {"attn_res_block_size", "text_config.attn_res_block_size", &ModelConfig::attn_res_block_size,
       false},
      {"max_position_embeddings", "text_config.max_position_embeddings",
       &ModelConfig::max_position_embeddings, false},
      {"kda_num_heads", "text_config.linear_attn_config.num_heads", &ModelConfig::kda_num_heads,
       true},
      {"kda_head_dim", "text_config.linear_attn_config.head_dim", &ModelConfig::kda_head_dim, true},
      {"short_conv_kernel_size", "text_config.linear_attn_config.short_conv_kernel_size",
       &ModelConfig::short_conv_kernel_size, false},
      {"gate_lower_bound", "text_config.linear_attn_config.gate_lower_bound",
       &ModelConfig::gate_lower_bound, false},
      {"num_attention_heads", "text_config.num_attention_heads", &ModelConfig::num_attention_heads,
       true},
      {"q_lora_rank", "text_config.q_lora_rank", &ModelConfig::q_lora_rank, true},
      {"kv_lora_rank", "text_config.kv_lora_rank", &ModelConfig::kv_lora_rank, true},
      {"qk_nope_head_dim", "text_config.qk_nope_head_dim", &ModelConfig::qk_nope_head_dim, true},
      {"qk_rope_head_dim", "text_config.qk_rope_head_dim", &ModelConfig::qk_rope_head_dim, true},
      {"v_head_dim", "text_config.v_head_dim", &ModelConfig::v_head_dim, true},
      {"mla_use_output_gate", "text_config.mla_use_output_gate", &ModelConfig::mla_use_output_gate,
       false},
      {"full_attn_layers", "text_config.linear_attn_config.full_attn_layers",
       &ModelConfig::full_attn_layers, true},
      {"kda_layers", "text_config.linear_attn_config.kda_layers", &ModelConfig::kda_layers, false},
      {"first_k_dense_replace", "text_config.first_k_dense_replace",
       &ModelConfig::first_k_dense_replace, false},
      {"intermediate_size", "text_config.intermediate_size", &ModelConfig::intermediate_size, true},
      {"num_experts", "text_config.num_experts", &ModelConfig::num_experts, true},
      {"num_experts_per_token", "text_config.num_experts_per_token",
       &ModelConfig::num_experts_per_token, true},
      {"num_shared_experts", "text_config.num_shared_experts", &ModelConfig::num_shared_experts,
       true},
      {"moe_intermediate_size", "text_config.moe_intermediate_size",
       &ModelConfig::moe_intermediate_size, true},
      {"routed_expert_hidden_size", "text_config.routed_expert_hidden_size",
       &ModelConfig::routed_expert_hidden_size, true},
      {"routed_scaling_factor", "text_config.routed_scaling_factor",
       &ModelConfig::routed_scaling_factor, false},
      {"moe_renormalize", "text_config.moe_renormalize", &ModelConfig::moe_renormalize, false},
      {"latent_moe_use_norm", "text_config.latent_moe_use_norm", &ModelConfig::latent_moe_use_norm,
       false},
      {"bos_token_id", "bos_token_id", &ModelConfig::bos_token_id, false},
      {"eos_token_id", "eos_token_id", &ModelConfig::eos_token_id, false},
  };
  return kFields;
}

// Every problem, so that one message lists them all, and one per key: a missing or mistyped key
// is not reported again as out of range.
class ConfigProblems {
 public:
  void Add(const std::string& key, const std::string& what) {
    if (keys_.insert(key).second) items_.Add(absl::StrCat(key, ": ", what));
  }
  bool empty() const { return items_.empty(); }
  absl::Status ToStatus(std::string_view source) const {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": invalid Kimi K3 config ", items_.Text()));
  }

 private:
  ProblemList items_{std::numeric_limits<size_t>::max()};
  std::set<std::string> keys_;
};

const json* FindPath(const json& root, const std::string& path) {
  const json* node = &root;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(std::string(part));
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

// A value as the message quotes it. Replaces invalid UTF-8 rather than throwing: --set values
// come from the command line as raw bytes, not from the JSON parser.
std::string Shown(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Reads one JSON value into the member it belongs to, or records why it cannot.
void ReadField(const json& value, const Member& member, ModelConfig& config, const std::string& key,
               ConfigProblems& problems) {
  std::visit(
      [&](auto ptr) {
        using T = std::remove_reference_t<decltype(config.*ptr)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (value.is_number_integer()) {
            config.*ptr = value.get<int64_t>();
          } else {
            problems.Add(key, absl::StrCat("must be an integer, found ", Shown(value)));
          }
        } else if constexpr (std::is_same_v<T, double>) {
          if (value.is_number()) {
            config.*ptr = value.get<double>();
          } else {
            problems.Add(key, absl::StrCat("must be a number, found ", Shown(value)));
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          if (value.is_boolean()) {
            config.*ptr = value.get<bool>();
          } else {
            problems.Add(key, absl::StrCat("must be true or false, found ", Shown(value)));
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (value.is_string()) {
            config.*ptr = value.get<std::string>();
          } else {
            problems.Add(key, absl::StrCat("must be a string, found ", Shown(value)));
          }
        } else {
          bool ok = value.is_array();
          if (ok) {
            for (const json& v : value) ok = ok && v.is_number_integer();
          }
          if (ok) {
            config.*ptr = value.get<std::vector<int64_t>>();
          } else {
            problems.Add(key, absl::StrCat("must be a list of integers, found ", Shown(value)));
          }
        }
      },
      member);
}

// Release-only keys whose other values this engine does not implement.
void CheckReleaseOnlyKeys(const json& text, ConfigProblems& problems) {
  auto expect = [&](const char* key, const json& wanted) {
    auto it = text.find(key);
    if (it != text.end() && *it != wanted) {
      problems.Add(absl::StrCat("text_config.", key),
                   absl::StrCat("must be ", wanted.dump(), ", found ", it->dump()));
    }
  };
  expect("moe_router_activation_func", "sigmoid");
  expect("num_expert_group", 1);
  expect("topk_group", 1);
  expect("moe_layer_freq", 1);
  expect("mla_use_nope", true);
  auto kv = text.find("num_key_value_heads");
  auto heads = text.find("num_attention_heads");
  if (kv != text.end() && heads != text.end() && *kv != *heads) {
    problems.Add("text_config.num_key_value_heads",
                 absl::StrCat(kv->dump(), " differs from num_attention_heads ", heads->dump(),
                              " (grouped KV heads are not part of Kimi K3)"));
  }
}

void CheckQuantization(const json& root, ConfigProblems& problems) {
  const json* q = FindPath(root, "quantization_config");
  std::string where = "quantization_config";
  if (q == nullptr) {
    q = FindPath(root, "text_config.quantization_config");
    where = "text_config.quantization_config";
  }
  if (q == nullptr) return;
  if (!q->is_object()) {
    problems.Add(where, "must be an object");
    return;
  }
  auto format = q->find("format");
  if (format != q->end() && *format != "mxfp4-pack-quantized") {
    problems.Add(where + ".format",
                 absl::StrCat("must be \"mxfp4-pack-quantized\", found ", format->dump()));
  }
  const json* groups = FindPath(*q, "config_groups");
  if (groups == nullptr || !groups->is_object()) return;
  for (const auto& [name, group] : groups->items()) {
    const json* weights = FindPath(group, "weights");
    if (weights == nullptr || !weights->is_object()) continue;
    std::string prefix = absl::StrCat(where, ".config_groups.", name, ".weights.");
    auto size = weights->find("group_size");
    if (size != weights->end() && *size != 32) {
      problems.Add(prefix + "group_size", absl::StrCat("must be 32, found ", size->dump()));
    }
    auto bits = weights->find("num_bits");
    if (bits != weights->end() && *bits != 4) {
      problems.Add(prefix + "num_bits", absl::StrCat("must be 4, found ", bits->dump()));
    }
  }
}

// Bounds far above any real model that keep a corrupt config from costing a huge allocation
// here (one entry per layer) or overflowing the size arithmetic (expert_bytes and the like).
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxSize = int64_t{1} << 20;

// Checks that the one-based layer lists partition 1..num_layers and derives the layer kinds.
void CheckLayerLists(ModelConfig& c, const std::string& full_key, const std::string& kda_key,
                     ConfigProblems& problems) {
  if (c.num_layers <= 0 || c.num_layers > kMaxLayers) return;
  std::vector<int> owner(c.num_layers + 1, 0);  // 0 none, 1 MLA, 2 KDA
  auto mark = [&](const std::vector<int64_t>& list, int kind, const std::string& key) {
    for (int64_t l : list) {
      if (l < 1 || l > c.num_layers) {
        problems.Add(key, absl::StrCat("layer ", l, " is outside 1..", c.num_layers,
                                       " (the lists are one-based)"));
      } else if (owner[l] == kind) {
        problems.Add(key, absl::StrCat("layer ", l, " is listed twice"));
      } else if (owner[l] != 0) {
        problems.Add(key, absl::StrCat("layer ", l, " is in both full_attn_layers and kda_layers"));
      } else {
        owner[l] = kind;
      }
    }
  };
  mark(c.full_attn_layers, 1, full_key);
  if (c.kda_layers.empty()) {
    for (int64_t l = 1; l <= c.num_layers; ++l) {
      if (owner[l] == 0) c.kda_layers.push_back(l);
    }
  }
  mark(c.kda_layers, 2, kda_key);
  std::vector<std::string> uncovered;
  for (int64_t l = 1; l <= c.num_layers; ++l) {
    if (owner[l] == 0) uncovered.push_back(absl::StrCat(l));
  }
  if (!uncovered.empty()) {
    problems.Add(kda_key, absl::StrCat("layers ", absl::StrJoin(uncovered, ","),
                                       " are in neither full_attn_layers nor kda_layers"));
  }
  c.layer_kinds.assign(c.num_layers, AttentionKind::kKda);
  for (int64_t l = 1; l <= c.num_layers; ++l) {
    if (owner[l] == 1) c.layer_kinds[l - 1] = AttentionKind::kMla;
  }
}

void CheckValues(ModelConfig& c, bool nested, ConfigProblems& problems) {
  auto key = [&](const char* flat) -> std::string {
    if (!nested) return flat;
    for (const Field& f : Fields()) {
      if (std::string_view(f.flat) == flat) return f.nested;
    }
    return flat;
  };
  auto positive = [&](const char* flat, int64_t v) {
    if (v <= 0) problems.Add(key(flat), absl::StrCat("must be positive, found ", v));
  };
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_layers);
  positive("vocab_size", c.vocab_size);
  positive("kda_num_heads", c.kda_num_heads);
  positive("kda_head_dim", c.kda_head_dim);
  positive("short_conv_kernel_size", c.short_conv_kernel_size);
  positive("num_attention_heads", c.num_attention_heads);
  positive("q_lora_rank", c.q_lora_rank);
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  positive("num_experts", c.num_experts);
  positive("num_experts_per_token", c.num_experts_per_token);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("routed_expert_hidden_size", c.routed_expert_hidden_size);
  positive("attn_res_block_size", c.attn_res_block_size);
  positive("max_position_embeddings", c.max_position_embeddings);
  auto at_most = [&](const char* flat, int64_t v, int64_t limit) {
    if (v > limit) problems.Add(key(flat), absl::StrCat(v, " is absurd (limit ", limit, ")"));
  };
  at_most("num_hidden_layers", c.num_layers, kMaxLayers);
  for (const Field& f : Fields()) {
    const auto* member = std::get_if<int64_t ModelConfig::*>(&f.member);
    if (member != nullptr && f.flat != std::string_view("num_hidden_layers") &&
        f.flat != std::string_view("max_position_embeddings")) {
      at_most(f.flat, c.**member, kMaxSize);
    }
  }
  if (c.first_k_dense_replace > 0) positive("intermediate_size", c.intermediate_size);
  if (c.qk_rope_head_dim < 0) {
    problems.Add(key("qk_rope_head_dim"), absl::StrCat("must be >= 0, found ", c.qk_rope_head_dim));
  }
  if (c.num_shared_experts < 0) {
    problems.Add(key("num_shared_experts"),
                 absl::StrCat("must be >= 0, found ", c.num_shared_experts));
  }
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_layers) {
    problems.Add(key("first_k_dense_replace"),
                 absl::StrCat("must be in 0..num_hidden_layers, found ", c.first_k_dense_replace));
  }
  auto positive_real = [&](const char* flat, double v) {
    if (!(v > 0) || !std::isfinite(v)) {
      problems.Add(key(flat), absl::StrCat("must be a positive number, found ", v));
    }
  };
  positive_real("rms_norm_eps", c.rms_norm_eps);
  positive_real("situ_beta", c.situ_beta);
  positive_real("situ_linear_beta", c.situ_linear_beta);
  positive_real("routed_scaling_factor", c.routed_scaling_factor);
  if (!(c.gate_lower_bound < 0) || !std::isfinite(c.gate_lower_bound)) {
    problems.Add(key("gate_lower_bound"),
                 absl::StrCat("must be a negative number, found ", c.gate_lower_bound));
  }
  if (c.hidden_act != "situ") {
    problems.Add(key("hidden_act"),
                 absl::StrCat("unknown activation \"", c.hidden_act, "\" (Kimi K3 uses \"situ\")"));
  }
  if (c.num_experts > 0 && c.num_experts_per_token > c.num_experts) {
    problems.Add(
        key("num_experts_per_token"),
        absl::StrCat(c.num_experts_per_token, " exceeds num_experts (", c.num_experts, ")"));
  }
  // MXFP4 groups 32 input columns: both expert input widths must be multiples of 32.
  auto by32 = [&](const char* flat, int64_t v) {
    if (v > 0 && v % 32 != 0) {
      problems.Add(key(flat), absl::StrCat(v, " is not a multiple of 32 (the MXFP4 group size)"));
    }
  };
  by32("routed_expert_hidden_size", c.routed_expert_hidden_size);
  by32("moe_intermediate_size", c.moe_intermediate_size);
  for (int64_t id : {c.bos_token_id, c.eos_token_id}) {
    if (id >= c.vocab_size && c.vocab_size > 0) {
      problems.Add(
          key("eos_token_id"),
          absl::StrCat("special id ", id, " is outside the vocabulary (", c.vocab_size, ")"));
    }
  }
  CheckLayerLists(c, key("full_attn_layers"), key("kda_layers"), problems);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

int64_t ModelConfig::expert_bytes() const {
  // w1 and w3: [moe_intermediate, latent]; w2: [latent, moe_intermediate]. Per weight: half a
  // byte of nibble plus one scale byte per 32.
  const int64_t weights = 3 * moe_intermediate_size * routed_expert_hidden_size;
  return weights / 2 + weights / 32;
}

std::string ModelConfig::Fingerprint() const {
  nlohmann::json flat = ToFlatConfigJson(*this);
  flat.erase("bos_token_id");
  flat.erase("eos_token_id");
  flat.erase("max_position_embeddings");  // a limit, not arithmetic: saved states stay valid
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(flat.dump())));
  return hex;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const json& root, std::string_view source) {
  ConfigProblems problems;
  if (!root.is_object()) {
    problems.Add("(top level)", "must be a JSON object");
    return problems.ToStatus(source);
  }
  const bool nested = root.contains("text_config");
  if (!nested && !root.contains("hidden_size")) {
    problems.Add("(top level)",
                 "neither the release form (with text_config) nor the flat form (with "
                 "hidden_size)");
    return problems.ToStatus(source);
  }
  if (nested && !root["text_config"].is_object()) {
    problems.Add("text_config", "must be an object");
    return problems.ToStatus(source);
  }
  ModelConfig config;
  for (const Field& f : Fields()) {
    std::string key = nested ? f.nested : f.flat;
    const json* value = FindPath(root, key);
    if (value == nullptr && nested && std::string_view(f.nested).find("text_config.") != 0) {
      value = FindPath(root, absl::StrCat("text_config.", f.nested));  // ids in either place
    }
    if (value == nullptr || value->is_null()) {
      if (f.required) problems.Add(key, "missing");
      continue;
    }
    ReadField(*value, f.member, config, key, problems);
  }
  if (nested) CheckReleaseOnlyKeys(root["text_config"], problems);
  CheckQuantization(root, problems);
  CheckValues(config, nested, problems);
  if (!problems.empty()) return problems.ToStatus(source);
  return config;
}

absl::StatusOr<ModelConfig> ParseModelConfigText(std::string_view text, std::string_view source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": not valid JSON"));
  }
  return ParseModelConfig(root, source);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  auto text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseModelConfigText(*text, path);
}

json ToFlatConfigJson(const ModelConfig& config) {
  json out = json::object();
  for (const Field& f : Fields()) {
    std::visit([&](auto ptr) { out[f.flat] = config.*ptr; }, f.member);
  }
  return out;
}

json ToReleaseConfigJson(const ModelConfig& c) {
  json root = {
      {"architectures", {"KimiK3ForConditionalGeneration"}},
      {"model_type", "kimi_k3"},
      {"dtype", "bfloat16"},
      {"tie_word_embeddings", false},
  };
  for (const Field& f : Fields()) {
    json* node = &root;
    std::vector<std::string> parts = absl::StrSplit(f.nested, '.');
    for (size_t i = 0; i + 1 < parts.size(); ++i) node = &(*node)[parts[i]];
    std::visit([&](auto ptr) { (*node)[parts.back()] = c.*ptr; }, f.member);
  }
  json& text = root["text_config"];
  text["model_type"] = "kimi_linear";
  text["architectures"] = {"KimiLinearForCausalLM"};
  text["num_key_value_heads"] = c.num_attention_heads;
  text["mla_use_nope"] = true;
  text["moe_layer_freq"] = 1;
  text["moe_router_activation_func"] = "sigmoid";
  text["use_grouped_topk"] = true;
  text["topk_method"] = "noaux_tc";
  text["num_expert_group"] = 1;
  text["topk_group"] = 1;
  text["num_nextn_predict_layers"] = 0;
  text["tie_word_embeddings"] = false;
  text["linear_attn_config"]["use_full_rank_gate"] = true;
  if (c.bos_token_id < 0) root.erase("bos_token_id");
  if (c.eos_token_id < 0) root.erase("eos_token_id");
  root["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "mxfp4-pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"weights",
           {{"num_bits", 4},
            {"type", "float"},
            {"strategy", "group"},
            {"group_size", 32},
            {"symmetric", true},
            {"scale_dtype", "uint8"},
            {"dynamic", false}}},
          {"input_activations", nullptr},
          {"targets", {"Linear"}}}}}},
      {"ignore",
       {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "lm_head"}},
  };
  return root;
}

absl::StatusOr<ModelConfig> ApplyConfigOverrides(
    const ModelConfig& config, const std::vector<std::pair<std::string, std::string>>& overrides) {
  json flat = ToFlatConfigJson(config);
  for (const auto& [key, value] : overrides) {
    if (!flat.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", key, "=", value, ": unknown config key \"", key, "\""));
    }
    // Lists may be written without brackets: full_attn_layers=4,8.
    std::string text = value;
    if (flat[key].is_array() && (text.empty() || text.front() != '[')) text = "[" + text + "]";
    json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) parsed = value;  // a bare string, e.g. hidden_act=gelu
    flat[key] = parsed;
  }
  // The derived default for kda_layers must follow a changed layer count.
  if (std::none_of(overrides.begin(), overrides.end(),
                   [](const auto& kv) { return kv.first == "kda_layers"; })) {
    flat.erase("kda_layers");
  }
  return ParseModelConfig(flat, "--set");
}

}  // namespace k3
