// The activations of one forward step (Model::Run) in one struct, as gemma.cpp's activations.h
// does: a prompt chunk of T tokens, or a batched step whose segments stack T tokens. The memory
// plan counts them with StepScratch::Bytes, which reads the same layout the buffers are carved
// from, so a buffer the forward pass gains is planned for without a second count to keep.
#pragma once

#include <tbb/concurrent_queue.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/checkpoint/config.h"
#include "kernels/mxfp4.h"

namespace k3 {

// The most rows of one routed expert multiplied at once: a chunk whose tokens all choose one
// expert then needs no more memory than one whose tokens spread.
inline constexpr size_t kExpertRowsPerPass = 256;

class StepScratch {
 public:
  explicit StepScratch(const ModelConfig& config);

  // Bytes of the buffers of a step of `tokens` tokens (what Reserve(tokens) allocates): the
  // residual stream, a snapshot per AttnRes block, and the largest part of a layer (KDA, MLA,
  // the dense MLP or the MoE), whose buffers the other parts reuse.
  static uint64_t Bytes(const ModelConfig& config, size_t tokens);
  static uint64_t BytesPerToken(const ModelConfig& config) { return Bytes(config, 1); }
  // Bytes of one ExpertPass at kExpertRowsPerPass rows; a step holds one per expert being
  // multiplied at once.
  static uint64_t ExpertPassBytes(const ModelConfig& config);

  // Grows every buffer to hold `tokens` tokens, never shrinking: decoding after a prompt chunk
  // allocates nothing. Growing does not keep what the buffers held. Every `tokens` below is at
  // most reserved_tokens().
  void Reserve(size_t tokens);
  size_t reserved_tokens() const { return tokens_; }
  // What the token buffers hold: the sum of their capacities (the lent buffers below apart).
  uint64_t allocated_bytes() const;
  // What the expert passes made so far hold, their inputs' layouts apart (Mxfp4Activations
  // does not say its capacity).
  uint64_t expert_pass_bytes() const;
  // What the attention heads made so far hold.
  uint64_t attention_head_bytes() const;

  // The residual stream, [tokens, hidden] each: the running prefix, the layer's AttnRes mix `h`,
  // its normalised input `x` and a branch's output.
  std::span<float> prefix(size_t tokens) { return Rows(prefix_, tokens); }
  std::span<float> h(size_t tokens) { return Rows(h_, tokens); }
  std::span<float> x(size_t tokens) { return Rows(x_, tokens); }
  std::span<float> branch(size_t tokens) { return Rows(branch_, tokens); }
  // Block snapshot `block` (the prefix as the block began), [tokens, hidden].
  std::span<float> snapshot(size_t block, size_t tokens) { return Rows(snapshots_[block], tokens); }
  std::span<const float> snapshot(size_t block, size_t tokens) const {
    return {snapshots_[block].data(), tokens * hidden_};
  }

  // One part of a layer at a time: each takes its buffers from the start of the same storage.
  struct KdaBuffers {
    std::span<float> q, k, v, gate, z, o, low, beta;  // o holds the raw projections first
  };
  struct MlaBuffers {
    std::span<float> cq, q, kv, gate, o;
  };
  struct MlpBuffers {
    std::span<float> gate, up;
  };
  struct MoeBuffers {
    std::span<float> logits, z, shared, slots, agg;
    MlpBuffers shared_mlp;  // runs while the routed experts do: beside their buffers
  };
  KdaBuffers kda(size_t tokens);
  MlaBuffers mla(size_t tokens);
  MlpBuffers dense(size_t tokens);
  MoeBuffers moe(size_t tokens);

  // Buffers lent to one task at a time and kept for the next: taken from the idle ones (or made
  // when none is idle) and given back when the Loan ends.
  template <typename T>
  class Lender {
   public:
    class Loan {
     public:
      Loan(Lender& lender, std::unique_ptr<T> t) : lender_(lender), t_(std::move(t)) {}
      Loan(const Loan&) = delete;
      Loan& operator=(const Loan&) = delete;
      ~Loan() { lender_.idle_.push(std::move(t_)); }
      T& operator*() const { return *t_; }
      T* operator->() const { return t_.get(); }

     private:
      Lender& lender_;
      std::unique_ptr<T> t_;
    };
    // `prepare` readies the buffers for this use before the loan begins.
    template <typename F>
    Loan Borrow(F prepare) {
      std::unique_ptr<T> t;
      if (!idle_.try_pop(t)) t = std::make_unique<T>();
      prepare(*t);
      return Loan(*this, std::move(t));
    }
    // Calls f on each idle one; between steps, when none is lent (not safe during one).
    template <typename F>
    void ForEachIdle(F f) const {
      for (auto it = idle_.unsafe_cbegin(); it != idle_.unsafe_cend(); ++it) f(**it);
    }

   private:
    tbb::concurrent_queue<std::unique_ptr<T>> idle_;
  };

  // One routed expert's rows, up to kExpertRowsPerPass at a time: their latent input, gate, up
  // and output, and the layout of the input the products share.
  struct ExpertPass {
    std::vector<float> in, gate, up, y;
    kernels::Mxfp4Activations batch;
  };
  // A pass's buffers for `rows` rows, the caller's alone while the loan lasts. Experts are
  // multiplied on several threads at once, and a thread that waits inside a product may run
  // another expert's, so passes are lent one per use, not kept one per thread.
  Lender<ExpertPass>::Loan BorrowExpertPass(size_t rows);

  // One MLA head's attention for one token: its absorbed query and context (kv_lora_rank each)
  // and its scores over the positions it attends. Lent per head task like an ExpertPass: the
  // scores follow the context, so one per head would hold heads x context, one per task only as
  // many as run at once. The plan does not count them (at most one per thread, each under
  // 4 x (2 x kv_lora_rank + 2 x context) bytes), as it did not when each task made its own.
  struct AttentionHead {
    std::vector<float> q_hat, ctx, scores;
  };
  Lender<AttentionHead>::Loan BorrowAttentionHead(size_t positions);

 private:
  std::span<float> Rows(std::vector<float>& v, size_t tokens) {
    return {v.data(), tokens * hidden_};
  }

  const ModelConfig& config_;
  const size_t hidden_;
  size_t tokens_ = 0;
  std::vector<float> prefix_, h_, x_, branch_;
  std::vector<std::vector<float>> snapshots_;  // one per AttnRes block
  std::vector<float> part_;                    // the largest part of a layer
  Lender<ExpertPass> passes_;
  Lender<AttentionHead> heads_;
};

}  // namespace k3
