#include "pipeline/ranks/protocol.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace k3::ranks {
namespace {

absl::Status Garbled(const char* what, const std::string& why) {
  return absl::DataLossError(absl::StrCat("a garbled ", what, ": ", why));
}

// A message's expert ids, each checked against the layer's experts.
absl::Status ReadExperts(std::span<const int64_t> ids, const ModelConfig& config, const char* what,
                         std::vector<int32_t>& out) {
  for (int64_t e : ids) {
    if (e < 0 || e >= config.num_experts) {
      return Garbled(what, absl::StrCat("expert ", e, " of a layer of ", config.num_experts));
    }
    out.push_back(static_cast<int32_t>(e));
  }
  return absl::OkStatus();
}

absl::Status CheckLayer(int64_t layer, const ModelConfig& config, const char* what) {
  if (layer >= 0 && layer < config.num_layers) return absl::OkStatus();
  return Garbled(what, absl::StrCat("layer ", layer, " of a model of ", config.num_layers));
}

}  // namespace

std::string EncodeWorkerInfo(const WorkerInfo& info) {
  if (!info.error.empty()) return nlohmann::json{{"error", info.error}}.dump();
  return nlohmann::json{{"cache_bytes", info.capacity.cache_bytes},
                        {"disk_rate", info.capacity.disk_rate},
                        {"simd_target", info.identity.simd_target},
                        {"checkpoint", info.identity.checkpoint}}
      .dump();
}

absl::StatusOr<WorkerInfo> DecodeWorkerInfo(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Garbled("greeting", "not a JSON object");
  WorkerInfo info;
  if (j.contains("error")) {
    info.error = j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump();
    return info;
  }
  for (const char* key : {"cache_bytes", "disk_rate", "simd_target", "checkpoint"}) {
    if (!j.contains(key)) return Garbled("greeting", absl::StrCat("no \"", key, "\""));
  }
  if (!j["cache_bytes"].is_number_unsigned() || !j["disk_rate"].is_number() ||
      !j["simd_target"].is_string() || !j["checkpoint"].is_string()) {
    return Garbled("greeting", "a field of the wrong type");
  }
  info.capacity = {.cache_bytes = j["cache_bytes"].get<uint64_t>(),
                   .disk_rate = j["disk_rate"].get<double>()};
  info.identity = {.simd_target = j["simd_target"].get<std::string>(),
                   .checkpoint = j["checkpoint"].get<std::string>()};
  return info;
}

std::vector<int64_t> EncodeJobHeader(const LayerJob& job, size_t latent) {
  std::vector<int64_t> h = {job.layer, static_cast<int64_t>(job.experts.size()),
                            static_cast<int64_t>(job.rows.size() / latent)};
  h.reserve(3 + 2 * job.experts.size() + job.row_of.size());
  h.insert(h.end(), job.experts.begin(), job.experts.end());
  h.insert(h.end(), job.counts.begin(), job.counts.end());
  h.insert(h.end(), job.row_of.begin(), job.row_of.end());
  return h;
}

absl::StatusOr<LayerJob> DecodeLayerJob(std::span<const int64_t> h, std::vector<float> rows,
                                        const ModelConfig& config) {
  constexpr const char* kWhat = "layer job";
  if (h.size() < 3) return Garbled(kWhat, absl::StrCat("a header of ", h.size(), " values"));
  LayerJob job{.layer = h[0]};
  if (absl::Status s = CheckLayer(job.layer, config, kWhat); !s.ok()) return s;
  const int64_t n = h[1], count = h[2];
  if (n < 0 || n > config.num_experts || count < 0 || h.size() < 3 + 2 * static_cast<size_t>(n)) {
    return Garbled(kWhat, absl::StrCat(n, " experts and ", count, " rows in a header of ", h.size(),
                                       " values"));
  }
  if (absl::Status s = ReadExperts(h.subspan(3, n), config, kWhat, job.experts); !s.ok()) return s;
  size_t pairs = 0;
  for (int64_t c : h.subspan(3 + n, n)) {
    if (c < 0) return Garbled(kWhat, absl::StrCat("an expert of ", c, " rows"));
    job.counts.push_back(static_cast<size_t>(c));
    pairs += static_cast<size_t>(c);
  }
  const size_t latent = config.routed_expert_hidden_size;
  if (h.size() != 3 + 2 * static_cast<size_t>(n) + pairs ||
      rows.size() != static_cast<size_t>(count) * latent) {
    return Garbled(kWhat, absl::StrCat("a header of ", h.size(), " values and ", rows.size(),
                                       " floats of rows for ", n, " experts, ", pairs,
                                       " pairs and ", count, " rows of ", latent));
  }
  for (int64_t r : h.subspan(3 + 2 * n)) {
    if (r < 0 || r >= count) return Garbled(kWhat, absl::StrCat("row ", r, " of ", count));
    job.row_of.push_back(static_cast<size_t>(r));
  }
  job.rows = std::move(rows);
  return job;
}

std::vector<float> EncodeLayerResult(LayerResult result) {
  std::vector<float> m = std::move(result.products);
  m.push_back(static_cast<float>(result.seconds));
  return m;
}

absl::StatusOr<LayerResult> DecodeLayerResult(std::vector<float> message, size_t pairs,
                                              size_t latent) {
  if (message.size() != pairs * latent + 1) {
    return Garbled("layer's products", absl::StrCat(message.size(), " floats for ", pairs,
                                                    " products of ", latent, " and the seconds"));
  }
  LayerResult r{.seconds = message.back()};
  message.pop_back();
  r.products = std::move(message);
  return r;
}

std::vector<int64_t> EncodeLayerGuess(const LayerGuess& guess) {
  std::vector<int64_t> m = {guess.layer};
  m.insert(m.end(), guess.experts.begin(), guess.experts.end());
  return m;
}

absl::StatusOr<LayerGuess> DecodeLayerGuess(std::span<const int64_t> m, const ModelConfig& config) {
  constexpr const char* kWhat = "guess";
  if (m.empty()) return Garbled(kWhat, "no layer");
  LayerGuess g{.layer = m[0]};
  if (absl::Status s = CheckLayer(g.layer, config, kWhat); !s.ok()) return s;
  if (absl::Status s = ReadExperts(m.subspan(1), config, kWhat, g.experts); !s.ok()) return s;
  return g;
}

}  // namespace k3::ranks
