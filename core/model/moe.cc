// The Stable LatentMoE feed-forward (MODEL.md section 2): routing, the split between the experts
// this process multiplies and those another one does, the row passes, gathering the other
// processes' products, and the fixed-order sum.
#include "core/model/moe.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "core/model/model.h"
#include "kernels/model_ops.h"
#include "kernels/ops.h"

namespace k3 {
namespace {

constexpr size_t kRowsPerTask = 64;

// One product split into row tasks; every task reads the one layout of the activations.
void Mxfp4MatMulParallel(const kernels::Mxfp4Matrix& w, const kernels::Mxfp4Activations& x,
                         std::span<float> y) {
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, w.rows, kRowsPerTask),
      [&](const tbb::blocked_range<size_t>& r) {
        kernels::Mxfp4MatMul(w, x, y, r.begin(), r.end());
      },
      tbb::simple_partitioner());
}

// One routed expert's product for `n` rows of latent input `in` (n <= kExpertRowsPerPass) into
// `out`, with `pass`'s gate, up and layout buffers: SiTU-gated w1 and w3, then w2.
void RoutedExpertProduct(const ModelConfig& config, const ExpertWeights& ew,
                         std::span<const float> in, size_t n, StepScratch::ExpertPass& pass,
                         std::span<float> out) {
  const size_t latent = config.routed_expert_hidden_size, width = config.moe_intermediate_size;
  const std::span<float> g(pass.gate.data(), n * width), p(pass.up.data(), n * width);
  kernels::Mxfp4Activations& batch = pass.batch;  // gate and up share one layout of the input
  batch.Assign(in.first(n * latent), n, latent);
  Mxfp4MatMulParallel(ew.w1, batch, g);
  Mxfp4MatMulParallel(ew.w3, batch, p);
  kernels::SituGlu(g, p, g, config.situ_beta, config.situ_linear_beta);
  batch.Assign(g, n, width);
  Mxfp4MatMulParallel(ew.w2, batch, out.first(n * latent));
}

using Routes = std::vector<std::vector<kernels::RoutedExpert>>;

// Every token's top-k, routed on the full width in fp32.
Routes RouteTokens(const ModelConfig& c, const MoeWeights& w, std::span<const float> x,
                   size_t tokens, std::span<float> logits) {
  const size_t experts = c.num_experts, top = c.num_experts_per_token;
  MatMul(w.router, x, tokens, logits);
  Routes routes(tokens);
  const bool renormalize = c.moe_renormalize && top > 1;
  for (size_t t = 0; t < tokens; ++t) {
    kernels::RouteTopK(logits.subspan(t * experts, experts), w.router_bias, top, renormalize,
                       static_cast<float>(c.routed_scaling_factor), routes[t]);
  }
  return routes;
}

// Experts of a layer in ascending id, each with the (token, rank) pairs that chose it: the
// tokens whose rows it multiplies and the slots (token * top + rank) its products go to.
struct Chosen {
  std::vector<int32_t> ids;
  std::vector<std::vector<size_t>> tokens, slots;
  void Add(int32_t id, std::vector<size_t> t, std::vector<size_t> s) {
    ids.push_back(id);
    tokens.push_back(std::move(t));
    slots.push_back(std::move(s));
  }
};

Chosen GroupByExpert(const Routes& routes, size_t top) {
  std::map<int32_t, std::vector<size_t>> slots;
  for (size_t t = 0; t < routes.size(); ++t) {
    for (size_t j = 0; j < top; ++j) slots[routes[t][j].expert].push_back(t * top + j);
  }
  Chosen all;
  for (auto& [e, s] : slots) {
    std::vector<size_t> tokens(s.size());
    for (size_t k = 0; k < s.size(); ++k) tokens[k] = s[k] / top;
    all.Add(e, std::move(tokens), std::move(s));
  }
  return all;
}

// The experts this process multiplies, and those another one does (expert parallelism).
std::pair<Chosen, Chosen> SplitByProcess(Chosen all, const RemoteExperts* remote, int64_t layer) {
  if (remote == nullptr) return {std::move(all), {}};
  Chosen here, away;
  for (size_t i = 0; i < all.ids.size(); ++i) {
    (remote->Remote(layer, all.ids[i]) ? away : here)
        .Add(all.ids[i], std::move(all.tokens[i]), std::move(all.slots[i]));
  }
  return {std::move(here), std::move(away)};
}

// Hands the other processes the rows of z their experts multiply; `tokens` keeps the rows'
// numbers until Finish.
absl::Status StartRemote(RemoteExperts& remote, int64_t layer, const Chosen& away,
                         std::span<const float> z, std::vector<size_t>& tokens) {
  std::vector<size_t> counts;
  for (const std::vector<size_t>& t : away.tokens) {
    counts.push_back(t.size());
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  return remote.Start(layer, away.ids, counts, tokens, z);
}

// Collects the other processes' products (always, even after a failure here, so that no answer
// is left for a later layer) and puts each in its slot, where this process's multiply would have
// put it. Returns the first of `local`, `sent` and the collection's errors.
absl::Status GatherRemote(RemoteExperts& remote, const Chosen& away, size_t rows, size_t latent,
                          absl::Status local, const absl::Status& sent, std::span<float> slots) {
  std::vector<float> products(rows * latent);
  absl::Status got = remote.Finish(products);
  if (local.ok()) local = sent.ok() ? got : sent;
  if (!local.ok()) return local;
  size_t at = 0;
  for (const std::vector<size_t>& s : away.slots) {
    for (size_t slot : s) {
      std::copy_n(products.data() + at, latent, slots.data() + slot * latent);
      at += latent;
    }
  }
  return absl::OkStatus();
}

// Each token's experts weighted in the fixed order (descending score), the latent norm, the
// up-projection, then the shared experts added.
void SumExperts(const ModelConfig& c, const MoeWeights& w, const Routes& routes,
                const StepScratch::MoeBuffers& b, std::span<float> out) {
  const size_t latent = c.routed_expert_hidden_size, top = c.num_experts_per_token;
  const std::span<float> agg = b.agg;
  std::fill(agg.begin(), agg.end(), 0.0f);
  for (size_t t = 0; t < routes.size(); ++t) {
    std::span<float> a = agg.subspan(t * latent, latent);
    for (size_t j = 0; j < top; ++j) {
      kernels::Axpy(routes[t][j].weight, {b.slots.data() + (t * top + j) * latent, latent}, a);
    }
    if (c.latent_moe_use_norm) {
      kernels::RmsNorm(a, w.latent_norm, static_cast<float>(c.rms_norm_eps), a);
    }
  }
  MatMul(w.latent_up, agg, routes.size(), out);
  for (size_t i = 0; i < b.shared.size(); ++i) out[i] += b.shared[i];
}

}  // namespace

void ExpertRows(const ModelConfig& config, const ExpertWeights& ew, std::span<const float> x,
                std::span<const size_t> from, std::span<const size_t> to, StepScratch& scratch,
                std::span<float> out) {
  const size_t latent = config.routed_expert_hidden_size;
  const size_t pass = std::min(from.size(), kExpertRowsPerPass);
  const auto buffers = scratch.BorrowExpertPass(pass);
  const std::span<float> in = buffers->in, y = buffers->y;
  for (size_t first = 0; first < from.size(); first += pass) {
    const size_t n = std::min(pass, from.size() - first);
    for (size_t r = 0; r < n; ++r) {
      std::copy_n(x.data() + from[first + r] * latent, latent, in.data() + r * latent);
    }
    RoutedExpertProduct(config, ew, in, n, *buffers, y);
    for (size_t r = 0; r < n; ++r) {
      std::copy_n(y.data() + r * latent, latent, out.data() + to[first + r] * latent);
    }
  }
}

absl::Status Model::Moe(int64_t layer, const MoeWeights& w, std::span<const float> x, size_t tokens,
                        std::span<float> out) {
  const StepScratch::MoeBuffers b = scratch_.moe(tokens);
  const Routes routes = RouteTokens(config_, w, x, tokens, b.logits);
  RemoteExperts* remote = experts_.remote();
  // Named references, not structured bindings: the lambda below captures them (clang 14 refuses
  // to capture a binding).
  const std::pair<Chosen, Chosen> split =
      SplitByProcess(GroupByExpert(routes, config_.num_experts_per_token), remote, layer);
  const Chosen &here = split.first, &away = split.second;
  // Reads start now, while the latent projection and the shared experts run; the other
  // processes' rows go out first, so that their products come back while ours run.
  experts_.StartFetch(layer, here.ids);
  MatMul(w.latent_down, x, tokens, b.z);
  std::vector<size_t> away_tokens;
  absl::Status sent;
  if (!away.ids.empty()) sent = StartRemote(*remote, layer, away, b.z, away_tokens);
  std::function<void()> alongside;
  if (!b.shared.empty()) {  // one fused MLP on the full width, unweighted
    alongside = [&] {
      SituMlp(w.shared_gate, w.shared_up, w.shared_down, x, tokens, b.shared_mlp, b.shared);
    };
  }
  // Each expert's products go to their own slots, whatever order the bytes arrive in.
  auto use = [&](size_t i, const ExpertWeights& ew) {
    ExpertRows(config_, ew, b.z, here.tokens[i], here.slots[i], scratch_, b.slots);
  };
  absl::Status s = experts_.ForEachExpert(layer, here.ids, use, alongside);
  if (!away.ids.empty()) {
    s = GatherRemote(*remote, away, away_tokens.size(), config_.routed_expert_hidden_size, s, sent,
                     b.slots);
  }
  if (!s.ok()) return s;
  SumExperts(config_, w, routes, b, out);
  return absl::OkStatus();
}

}  // namespace k3
