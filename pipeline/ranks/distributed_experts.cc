#include "pipeline/ranks/distributed_experts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipeline/busy_clock.h"
#include "pipeline/ranks/comm.h"

namespace k3::ranks {
namespace {

using Clock = std::chrono::steady_clock;

// Each worker's answer to kHello.
absl::StatusOr<WorkerInfo> AskWorker(int rank) {
  static const Tag kInfoTag[] = {kInfo};
  auto m = Await(rank, kInfoTag, Timeout(/*open=*/true));
  if (!m.ok()) return m.status();
  std::string text;
  if (absl::Status s = Receive(*m, text); !s.ok()) return s;
  auto info = DecodeWorkerInfo(text);
  if (!info.ok())
    return absl::InternalError(absl::StrCat(Name(rank), ": ", info.status().message()));
  if (!info->error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(rank), " could not open its experts: ", info->error));
  }
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedExperts>> DistributedExperts::Connect(
    const ModelConfig& config, ExpertProvider& local, const RankCapacity& own,
    const RankIdentity& identity) {
  const World& w = world();
  static const int64_t kOpen[1] = {0};
  for (int r = 1; r < w.size; ++r) {
    if (absl::Status s = PostSend(r, kHello, std::span(kOpen)); !s.ok()) return s;
  }
  std::vector<RankCapacity> capacity = {own};
  absl::Status refused;  // the first rank refused; every answer is taken first
  for (int r = 1; r < w.size; ++r) {
    auto info = AskWorker(r);
    // A rank that could not open its checkpoint, or is refused, is alive and exits when told;
    // one that did not answer may not be.
    if (!info.ok() && !absl::IsFailedPrecondition(info.status())) FailJob(info.status());
    absl::Status s = info.ok() ? CheckLikeRank0(identity, info->identity, r) : info.status();
    if (refused.ok()) refused = s;
    capacity.push_back(info.ok() ? info->capacity : RankCapacity{});
  }
  if (!refused.ok()) return refused;
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
    LayerJob& j = jobs_[r].job;
    jobs_[r].at.push_back(at);
    j.experts.push_back(experts[i]);
    j.counts.push_back(counts[i]);
    for (size_t k = at; k < at + counts[i]; ++k) {
      const size_t t = tokens[k];
      if (row_in[r].size() <= t) row_in[r].resize(t + 1, -1);
      if (row_in[r][t] < 0) {
        row_in[r][t] = static_cast<int64_t>(j.rows.size() / latent);
        j.rows.insert(j.rows.end(), x.begin() + static_cast<ptrdiff_t>(t * latent),
                      x.begin() + static_cast<ptrdiff_t>((t + 1) * latent));
      }
      j.row_of.push_back(static_cast<size_t>(row_in[r][t]));
    }
    at += counts[i];
  }
  for (size_t r = 1; r < jobs_.size(); ++r) {
    Job& j = jobs_[r];
    if (j.job.experts.empty()) continue;
    j.job.layer = layer;
    j.header = EncodeJobHeader(j.job, latent);
    const int to = static_cast<int>(r);
    absl::Status s = PostSend(to, kJob, j.header);
    if (s.ok()) s = PostSend(to, kRows, j.job.rows);
    if (!s.ok()) FailJob(s);
    const uint64_t bytes = j.header.size() * sizeof(int64_t) + j.job.rows.size() * sizeof(float);
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
    const Job& j = jobs_[r];
    if (j.job.experts.empty()) continue;
    const int from = static_cast<int>(r);
    auto m = Await(from, kProductsTag, Timeout());
    std::vector<float> got;
    status = m.ok() ? Receive(*m, got) : m.status();
    if (!status.ok()) break;
    const uint64_t bytes = got.size() * sizeof(float);
    auto result = DecodeLayerResult(std::move(got), j.job.row_of.size(), latent);
    if (!result.ok()) {
      status = absl::Status(result.status().code(),
                            absl::StrCat(Name(from), ": ", result.status().message()));
      break;
    }
    traffic_[r].seconds += SecondsSince(started_);
    traffic_[r].worker_seconds += result->seconds;
    traffic_[r].bytes_back += bytes;
    metrics_.exchange_bytes += bytes;
    size_t from_at = 0;
    for (size_t k = 0; k < j.at.size(); ++k) {
      const size_t n = j.job.counts[k] * latent;
      std::copy_n(result->products.data() + from_at, n, products.data() + j.at[k] * latent);
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
  std::vector<LayerGuess> by_rank(jobs_.size(), LayerGuess{.layer = layer});
  for (int32_t e : experts)
    by_rank[static_cast<size_t>(partition_.owner(layer, e))].experts.push_back(e);
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (by_rank[r].experts.empty()) continue;
    guesses_.push_back(EncodeLayerGuess(by_rank[r]));
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
