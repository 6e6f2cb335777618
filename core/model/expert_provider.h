// Where the forward pass gets routed experts from. The model asks for a layer's experts and
// multiplies each one as its bytes become available; the streaming pipeline implements this
// with the expert cache and io_uring, CheckpointExpertProvider with plain synchronous reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "core/checkpoint/checkpoint.h"
#include "kernels/mxfp4.h"

namespace k3 {

struct ExpertWeights {
  kernels::Mxfp4Matrix w1;  // gate [moe_intermediate, latent]
  kernels::Mxfp4Matrix w2;  // down [latent, moe_intermediate]
  kernels::Mxfp4Matrix w3;  // up   [moe_intermediate, latent]
};

// Views of one expert's six tensors in `bytes`, laid out as `loc` describes (the
// concatenation of its spans).
ExpertWeights ViewExpert(const ModelConfig& config, const ExpertLocation& loc,
                         std::span<const uint8_t> bytes);

// Invariant 2 of DESIGN.md: an expert is used only after all its bytes arrived and were
// checked. Refuses a wrong length and E8M0 scale bytes 0xFF (NaN, MODEL.md 0 Q3), naming the
// tensor and where it lies in which file.
absl::Status CheckExpertBytes(const Checkpoint& ckpt, int64_t layer, int64_t expert,
                              std::span<const uint8_t> bytes);

using ExpertUse = std::function<void(size_t, const ExpertWeights&)>;

// Routed experts whose products another process computes (expert parallelism,
// pipeline/ranks/): the model hands it the rows routed to those experts and places each returned
// product where its own multiply would have put it, so the weighted sum is the same, in the same
// order, bit for bit.
class RemoteExperts {
 public:
  virtual ~RemoteExperts() = default;
  // Whether another process computes `expert` of `layer`.
  virtual bool Remote(int64_t layer, int32_t expert) const = 0;
  // Starts the products of `layer`: experts[i] multiplies counts[i] rows of `x` ([tokens,
  // routed_expert_hidden_size]), the rows numbered by `tokens` (the experts' lists one after
  // the other). Returns at once; the model runs its own experts meanwhile. `x` must stay valid
  // until Finish.
  virtual absl::Status Start(int64_t layer, std::span<const int32_t> experts,
                             std::span<const size_t> counts, std::span<const size_t> tokens,
                             std::span<const float> x) = 0;
  // Waits for the products of the last Start, one row for each of its `tokens`, in order. An error
  // names the process (and its host) that failed or did not answer in time; Finish is still called
  // after a failed Start or a failed local expert, so that no answer is left for a later layer.
  virtual absl::Status Finish(std::span<float> products) = 0;
};

// Per layer the model calls Lookahead (every layer, with its feed-forward input), then for a
// MoE layer StartFetch as soon as the router has chosen, then ForEachExpert.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  // The normalised feed-forward input of `layer` [tokens, hidden]: a streaming provider
  // predicts later layers' experts from it and starts reading them.
  virtual void Lookahead(int64_t layer, std::span<const float> x, size_t tokens) {
    (void)layer, (void)x, (void)tokens;
  }
  // The experts `layer` will use (sorted, unique): reads may start now, before ForEachExpert.
  virtual void StartFetch(int64_t layer, std::span<const int32_t> experts) {
    (void)layer, (void)experts;
  }
  // Fetches `experts` of `layer` and calls use(i, weights) once for each experts[i] when its
  // bytes are in and checked, in any order and possibly from several threads at once. The
  // views are valid only during the call. `alongside` (may be empty) is work that needs no
  // expert: it runs once, while experts load where the provider overlaps. Returns the first
  // error (it names file and offset or tensor); an expert is never skipped.
  virtual absl::Status ForEachExpert(int64_t layer, std::span<const int32_t> experts,
                                     const ExpertUse& use,
                                     const std::function<void()>& alongside) = 0;
  // Where some experts are computed by other processes: those ForEachExpert is never asked for.
  virtual RemoteExperts* remote() { return nullptr; }
};

// Reads experts straight from the checkpoint, one at a time (page cache, no streaming); the
// baseline the pipeline is compared with and what the model tests use.
class CheckpointExpertProvider : public ExpertProvider {
 public:
  explicit CheckpointExpertProvider(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  absl::Status ForEachExpert(int64_t layer, std::span<const int32_t> experts, const ExpertUse& use,
                             const std::function<void()>& alongside) override;

 private:
  const Checkpoint& ckpt_;
};

}  // namespace k3
