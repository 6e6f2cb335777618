// The Kimi K3 forward pass (MODEL.md section 2): embedding, 93 layers of KDA or MLA attention
// and a dense or Stable LatentMoE feed-forward, joined by Block Attention Residuals, then the
// final AttnRes, norm and lm_head. It runs a chunk of tokens per call (prefill) or one
// (decode), carrying state in a SequenceState; a token's arithmetic is the same whichever
// chunk it is in, so incremental decoding and full recompute agree bit for bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/checkpoint/config.h"
#include "core/checkpoint/tensor_names.h"
#include "core/model/expert_provider.h"
#include "core/model/sequence_state.h"
#include "core/model/step_scratch.h"
#include "core/model/weights.h"

namespace k3 {

// Per-layer hook: called after each layer with the token count and the layer's output prefix
// P [tokens, hidden] (for tests that check activations layer by layer).
using LayerObserver = std::function<void(int64_t layer, std::span<const float> prefix)>;

// Where the model gets the trunk: every layer resident, or a streamer whose matrices arrive in
// pieces (Matrix::source) and which reads embedding rows on demand.
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  // Layer `layer`'s weights (router included), valid until ReleaseLayer(layer).
  virtual absl::StatusOr<const LayerWeights*> AcquireLayer(int64_t layer) = 0;
  virtual void ReleaseLayer(int64_t layer) = 0;
  // The embedding rows of `ids`, widened to fp32, into out [ids.size(), hidden].
  virtual absl::Status Embed(std::span<const int32_t> ids, std::span<float> out) = 0;
  // The first error of a streamed piece since the last call (the model asks after each layer
  // and after lm_head, so that a piece that failed fails the token, never changes it).
  virtual absl::Status TakeError() { return absl::OkStatus(); }
};

// The embedding rows of `ids` from a resident embedding matrix.
void EmbedResident(const Matrix& embed, std::span<const int32_t> ids, std::span<float> out);

// One sequence's share of a batched step: its next tokens (a prompt chunk, or the one token
// to decode) and its state. The rows of every segment go through each trunk product and each
// expert together; attention runs per segment on its own state.
struct BatchSegment {
  std::span<const int32_t> ids;
  SequenceState* state = nullptr;
  // Hears the logits after every one of `ids` (row i: the distribution of the token after
  // ids[i]), in order, for a prompt's log probabilities. Costs an lm_head product per
  // kPositionLogitsRows rows.
  std::function<void(size_t row, std::span<const float> logits)> on_position_logits;
  // Polled between layers (set by another thread): once true the segment leaves the step, its
  // rows no longer computed. Its state is then half-run and must be dropped; its logits are
  // zeros. Null: never.
  const std::atomic<bool>* cancelled = nullptr;
};

// Rows of position logits computed at once (kPositionLogitsRows x vocab floats).
inline constexpr size_t kPositionLogitsRows = 64;

class Model {
 public:
  // Every layer resident in `trunk`.
  Model(const ModelConfig& config, const TrunkWeights& trunk, ExpertProvider& experts);
  // Layers from `layers` (the globals from `trunk`).
  Model(const ModelConfig& config, const TrunkWeights& trunk, ExpertProvider& experts,
        LayerSource& layers)
      : config_(config), trunk_(trunk), experts_(experts), layers_(&layers), scratch_(config) {}

  // Steps (Forward, ForwardBatch) run one at a time: they share the model's step scratch.
  // Runs `ids` after the tokens already in `state` and appends them to it. Writes the logits
  // of the last token ([vocab]) or, with all_positions, of every token ([ids.size(), vocab]).
  // Ids outside the vocabulary are InvalidArgument; I/O and corrupt experts are errors that
  // leave `state` unusable.
  absl::Status Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                       std::vector<float>& logits, const LayerObserver& observer = {});

  // Runs every segment one step: one trunk pass and one read of the union of their experts.
  // Writes the logits of each segment's last token ([segments.size(), vocab], in order). Each
  // segment's logits and state are bit-identical to running it alone (a row's arithmetic does
  // not depend on the rows beside it). Two segments may not share a state. A segment cancelled
  // during the step leaves it at the next layer; the step ends there when none is left.
  absl::Status ForwardBatch(std::span<const BatchSegment> segments, std::vector<float>& logits,
                            const LayerObserver& observer = {});

  const ModelConfig& config() const { return config_; }
  // Layers run since the model was made, over every step: a clock in layers, by which a
  // cancellation is measured (it takes effect at the next layer).
  int64_t layers_run() const { return layers_run_.load(std::memory_order_relaxed); }
  // The activations of a step, grown to the most tokens a step has run.
  const StepScratch& step_scratch() const { return scratch_; }

  // A segment's rows in the stacked activations.
  struct Rows {
    size_t first = 0, count = 0;
    SequenceState* state = nullptr;
    size_t segment = 0;  // its place among the step's segments, and so in the step's logits
    const std::atomic<bool>* cancelled = nullptr;  // the segment's (null: it runs to the end)
  };

 private:
  absl::Status Run(std::span<const BatchSegment> segments, bool all_positions,
                   std::vector<float>& logits, const LayerObserver& observer);
  // Mixes the first `blocks` snapshots and `prefix` into `out`.
  void AttnRes(size_t blocks, std::span<const float> prefix, size_t tokens,
               std::span<const float> fold, std::span<float> out) const;
  void Kda(int64_t layer, const KdaWeights& w, std::span<const float> x, std::span<const Rows> rows,
           size_t tokens, const StepScratch::KdaBuffers& b, std::span<float> out) const;
  void Mla(int64_t layer, const MlaWeights& w, std::span<const float> x, std::span<const Rows> rows,
           size_t tokens, const StepScratch::MlaBuffers& b, std::span<float> out);
  void SituMlp(const Matrix& gate_w, const Matrix& up_w, const Matrix& down_w,
               std::span<const float> x, size_t tokens, const StepScratch::MlpBuffers& b,
               std::span<float> out) const;
  // The Stable LatentMoE feed-forward (core/model/moe.cc).
  absl::Status Moe(int64_t layer, const MoeWeights& w, std::span<const float> x, size_t tokens,
                   std::span<float> out);
  // Runs layer `layer` on the scratch's prefix; `blocks` counts the snapshots taken so far.
  absl::Status Layer(int64_t layer, const LayerWeights& lw, std::span<const Rows> rows,
                     size_t tokens, size_t& blocks);
  void NormRows(std::span<const float> x, size_t tokens, std::span<const float> weight, float eps,
                std::span<float> out) const;
  void PositionLogits(std::span<const float> x, const Rows& rows,
                      const std::function<void(size_t, std::span<const float>)>& hear) const;

  const ModelConfig& config_;
  const TrunkWeights& trunk_;
  ExpertProvider& experts_;
  std::unique_ptr<LayerSource> resident_;  // when every layer is in `trunk_`
  LayerSource* layers_ = nullptr;
  std::atomic<int64_t> layers_run_{0};
  StepScratch scratch_;  // one step runs at a time
};

// The matrices of `layer` in the order Model::Layer multiplies them (the router at its place).
// It lives beside the forward pass because the trunk streamer reads streamed pieces in this
// order and the memory plan takes `whole` from it: a product moved in model.cc must move here in
// the same change (a trunk stream test counts pieces asked for out of order).
struct OrderedMatrix {
  std::string name;
  bool whole = false;  // used row by row (WholeMatrix): streamed as one piece
};
std::vector<OrderedMatrix> LayerMatrixOrder(const ModelConfig& config, const TensorNames& names,
                                            int64_t layer);

}  // namespace k3
