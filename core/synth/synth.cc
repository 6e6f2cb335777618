#include "core/synth/synth.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/numeric.h"
#include "core/util/progress.h"
#include "core/checkpoint/safetensors.h"
#include "core/synth/synth_tokenizer.h"
#include "core/checkpoint/tensor_names.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

// ---- Deterministic randomness ----

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Element i of a tensor depends only on (seed, tensor name, i): the order in which tensors
// are written, or how the work is split, can never change a byte.
class TensorRandom {
 public:
  TensorRandom(uint64_t seed, std::string_view name) : key_(SplitMix64(seed ^ HashName(name))) {}
  uint64_t Bits(uint64_t i) const { return SplitMix64(key_ + i); }
  // Uniform in [-1, 1).
  float Symmetric(uint64_t i) const {
    return static_cast<float>(static_cast<double>(Bits(i) >> 11) * 0x1.0p-52 - 1.0);
  }

 private:
  uint64_t key_;
};

// Quantiles of N(0, 1) at the midpoints of 65,536 equally likely bins, so that 16 random bits
// are one Gaussian draw by lookup, four per 64-bit word: fast enough for the writes to stay
// disk-bound. The tails end at 4.3 sigma and nothing lands within 4e-5 sigma of zero, both far
// too rare to move the exponent distribution. Bisection on erfc: exact to double precision,
// ~30 ms once. A named function, not a lambda: GCC tries to evaluate an implicitly constexpr
// lambda's static initializer at compile time, folding two million erfc calls (8-12 s per build).
std::vector<float> ComputeUnitGaussianQuantiles() {
  constexpr int kBins = 1 << 16;
  std::vector<float> q(kBins);
  for (int k = 0; k < kBins / 2; ++k) {
    const double p = (k + 0.5) / kBins;  // below 1/2: a negative quantile
    double lo = -10, hi = 0;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
    }
    q[k] = static_cast<float>(0.5 * (lo + hi));
    q[kBins - 1 - k] = -q[k];
  }
  return q;
}

const std::vector<float>& UnitGaussianQuantiles() {
  static const std::vector<float> table = ComputeUnitGaussianQuantiles();
  return table;
}

// ---- What each tensor holds ----

enum class Fill { kOnes, kSymmetric, kGaussian, kALog, kExpertNibbles, kExpertScales };

struct TensorPlan {
  TensorSpec spec;
  DType dtype;
  Fill fill;
  float scale;       // kSymmetric amplitude, kGaussian standard deviation, kOnes spread
  uint8_t exponent;  // kExpertScales base E8M0 code
  uint64_t bytes;
  int64_t live = 0;  // kALog: entries past this many (one per head) are zero padding
};

bool EndsWith(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

// Small vectors the release stores as F32; every other float tensor is BF16.
bool StoredAsF32(std::string_view name) {
  for (const char* s :
       {"conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "e_score_correction_bias"}) {
    if (EndsWith(name, s)) return true;
  }
  return false;
}

// Weights are scaled so that every projection roughly preserves the RMS of its input and the
// residual stream stays O(1) through all layers. With `gaussian`, the tensors the release
// stores as BF16 matrices are drawn from a normal distribution of the same RMS instead.
TensorPlan PlanTensor(const TensorSpec& spec, SynthFloats floats, bool gaussian) {
  TensorPlan p{spec, DType::kBF16, Fill::kSymmetric, 0, 0, 0, 0};
  const std::string& n = spec.name;
  const int64_t fan_in = spec.shape.size() >= 2 ? spec.shape[1] : 1;
  const float unit = std::sqrt(3.0f / static_cast<float>(fan_in));  // uniform with RMS 1/sqrt(K)
  if (spec.role == TensorRole::kExpert) {
    p.dtype = DType::kU8;
    const bool packed = EndsWith(n, "weight_packed");
    p.fill = packed ? Fill::kExpertNibbles : Fill::kExpertScales;
    // K input columns: random E2M1 codes have RMS ~2.93, so 2^(e-127) ~ 1/(2.93 sqrt(K)).
    const double k = packed ? 2.0 * spec.shape[1] : 32.0 * spec.shape[1];
    p.exponent = static_cast<uint8_t>(127 + std::lround(std::log2(1.0 / (2.93 * std::sqrt(k)))));
  } else if (StoredAsF32(n)) {
    p.dtype = DType::kF32;
    if (EndsWith(n, "A_log"))
      p.fill = Fill::kALog;
    else if (EndsWith(n, "o_norm.weight"))
      p.fill = Fill::kOnes, p.scale = 0.1f;
    else if (EndsWith(n, "conv1d.weight"))
      p.scale = 0.6f;
    else if (EndsWith(n, "dt_bias"))
      p.scale = 1.0f;
    else
      p.scale = 0.05f;  // router correction bias
  } else if (EndsWith(n, "norm.weight") || EndsWith(n, "layernorm.weight")) {
    p.fill = Fill::kOnes;
    p.scale = 0.1f;
  } else if (EndsWith(n, "res_proj.weight")) {
    p.scale = 1.5f * unit;  // AttnRes scores of RMS-normalised candidates ~ N(0, 1.5^2)
  } else if (EndsWith(n, "embed_tokens.weight")) {
    // Uniform: rows with RMS 1. Gaussian: at the matrices' 1/sqrt(hidden), as trained embeddings
    // are O(0.01), so the whole model's exponent histogram is a trained one's too (the layers
    // normalise their input, so the stream's starting scale does not matter to them).
    p.scale = gaussian ? unit : std::sqrt(3.0f);
  } else if (EndsWith(n, "o_proj.weight") || EndsWith(n, "down_proj.weight") ||
             EndsWith(n, "routed_expert_up_proj.weight")) {
    p.scale = 0.5f * unit;  // residual branches: keep the stream from growing layer to layer
  } else {
    p.scale = unit;
  }
  if (gaussian && p.fill == Fill::kSymmetric && p.dtype == DType::kBF16) {
    p.fill = Fill::kGaussian;
    p.scale /= std::sqrt(3.0f);  // uniform on [-a, a) has RMS a / sqrt(3)
  }
  if (p.dtype != DType::kU8 && floats != SynthFloats::kRelease) {
    p.dtype = floats == SynthFloats::kF16 ? DType::kF16 : DType::kF32;
  }
  int64_t elements = 1;
  for (int64_t d : spec.shape) elements *= d;
  p.bytes = static_cast<uint64_t>(elements) * DTypeSize(p.dtype);
  return p;
}

// Stores v as element i of dst in the tensor's dtype.
void Put(DType dtype, uint8_t* dst, uint64_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(dst + 4 * i, &v, 4);
  } else {
    uint16_t b = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBF16(v);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

// A kGaussian BF16 tensor's 65,536 possible values, scaled and rounded once, so that each
// element is one lookup.
std::vector<uint16_t> GaussianBf16Codes(float sigma) {
  const std::vector<float>& q = UnitGaussianQuantiles();
  std::vector<uint16_t> codes(q.size());
  for (size_t k = 0; k < q.size(); ++k) codes[k] = FloatToBF16(sigma * q[k]);
  return codes;
}

// kGaussian elements [first, first + count): element e is 16 bits of random word e / 4.
// `bf16_codes` (GaussianBf16Codes) when the tensor is BF16, else empty.
void GenerateGaussian(const TensorPlan& p, const TensorRandom& rng, uint64_t first, uint64_t count,
                      uint8_t* dst, std::span<const uint16_t> bf16_codes) {
  const float* q = UnitGaussianQuantiles().data();
  uint64_t i = 0;
  auto partial_word = [&] {  // up to a word boundary, or the tail
    const uint64_t e = first + i;
    uint64_t word = rng.Bits(e / 4) >> (16 * (e % 4));
    for (uint64_t k = e % 4; k < 4 && i < count; ++k, ++i, word >>= 16) {
      Put(p.dtype, dst, i, p.scale * q[word & 0xffff]);
    }
  };
  if (bf16_codes.empty()) {
    while (i < count) partial_word();
    return;
  }
  if ((first + i) % 4 != 0) partial_word();
  const uint16_t* c = bf16_codes.data();
  for (; i + 4 <= count; i += 4) {  // the bulk: four values from one word
    const uint64_t w = rng.Bits((first + i) / 4);
    const uint64_t out = uint64_t{c[w & 0xffff]} | uint64_t{c[(w >> 16) & 0xffff]} << 16 |
                         uint64_t{c[(w >> 32) & 0xffff]} << 32 | uint64_t{c[w >> 48]} << 48;
    std::memcpy(dst + 2 * i, &out, 8);  // little-endian: value k of the word is element i + k
  }
  if (i < count) partial_word();
}

// Writes elements [first, first + count) of a tensor into dst.
void GenerateElements(const TensorPlan& p, const TensorRandom& rng, uint64_t first, uint64_t count,
                      uint8_t* dst, double router_skew, std::span<const uint16_t> bf16_codes) {
  if (p.fill == Fill::kGaussian) return GenerateGaussian(p, rng, first, count, dst, bf16_codes);
  auto put = [&](uint64_t i, float v) { Put(p.dtype, dst, i, v); };
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t e = first + i;
    switch (p.fill) {
      case Fill::kOnes:
        put(i, 1.0f + p.scale * rng.Symmetric(e));
        break;
      case Fill::kSymmetric: {
        float v = p.scale * rng.Symmetric(e);
        if (router_skew != 0 && EndsWith(p.spec.name, tensor_name::kRouterBias)) {
          // A fixed per-expert popularity: a few experts win most tokens, as in real traces.
          float z = rng.Symmetric(e ^ 0x5bd1e995u);
          v += static_cast<float>(router_skew) * z * std::abs(z) * 2.0f;
        }
        put(i, v);
        break;
      }
      case Fill::kALog:
        put(i, static_cast<int64_t>(e) < p.live
                   ? std::log(1.0f + 15.0f * 0.5f * (1.0f + rng.Symmetric(e)))
                   : 0.0f);
        break;
      default:
        break;
    }
  }
}

// Expert bytes, 8 per random word: the fast path for the bulk of a checkpoint (16 GB for the
// bench preset must be generated faster than the disk writes it).
void GenerateExpertBytes(const TensorPlan& p, const TensorRandom& rng, uint64_t first_byte,
                         uint64_t count, uint8_t* dst) {
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  // Scales: the base exponent or one below it in each byte (never 0xFF, and no borrow between
  // bytes since the base is at least 1).
  const bool scales = p.fill == Fill::kExpertScales;
  const uint64_t base = kOnes * p.exponent;
  auto word_at = [&](uint64_t w) {
    uint64_t bits = rng.Bits(w);
    return scales ? base - (bits & kOnes) : bits;
  };
  uint64_t i = 0;
  while (i < count && (first_byte + i) % 8 != 0) {  // head up to a word boundary
    const uint64_t pos = first_byte + i;
    dst[i++] = static_cast<uint8_t>(word_at(pos / 8) >> (8 * (pos % 8)));
  }
  for (; i + 8 <= count; i += 8) {
    const uint64_t word = word_at((first_byte + i) / 8);
    std::memcpy(dst + i, &word, 8);  // little-endian: byte k of the word is byte pos+k
  }
  for (; i < count; ++i) {  // tail
    const uint64_t pos = first_byte + i;
    dst[i] = static_cast<uint8_t>(word_at(pos / 8) >> (8 * (pos % 8)));
  }
}

// ---- Files ----

struct Shard {
  std::string file_name;
  std::vector<TensorPlan> tensors;
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const TensorPlan& t : tensors) n += t.bytes;
    return n;
  }
};

// Stand-ins for the release's vision tower, which the engine never reads: 168 BF16 tensors
// named like MoonViT's (27 blocks of 1024 wide, a projector to 7168) whose 894,717,952 bytes
// make the index list 497,220 tensors and metadata.total_size equal the release's. Names and
// shapes are placeholders, not the release's.
std::vector<TensorPlan> VisionPlaceholders(SynthFloats floats, bool gaussian) {
  constexpr int64_t kBlocks = 27, kWidth = 1024, kMlp = 5120;
  std::vector<TensorPlan> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    out.push_back(PlanTensor(
        {std::move(name), std::move(shape), TensorRole::kMatrix, TensorGroup::kAttention, -1},
        floats, gaussian));
  };
  add("vision_tower.patch_embed.proj.weight", {kWidth, 3, 14, 14});
  add("vision_tower.patch_embed.pos_emb.weight", {64, 64, kWidth});
  for (int64_t b = 0; b < kBlocks; ++b) {
    const std::string p = absl::StrCat("vision_tower.encoder.blocks.", b, ".");
    add(p + "norm0.weight", {kWidth});
    add(p + "norm1.weight", {kWidth});
    add(p + "attn.wqkv.weight", {3 * kWidth, kWidth});
    add(p + "attn.wo.weight", {kWidth, kWidth});
    add(p + "mlp.fc0.weight", {kMlp, kWidth});
    add(p + "mlp.fc1.weight", {kWidth, kMlp});
  }
  add("vision_tower.encoder.final_layernorm.weight", {kWidth});
  add("mm_projector.pre_norm.weight", {7168});
  add("mm_projector.proj.0.weight", {4 * kWidth, 4 * kWidth});
  add("mm_projector.proj.2.weight", {7168, 4 * kWidth});
  return out;
}

// One shard per layer (its trunk tensors, then experts 0..E-1 with their six tensors
// adjacent), then one for the global tensors, as the release groups them; the full preset
// adds the release's two vision shards and its file names. With `single_file`, the language
// model in one model.safetensors.
std::vector<Shard> PlanShards(const ModelConfig& c, const TensorNames& names,
                              const SynthOptions& opt, bool gaussian) {
  const bool release = opt.preset == "full";
  std::vector<TensorSpec> trunk = TrunkTensorSpecs(c, names);
  const int language = static_cast<int>(c.num_layers) + 1;
  const int count = language + (release && !opt.single_file ? 2 : 0);
  std::vector<Shard> shards(count);
  for (int i = 0; i < count; ++i) {
    // The release spells the count with six digits: model-00001-of-000096.safetensors.
    shards[i].file_name = release ? absl::StrFormat("model-%05d-of-%06d.safetensors", i + 1, count)
                                  : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, count);
  }
  for (TensorSpec& spec : trunk) {
    // The release ships A_log with head_dim entries, one per head used (MODEL.md Q2).
    if (spec.name.ends_with(tensor_name::kKdaALog)) {
      spec.shape = {std::max(c.kda_num_heads, c.kda_head_dim)};
    }
    TensorPlan plan = PlanTensor(spec, opt.floats, gaussian);
    plan.live = c.kda_num_heads;
    shards[spec.layer < 0 ? language - 1 : spec.layer].tensors.push_back(std::move(plan));
  }
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      for (const TensorSpec& spec : ExpertTensorSpecs(c, names, l, e)) {
        shards[l].tensors.push_back(PlanTensor(spec, opt.floats, gaussian));
      }
    }
  }
  if (count > language) {  // blocks 0-13 in shard 95, the rest and the projector in 96
    std::vector<TensorPlan> vision = VisionPlaceholders(opt.floats, gaussian);
    const size_t half = 2 + 14 * 6;
    for (size_t i = 0; i < vision.size(); ++i) {
      shards[language + (i < half ? 0 : 1)].tensors.push_back(std::move(vision[i]));
    }
  }
  if (opt.single_file) {
    Shard one{"model.safetensors", {}};
    for (Shard& s : shards) {
      for (TensorPlan& t : s.tensors) one.tensors.push_back(std::move(t));
    }
    shards = {std::move(one)};
  }
  return shards;
}

// What the written BF16 values look like: counted as they are generated, while in cache.
struct ExponentStats {
  ExponentHistogram all{};
  double weighted_entropy = 0;  // sum over tensors of entropy x values
  void AddTensor(const ExponentHistogram& tensor) {
    AddHistogram(tensor, all);
    weighted_entropy += EntropyBits(tensor) * static_cast<double>(HistogramTotal(tensor));
  }
};

absl::Status WriteShard(const Shard& shard, const std::string& dir, const SynthOptions& opt,
                        uint64_t& done, ProgressBar& bar, ExponentStats& stats) {
  std::vector<TensorInfo> infos;
  infos.reserve(shard.tensors.size());
  for (const TensorPlan& t : shard.tensors) {
    TensorInfo info;
    info.name = t.spec.name;
    info.dtype = t.dtype;
    info.shape = t.spec.shape;
    info.byte_size = t.bytes;
    infos.push_back(std::move(info));
  }
  const std::string header = BuildSafetensorsHeader(infos);
  const std::string path = absl::StrCat(dir, "/", shard.file_name);
  if (opt.sparse) {
    done += shard.bytes();
    bar.Update(done);
    return io::WriteSparseFileAtomically(path, header, header.size() + shard.bytes());
  }
  auto writer = io::SequentialWriter::Create(path);
  if (!writer.ok()) return writer.status();
  io::SequentialWriter& w = **writer;
  if (absl::Status s = w.Append({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
      !s.ok()) {
    return s;
  }
  for (const TensorPlan& t : shard.tensors) {
    TensorRandom rng(opt.seed, t.spec.name);
    const size_t elem = DTypeSize(t.dtype);
    const bool bf16 = t.dtype == DType::kBF16;
    ExponentHistogram exponents{};
    const std::vector<uint16_t> codes =
        t.fill == Fill::kGaussian && bf16 ? GaussianBf16Codes(t.scale) : std::vector<uint16_t>{};
    uint64_t produced = 0;
    while (produced < t.bytes) {
      // Whole elements only, so a float never straddles two reservations.
      std::span<uint8_t> room = w.Reserve(t.bytes - produced);
      const uint64_t n = room.size() / elem * elem;
      if (n == 0) {  // less than one element left in this block: go through a small buffer
        uint8_t tmp[4];
        GenerateElements(t, rng, produced / elem, 1, tmp, opt.router_skew, codes);
        if (bf16) CountBf16Exponents({tmp, elem}, exponents);
        if (absl::Status s = w.Append({tmp, elem}); !s.ok()) return s;
        produced += elem;
        continue;
      }
      if (t.dtype == DType::kU8) {
        GenerateExpertBytes(t, rng, produced, n, room.data());
      } else {
        GenerateElements(t, rng, produced / elem, n / elem, room.data(), opt.router_skew, codes);
        if (bf16) CountBf16Exponents(room.first(n), exponents);
      }
      if (absl::Status s = w.Advance(n); !s.ok()) return s;
      produced += n;
      done += n;
      bar.Update(done);
    }
    if (bf16) stats.AddTensor(exponents);
  }
  return w.Commit();
}

// The text nlohmann's dump(2) gives for {"metadata": {"total_size": N}, "weight_map": {...}},
// built directly (an order-keeping JSON object is quadratic in its keys: 497,220 here).
absl::Status WriteIndex(const std::vector<Shard>& shards, const std::string& dir) {
  uint64_t total = 0;
  for (const Shard& s : shards) total += s.bytes();
  std::string text = absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", total,
                                  "\n  },\n  \"weight_map\": {");
  bool first = true;
  for (const Shard& s : shards) {
    const std::string file = JsonQuote(s.file_name);
    for (const TensorPlan& t : s.tensors) {
      absl::StrAppend(&text, first ? "\n" : ",\n", "    ", JsonQuote(t.spec.name), ": ", file);
      first = false;
    }
  }
  absl::StrAppend(&text, first ? "}" : "\n  }", "\n}\n");
  return io::WriteFileAtomically(absl::StrCat(dir, "/model.safetensors.index.json"), text);
}

absl::Status RemoveIfPresent(const std::string& path) {
  if (!io::FileExists(path) || std::remove(path.c_str()) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("removing ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<SynthResult> Synthesize(const SynthOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  auto base = SynthPresetConfig(opt.preset);
  if (!base.ok()) return base.status();
  auto config = ApplyConfigOverrides(*base, opt.overrides);
  if (!config.ok()) return config.status();
  SynthTokenizerFiles tok = MakeSynthTokenizer(config->vocab_size);
  config->bos_token_id = tok.bos_id;
  config->eos_token_id = tok.eos_id;

  if (absl::Status s = io::MakeDirectories(opt.out_dir); !s.ok()) return s;
  const TensorNames names{std::string(tensor_name::kReleasePrefix)};
  const bool gaussian = opt.weights == SynthWeights::kPresetDefault
                            ? opt.preset == "slice" || opt.preset == "full"
                            : opt.weights == SynthWeights::kGaussian;
  std::vector<Shard> shards = PlanShards(*config, names, opt, gaussian);
  uint64_t total = 0;
  for (const Shard& s : shards) total += s.bytes();

  ProgressBar bar("synth " + opt.preset, total, "B", opt.show_progress);
  uint64_t done = 0;
  ExponentStats exponents;
  for (const Shard& shard : shards) {
    if (absl::Status s = WriteShard(shard, opt.out_dir, opt, done, bar, exponents); !s.ok()) {
      return s;
    }
  }
  bar.Finish();
  // Opening prefers an index to model.safetensors: never leave the other layout's file behind.
  const std::string index = opt.out_dir + "/model.safetensors.index.json";
  if (absl::Status s = opt.single_file ? RemoveIfPresent(index)
                                       : RemoveIfPresent(opt.out_dir + "/model.safetensors");
      !s.ok()) {
    return s;
  }
  // The config goes last: a directory without it is visibly incomplete.
  if (!opt.single_file) {
    if (absl::Status s = WriteIndex(shards, opt.out_dir); !s.ok()) return s;
  }
  if (absl::Status s = io::WriteFileAtomically(opt.out_dir + "/tiktoken.model", tok.tiktoken_model);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = io::WriteFileAtomically(opt.out_dir + "/tokenizer_config.json",
                                               tok.tokenizer_config_json);
      !s.ok()) {
    return s;
  }
  nlohmann::json config_json = ToReleaseConfigJson(*config);
  if (tok.bos_id >= 0) {  // the wrapper's other special ids, at the release's offsets
    config_json["pad_token_id"] = tok.bos_id + 255;
    config_json["media_placeholder_token_id"] = tok.bos_id + 21;
  }
  if (absl::Status s =
          io::WriteFileAtomically(opt.out_dir + "/config.json", config_json.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  SynthResult result;
  result.config = *config;
  result.bytes_written = total;
  result.shards = static_cast<int>(shards.size());
  result.weights = gaussian ? SynthWeights::kGaussian : SynthWeights::kUniform;
  result.bf16_exponents = exponents.all;
  if (const uint64_t n = HistogramTotal(exponents.all); n > 0) {
    result.bf16_tensor_entropy_bits = exponents.weighted_entropy / static_cast<double>(n);
  }
  for (const Shard& shard : shards) {
    for (const TensorPlan& t : shard.tensors) {
      ++(t.spec.name.starts_with(names.prefix()) ? result.language_tensors : result.other_tensors);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace k3
