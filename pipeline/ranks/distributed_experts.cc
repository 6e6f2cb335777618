#include "pipeline/ranks/distributed_experts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "pipeline/busy_clock.h"
#include "pipeline/ranks/comm.h"

namespace k3::ranks {
namespace {

using Clock = std::chrono::steady_clock;

// Each worker's capacity, from its kInfo answer to kHello.
absl::StatusOr<RankCapacity> AskWorker(int rank) {
  static const Tag kInfoTag[] = {kInfo};
  auto m = Await(rank, kInfoTag, Timeout(/*open=*/true));
  if (!m.ok()) return m.status();
  std::string text;
  if (absl::Status s = Receive(*m, text); !s.ok()) return s;
  const nlohmann::json info = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (info.is_discarded() || !info.is_object()) {
    return absl::InternalError(absl::StrCat(Name(rank), " answered a malformed greeting"));
  }
  if (info.contains("error")) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(rank), " could not open its experts: ", info.value("error", "")));
  }
  return RankCapacity{.cache_bytes = info.value("cache_bytes", uint64_t{0}),
                      .disk_rate = info.value("disk_rate", 0.0)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedExperts>> DistributedExperts::Connect(
    const ModelConfig& config, ExpertProvider& local, const RankCapacity& own) {
  const World& w = world();
  static const int64_t kOpen[1] = {0};
  for (int r = 1; r < w.size; ++r) {
    if (absl::Status s = PostSend(r, kHello, std::span(kOpen)); !s.ok()) return s;
  }
  std::vector<RankCapacity> capacity = {own};
  for (int r = 1; r < w.size; ++r) {
    auto c = AskWorker(r);
    // A rank that could not open its checkpoint is alive and exits when told; one that did not
    // answer may not be.
    if (!c.ok() && !absl::IsFailedPrecondition(c.status())) FailJob(c.status());
    if (!c.ok()) return c.status();
    capacity.push_back(*c);
  }
  if (absl::Status s = WaitSends(Timeout()); !s.ok()) return s;
  const uint64_t all = config.expert_bytes() * static_cast<uint64_t>(config.num_experts) *
                       static_cast<uint64_t>(config.num_layers);
  ExpertPartition partition(config.num_layers, config.num_experts, ShareWeights(capacity, all));
  std::unique_ptr<DistributedExperts> made(
      new DistributedExperts(config, local, std::move(partition), capacity));
  if (absl::Status s = made->MeasureLinks(); !s.ok()) FailJob(s);
  return made;
}

absl::Status DistributedExperts::MeasureLinks() {
  // A decode token's job for a rank: its row out, and the products of its share of the top-k
  // back (at least one).
  const size_t latent = config_.routed_expert_hidden_size;
  const size_t back = latent * std::max<size_t>(1, config_.num_experts_per_token /
                                                       static_cast<size_t>(jobs_.size()));
  std::vector<float> out(latent, 0.0f);
  out[0] = static_cast<float>(back);
  static const Tag kPingTag[] = {kPing};
  constexpr int kPings = 15;
  for (size_t r = 1; r < jobs_.size(); ++r) {
    const int to = static_cast<int>(r);
    std::vector<double> times;
    for (int i = 0; i < kPings; ++i) {
      const auto t0 = Clock::now();
      absl::Status s = PostSend(to, kPing, out);
      if (s.ok()) s = WaitSends(Timeout());
      auto m = s.ok() ? Await(to, kPingTag, Timeout()) : absl::StatusOr<Incoming>(s);
      std::vector<float> pong;
      if (m.ok()) s = Receive(*m, pong);
      if (!m.ok() || !s.ok()) return m.ok() ? s : m.status();
      times.push_back(SecondsSince(t0));
    }
    std::nth_element(times.begin(), times.begin() + kPings / 2, times.end());
    traffic_[r].ping_seconds = times[kPings / 2];
    traffic_[r].ping_bytes = (latent + back) * sizeof(float);
  }
  return absl::OkStatus();
}

DistributedExperts::DistributedExperts(const ModelConfig& config, ExpertProvider& local,
                                       ExpertPartition partition,
                                       const std::vector<RankCapacity>& capacity)
    : config_(config), local_(local), partition_(std::move(partition)) {
  const World& w = world();
  jobs_.resize(static_cast<size_t>(w.size));
  for (int r = 0; r < w.size; ++r) {
    traffic_.push_back({.rank = r, .host = w.hosts[r]});
    traffic_.back().capacity = capacity[static_cast<size_t>(r)];
  }
}

std::string DistributedExperts::Describe() const {
  std::string out =
      absl::StrCat("  ranks                 ", partition_.ranks(),
                   " (expert parallelism), experts a layer: ", partition_.Describe(), "\n");
  for (const RankTraffic& t : traffic_) {
    if (t.rank == 0) continue;
    absl::StrAppend(&out, "    ", Name(t.rank), ": expert cache ",
                    absl::StrFormat("%.2f GB", static_cast<double>(t.capacity.cache_bytes) / 1e9),
                    ", round trip ", absl::StrFormat("%.0f", 1e6 * t.ping_seconds),
                    " us for a decode layer's ",
                    absl::StrFormat("%.1f", static_cast<double>(t.ping_bytes) / 1e3), " KB\n");
  }
  return out;
}

absl::Status DistributedExperts::Start(int64_t layer, std::span<const int32_t> experts,
                                       std::span<const size_t> counts,
                                       std::span<const size_t> tokens, std::span<const float> x) {
  layer_ = layer;
  started_ = Clock::now();
  for (Job& j : jobs_) j = Job{};
  const size_t latent = config_.routed_expert_hidden_size;
  // row_in[r][t]: where token t's row is in rank r's rows (-1: not sent yet).
  std::vector<std::vector<int64_t>> row_in(jobs_.size());
  size_t at = 0;
  for (size_t i = 0; i < experts.size(); ++i) {
    const auto r = static_cast<size_t>(partition_.owner(layer, experts[i]));
    Job& j = jobs_[r];
    j.at.push_back(at);
    j.ids.push_back(experts[i]);
    j.counts.push_back(static_cast<int64_t>(counts[i]));
    for (size_t k = at; k < at + counts[i]; ++k) {
      const size_t t = tokens[k];
      if (row_in[r].size() <= t) row_in[r].resize(t + 1, -1);
      if (row_in[r][t] < 0) {
        row_in[r][t] = static_cast<int64_t>(j.rows.size() / latent);
        j.rows.insert(j.rows.end(), x.begin() + static_cast<ptrdiff_t>(t * latent),
                      x.begin() + static_cast<ptrdiff_t>((t + 1) * latent));
      }
      j.row_of.push_back(row_in[r][t]);
    }
    at += counts[i];
  }
  for (size_t r = 1; r < jobs_.size(); ++r) {
    Job& j = jobs_[r];
    if (j.ids.empty()) continue;
    // {layer, experts, rows, expert ids..., row counts..., each pair's row...}
    j.header = {layer, static_cast<int64_t>(j.ids.size()),
                static_cast<int64_t>(j.rows.size() / latent)};
    for (const auto* part : {&j.ids, &j.counts, &j.row_of}) {
      j.header.insert(j.header.end(), part->begin(), part->end());
    }
    const int to = static_cast<int>(r);
    absl::Status s = PostSend(to, kJob, j.header);
    if (s.ok()) s = PostSend(to, kRows, j.rows);
    if (!s.ok()) FailJob(s);
    const uint64_t bytes = j.header.size() * sizeof(int64_t) + j.rows.size() * sizeof(float);
    traffic_[r].bytes_out += bytes;
    metrics_.exchange_bytes += bytes;
    ++traffic_[r].layers;
  }
  return absl::OkStatus();
}

absl::Status DistributedExperts::Finish(std::span<float> products) {
  const auto t0 = Clock::now();
  const size_t latent = config_.routed_expert_hidden_size;
  static const Tag kProductsTag[] = {kProducts};
  absl::Status status = WaitSends(Timeout());
  if (status.ok()) guesses_.clear();  // every send, the guesses' too, is done
  for (size_t r = 1; status.ok() && r < jobs_.size(); ++r) {
    Job& j = jobs_[r];
    if (j.ids.empty()) continue;
    const int from = static_cast<int>(r);
    auto m = Await(from, kProductsTag, Timeout());
    std::vector<float> got;
    status = m.ok() ? Receive(*m, got) : m.status();
    if (status.ok() && got.size() != j.row_of.size() * latent + 1) {
      status = absl::InternalError(absl::StrCat(Name(from), " returned ", got.size() / latent,
                                                " products for ", j.row_of.size(), " rows"));
    }
    if (!status.ok()) break;
    traffic_[r].seconds += SecondsSince(started_);
    traffic_[r].worker_seconds += got.empty() ? 0.0f : got.back();  // (never empty here)
    traffic_[r].bytes_back += got.size() * sizeof(float);
    metrics_.exchange_bytes += got.size() * sizeof(float);
    size_t from_at = 0;
    for (size_t k = 0; k < j.at.size(); ++k) {
      const auto n = static_cast<size_t>(j.counts[k]) * latent;
      std::copy_n(got.data() + from_at, n, products.data() + j.at[k] * latent);
      from_at += n;
    }
  }
  metrics_.exchange_wait_seconds += SecondsSince(t0);
  if (!status.ok()) {
    FailJob(absl::Status(status.code(), absl::StrCat("layer ", layer_, ": ", status.message())));
  }
  return absl::OkStatus();
}

void DistributedExperts::ForwardGuesses(int64_t layer, const std::vector<int32_t>& experts) {
  // Layers without another rank's experts have no Finish to complete the sends: bound them.
  if (guesses_.size() > 256) {
    if (absl::Status s = WaitSends(Timeout()); !s.ok()) FailJob(s);
    guesses_.clear();
  }
  std::vector<std::vector<int64_t>> by_rank(jobs_.size());
  for (int32_t e : experts) {
    auto& g = by_rank[static_cast<size_t>(partition_.owner(layer, e))];
    if (g.empty()) g.push_back(layer);
    g.push_back(e);
  }
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (by_rank[r].empty()) continue;
    guesses_.push_back(std::move(by_rank[r]));
    // A guess that cannot be sent costs nothing: the layer's job will find out.
    (void)PostSend(static_cast<int>(r), kPrefetch, guesses_.back());
    traffic_[r].bytes_out += guesses_.back().size() * sizeof(int64_t);
    metrics_.exchange_bytes += guesses_.back().size() * sizeof(int64_t);
  }
}

void DistributedExperts::TakeMetrics(StepMetrics& m) {
  m.Add(metrics_);
  metrics_ = {};
}

}  // namespace k3::ranks
