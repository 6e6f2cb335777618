// Continuous batching over Engine::Step: up to `batch` sequences decode together, so a step
// reads the trunk once and the union of their experts once for all of them. A sequence that
// ends (a stop id, its own token limit, the engine's context) leaves at once and the next
// waiting prompt takes its place; that prompt is prefilled in chunks that ride along with the
// others' decode tokens, at most the engine's prefill_chunk() prompt tokens a step, so a long
// prompt delays the others' next token by a bounded share of one step instead of a whole
// prefill. The caller hears of tokens, ends and kept states through one BatchEvents.
//
// Every sequence's tokens and logits are bit-identical to running it alone (Engine::Prefill,
// then Decode): it has its own state and sampler, and a row's arithmetic does not depend on
// the rows beside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/model/sampler.h"
#include "core/model/token_constraint.h"
#include "pipeline/engine.h"
#include "pipeline/prompt_cache.h"

namespace k3 {

struct BatchRequest {
  std::vector<int32_t> prompt;  // at least one token
  int32_t max_tokens = 32;      // tokens to sample (0: prefill only)
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids;  // a sampled stop id ends the sequence (and is its last id)
  // Prefix reuse: the state of an earlier sequence whose tokens come before `prompt`, which
  // then holds only the tokens after them. The result equals running them all from scratch.
  std::optional<SequenceState> resume;
  bool keep_prompt_state = false;  // hand a copy of the state to on_prompt_state once the
                                   // prompt has run (before the first token is sampled)
  // Positions in the sequence (tokens before it included) inside the prompt at which the state
  // is handed to on_prompt_state as well: prompt chunks are cut there, which changes no bit
  // (a prompt cache keeps the state one token short of the prompt's end, so that the same
  // prompt again resumes it and runs one token for its logits).
  std::vector<int64_t> snapshot_at;
  bool keep_final_state = false;  // hand the final state over in BatchResult::state
  // Constrained decoding (core/text/grammar/token_mask.h): masks each row of logits right before
  // sampling, and hears each sampled token. The logits on_token sees are the masked ones.
  // Null: sampling is untouched.
  std::shared_ptr<TokenConstraint> constraint;
  // The logits after each prompt token that has a successor in the prompt, in order, with that
  // successor (`next`, the token they predict), for the prompt's log probabilities (a
  // completion's echo). They cost an lm_head product per prompt token; the last token's go to
  // on_prompt_end.
  std::function<void(int32_t next, std::span<const float> logits)> on_prompt_logits;
  // Set by another thread to end the request: it leaves the step it is in at the next layer
  // (its state is then dropped, never kept) and finishes as interrupted. Outlives the request.
  const std::atomic<bool>* cancelled = nullptr;
};

// How a sequence ended.
enum class FinishReason { kStop, kLength, kContext, kInterrupted };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", ...

struct BatchResult {
  size_t index = 0;          // the request's place in the order they were added
  std::vector<int32_t> ids;  // sampled tokens, the stop id included (as `k3 generate` reports)
  FinishReason finish = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  // Seconds since Run started: admitted into the batch, first token sampled, finished.
  double admitted_at = 0, first_token_at = 0, finished_at = 0;
  double seconds_per_token() const;  // between first and last token (0 with fewer than two)
  // With keep_final_state: the state at the end, every token but the last sampled one run.
  std::optional<SequenceState> state;
};

// The caller's choices; the context and the prompt chunk otherwise come from the engine.
struct BatchOptions {
  int batch = 1;  // sequences live at once
  // Prompt tokens in one step, over all joining prompts (0: the engine's prefill_chunk()). No
  // bit of any sequence depends on it, only how long a prompt delays the others.
  int prefill_tokens_per_step = 0;
};

// Figures of a whole run: every step's metrics summed, and how the steps were made up.
struct BatchTotals {
  StepMetrics steps;
  int64_t step_count = 0;
  int64_t decode_tokens = 0;   // decode rows over all steps
  int64_t prefill_tokens = 0;  // prompt rows over all steps
  int64_t sampled_tokens = 0;
  double seconds = 0;
  int max_live = 0;  // the most sequences live in one step
  // The last step alone: its figures and rows.
  StepMetrics last_step;
  int64_t last_decode_tokens = 0, last_prefill_tokens = 0;
};

// What a scheduler tells its caller as it goes; any of them may be left empty. `index` is the
// request's, as Add returned it. `steps` are the figures of the engine steps the sequence took
// part in since its previous token (for its first token, the steps that ran its prompt).
struct BatchEvents {
  // Every sampled token, with the logits it was sampled from (masked by the request's
  // constraint).
  std::function<void(size_t index, int32_t id, std::span<const float> logits,
                     const StepMetrics& steps)>
      on_token;
  // Every sequence that ended. Non-const so that a caller can take the kept state out.
  std::function<void(BatchResult& result)> on_done;
  // Polled by Run before each step (Ctrl-C); RunStep leaves stopping to its caller.
  std::function<bool()> stop;
  // The state at the end of a prompt (with keep_prompt_state) and at its snapshot_at positions.
  std::function<void(size_t index, const SequenceState& state)> on_prompt_state;
  // After each layer of a prompt's chunk, as the step runs (a whole-prompt chunk of a large
  // model is minutes): how many of the request's prompt tokens have run (its resume state's not
  // counted), the running chunk's counted by the share of the model's layers done (rounded
  // down), and the seconds since it joined the batch. Non-decreasing; each chunk's last report
  // counts it whole, and the last chunk's comes before anything is sampled.
  std::function<void(size_t index, size_t prompt_run, double seconds)> on_prompt_progress;
  // The logits of a prompt's last token, before anything is sampled from them (also when the
  // sequence samples nothing: max_tokens 0).
  std::function<void(size_t index, std::span<const float> logits, const StepMetrics& steps)>
      on_prompt_end;
  // In RunStep, once the waiting requests have taken the free places and before the step runs:
  // live() and waiting() are then those of the step (a server's gauges read them here).
  std::function<void()> on_admitted;
};

class BatchScheduler {
 public:
  // Sequences run with `engine`'s context and, unless `options` says otherwise, its prompt
  // chunk. `events` are heard on the thread that calls Run or RunStep, inside the call.
  BatchScheduler(Engine& engine, const BatchOptions& options, BatchEvents events);
  ~BatchScheduler();

  // Queues a request; returns its index. InvalidArgument for an empty prompt or one that
  // leaves no room in the context.
  absl::StatusOr<size_t> Add(BatchRequest request);

  // Runs steps until every request has finished, `stop` says so (the live sequences then end
  // as interrupted, the waiting ones are not reported) or a step fails (its error; the
  // sequences live in it are lost, those already reported are not).
  absl::Status Run();

  // For a server, which adds requests between steps: admits waiting requests into free places
  // and runs one step. False when nothing was live or waiting (no step ran).
  absl::StatusOr<bool> RunStep();
  // Ends a request before the next step as interrupted, reported to on_done then (a waiting
  // one with no tokens). Unknown or finished indices are ignored.
  void Cancel(size_t index) { cancelled_.push_back(index); }

  size_t waiting() const { return waiting_.size(); }
  size_t live() const;
  // The bytes of the live sequences' states (SequenceState::bytes): what they hold now.
  uint64_t live_state_bytes() const;
  const BatchTotals& totals() const { return totals_; }

 private:
  struct Live;
  struct Row;
  absl::Status Step();
  std::vector<Row> PlanRows();
  LayerObserver PromptProgress(const std::vector<Row>& rows) const;
  void Advance(const Row& row, std::span<float> logits, double now);
  void Sample(Live& seq, std::span<float> logits, double now);
  void Admit();
  void EndCancelled();
  void Finish(Live& seq, FinishReason reason);

  Engine& engine_;
  const int batch_;
  const int prefill_tokens_per_step_;
  const int64_t max_context_;
  const BatchEvents events_;
  std::vector<Live> live_;
  std::vector<size_t> cancelled_;
  std::deque<std::pair<size_t, BatchRequest>> waiting_;
  size_t added_ = 0;
  BatchTotals totals_;
  // The last step's logits, kept between steps: a fresh vocabulary-sized buffer each step made
  // a decode step of the demo model 1-1.5 % slower (allocated and faulted in anew).
  std::vector<float> logits_;
  double started_ = -1;  // steady clock seconds of the first step (-1: none yet)
};

// Resumes `request` from the longest state in `cache` that its tokens (those of its resume
// state, then its prompt) extend beyond the resume state, leaving the prompt the tokens after
// it, and asks for the state a token short of the whole prompt's end (snapshot_at), where the
// same prompt again resumes and runs one token for its logits. Returns the prompt tokens the
// cache supplied.
int64_t ResumeFromPromptCache(PromptCache& cache, BatchRequest& request);

// Runs one request as a batch of one (`k3 generate`, `k3 chat` and `k3 bench` run their one
// sequence through the same loop as a server's batch): the result, also told to on_done if it
// is set, or the error of the first failed step.
absl::StatusOr<BatchResult> RunSequence(Engine& engine, BatchRequest request,
                                        const BatchEvents& events);

}  // namespace k3
