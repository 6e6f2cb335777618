#include "core/model/sequence_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "io/file.h"

namespace k3 {
namespace {

constexpr char kMagic[8] = {'K', '3', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr uint32_t kVersion = 1;

class Writer {
 public:
  explicit Writer(absl::FunctionRef<void(std::string_view)> out) : out_(out) {}
  void Bytes(const void* p, size_t n) {
    if (n > 0) out_(std::string_view(static_cast<const char*>(p), n));
  }
  void U64(uint64_t v) { Bytes(&v, 8); }
  void Floats(const std::vector<float>& v) {
    U64(v.size());
    Bytes(v.data(), v.size() * 4);
  }

 private:
  absl::FunctionRef<void(std::string_view)> out_;
};

class Reader {
 public:
  Reader(std::string_view in, std::string_view where) : in_(in), where_(where) {}
  bool Bytes(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    if (n == 0) return true;  // p may be the null data() of an empty vector
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool U64(uint64_t* v) { return Bytes(v, 8); }
  // Reads a float array that must have exactly `expected` elements.
  bool Floats(std::vector<float>& v, size_t expected) {
    uint64_t n = 0;
    if (!U64(&n) || n != expected || in_.size() - pos_ < n * 4) return false;
    v.resize(n);
    return Bytes(v.data(), n * 4);
  }
  bool AtEnd() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }
  absl::Status Error(std::string_view what) const {
    return absl::DataLossError(
        absl::StrCat(where_, ": ", std::string(what), " (at byte ", pos_, ")"));
  }

 private:
  std::string_view in_;
  std::string where_;
  size_t pos_ = 0;
};

}  // namespace

SequenceState::SequenceState(const ModelConfig& c)
    : fingerprint_(c.Fingerprint()), latent_width_(c.kv_lora_rank + c.qk_rope_head_dim) {
  kda_state_.resize(c.num_layers);
  conv_.resize(c.num_layers);
  mla_cache_.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.attention_kind(l) != AttentionKind::kKda) continue;
    kda_state_[l].assign(c.kda_num_heads * c.kda_head_dim * c.kda_head_dim, 0.0f);
    for (auto& h : conv_[l]) h.assign((c.short_conv_kernel_size - 1) * c.kda_width(), 0.0f);
  }
}

uint64_t SequenceState::bytes() const {
  uint64_t n = tokens_.size() * 4;
  for (size_t l = 0; l < kda_state_.size(); ++l) {
    n += kda_state_[l].size() * 4 + mla_cache_[l].size() * 4;
    for (const auto& h : conv_[l]) n += h.size() * 4;
  }
  return n;
}

void SequenceState::SerializeTo(absl::FunctionRef<void(std::string_view)> out) const {
  Writer w(out);
  w.Bytes(kMagic, 8);
  w.Bytes(&kVersion, 4);
  w.U64(fingerprint_.size());
  w.Bytes(fingerprint_.data(), fingerprint_.size());
  w.U64(tokens_.size());
  w.Bytes(tokens_.data(), tokens_.size() * 4);
  for (size_t l = 0; l < kda_state_.size(); ++l) {
    w.Floats(kda_state_[l]);
    for (const auto& h : conv_[l]) w.Floats(h);
    w.Floats(mla_cache_[l]);
  }
}

std::string SequenceState::Serialize() const {
  std::string bytes;
  bytes.reserve(SerializedBytes());
  SerializeTo([&](std::string_view piece) { bytes.append(piece); });
  return bytes;
}

uint64_t SequenceState::SerializedBytes() const {
  uint64_t n = 0;
  SerializeTo([&](std::string_view piece) { n += piece.size(); });
  return n;
}

absl::Status SequenceState::Save(const std::string& path) const {
  return io::WriteFileAtomically(path, Serialize());
}

absl::StatusOr<SequenceState> SequenceState::Load(const std::string& path,
                                                  const ModelConfig& config) {
  auto text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  return Deserialize(*text, config, path);
}

absl::StatusOr<SequenceState> SequenceState::Deserialize(std::string_view bytes,
                                                         const ModelConfig& config,
                                                         std::string_view where) {
  Reader r(bytes, where);
  char magic[8];
  uint32_t version = 0;
  if (!r.Bytes(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    return r.Error("not a k3 sequence state file");
  }
  if (!r.Bytes(&version, 4) || version != kVersion) {
    return r.Error(
        absl::StrCat("state file version ", version, ", this k3 reads version ", kVersion));
  }
  SequenceState s(config);
  uint64_t n = 0;
  std::string fingerprint;
  if (!r.U64(&n) || n > 64) return r.Error("bad fingerprint");
  fingerprint.resize(n);
  if (!r.Bytes(fingerprint.data(), n)) return r.Error("truncated");
  if (fingerprint != s.fingerprint_) {
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(where), ": saved for a different model (config fingerprint ",
                     fingerprint, ", this model has ", s.fingerprint_, ")"));
  }
  // Checked against the bytes left before allocating: a corrupt count must not cost 16 GB.
  if (!r.U64(&n) || n > (1ull << 32) || n * 4 > r.remaining()) {
    return r.Error("bad token count");
  }
  s.tokens_.resize(n);
  if (!r.Bytes(s.tokens_.data(), n * 4)) return r.Error("truncated token list");
  for (size_t l = 0; l < s.kda_state_.size(); ++l) {
    bool ok = r.Floats(s.kda_state_[l], s.kda_state_[l].size());
    for (auto& h : s.conv_[l]) ok = ok && r.Floats(h, h.size());
    const size_t mla =
        config.attention_kind(l) == AttentionKind::kMla ? s.tokens_.size() * s.latent_width_ : 0;
    ok = ok && r.Floats(s.mla_cache_[l], mla);
    if (!ok) return r.Error(absl::StrCat("layer ", l, " state is truncated or has the wrong size"));
  }
  if (!r.AtEnd()) return r.Error("trailing bytes after the last layer");
  return s;
}

}  // namespace k3
