// The engine side of `k3 serve`: one thread drives the BatchScheduler, so that every request
// in flight shares each trunk pass and each expert read; HTTP threads hand requests in and read
// their tokens out through a Job. A request waits in a bounded queue until a place in the
// batch frees; a full queue is refused at once (HTTP 429). A job cancelled by its client (a
// stream that disconnected) leaves the batch before the next step and frees its state.
//
// With a prompt cache (pipeline/prompt_cache.h: the saved states in memory, and a directory
// that outlives a restart), every request keeps its state one token short of its prompt's end,
// after its prompt and at its end, and a new request resumes the longest cached state its tokens
// extend: the tokens and logits are the same as running the whole prompt, only fewer tokens run.
//
// Draining (Drain, on SIGTERM): new requests are refused as unavailable (HTTP 503) while those
// in flight, live or waiting, run to their end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/server/engine_events.h"
#include "core/model/logprobs.h"
#include "pipeline/batch_scheduler.h"
#include "pipeline/engine.h"
#include "pipeline/prompt_cache.h"

namespace k3::server {

// One request's tokens as they come, read by the HTTP thread that owns the request.
class Job {
 public:
  // A point of the prompt's progress: its tokens done (the cached ones included) and the
  // milliseconds since the request joined the batch.
  struct PromptPoint {
    int64_t processed = 0;
    double ms = 0;
  };
  struct Progress {
    std::vector<int32_t> ids;            // the tokens sampled after the first `seen`
    std::vector<TokenLogprob> logprobs;  // theirs, when the request asked (set_logprobs)
    // With prompt log probabilities asked: those of prompt tokens 1.. given the ones before,
    // complete once the prompt has run; given only to a Wait from the start (seen 0) that sees
    // a token or the end.
    std::vector<TokenLogprob> prompt_logprobs;
    bool done = false;
    FinishReason finish = FinishReason::kLength;
    absl::Status status;        // a failed step ends every live job with its error
    int64_t prompt_tokens = 0;  // the whole prompt
    int64_t cached_tokens = 0;  // of them, resumed from a saved state rather than run
    // The prompt's progress after the first `points_seen` points: one when the request is
    // admitted (the cached tokens), then one after each layer of the prompt's chunks that
    // counts more tokens done (BatchEvents::on_prompt_progress), rising.
    std::vector<PromptPoint> prompt_points;
  };

  // Not following the prompt's progress (Wait's `points_seen`).
  static constexpr size_t kNoProgress = std::numeric_limits<size_t>::max();
  // Waits until there are more than `seen` tokens or the job is done (or, following the
  // progress, more than `points_seen` prompt points), or `timeout` passes.
  Progress Wait(size_t seen, std::chrono::milliseconds timeout, size_t points_seen = kNoProgress);
  // Ends the job at the next layer of the engine (its tokens so far stay; it finishes as
  // interrupted).
  void Cancel();
  bool cancelled() const { return cancelled_; }

 private:
  friend class GenerationService;
  void Push(int32_t id, std::span<const float> logits);
  void PushPromptLogprob(int32_t id, std::span<const float> logits);
  void PushPromptPoint(int64_t run, double ms);  // `run`: the prompt's tokens run, uncached
  void Finish(FinishReason finish, absl::Status status);

  std::mutex mu_;
  std::condition_variable cv_;
  Progress progress_;
  std::atomic<bool> cancelled_{false};
  const Engine* clock_ = nullptr;               // its layers_run() at Cancel ...
  std::atomic<int64_t> cancelled_at_layer_{0};  // ... kept here
  int top_logprobs_ = -1;                       // -1: no log probabilities
  BatchRequest request_;                        // until the engine thread takes it
};

struct ServiceOptions {
  BatchOptions batch;                   // the context and the prompt chunk are the engine's
  int max_queue = 64;                   // requests waiting for a place; more are refused
  PromptCache* prompt_cache = nullptr;  // prefix reuse (null: none); outlives the service
};

// Counters for /metrics, read as one consistent copy.
struct ServiceStats {
  BatchTotals totals;
  int64_t queued = 0, live = 0, saved_states = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;  // completion tokens: totals.sampled_tokens
  // The most layers the engine ran between a request's cancellation and its place freeing:
  // at most 1 with one place in the batch (the layer in progress finishes).
  int64_t cancel_layers_max = 0;
  int64_t layers_run = 0;  // by the engine, over every step
  double last_step_seconds = 0;
  std::vector<io::DeviceReport> devices;  // each drive read from, since the engine opened
  // The state memory, for the gateway's gauges (docs/SCALE.md): the places of the batch, what
  // the live sequences' states hold now, and what the plan reserves for the batch's states (each
  // at the planned context). Saved states (the prompt cache) are not counted: they are
  // evictable, as vLLM counts its cached free blocks.
  int64_t places = 0;
  uint64_t live_state_bytes = 0;
  uint64_t state_bytes_capacity = 0;
  int64_t planned_states = 0;  // states the plan reserves: the batch's and the saved ones
  int64_t context = 0;         // tokens a state holds at most
  bool prefix_cache = false;   // a request may resume a saved state
  bool draining = false;       // Drain was called: no new requests
};

class GenerationService {
 public:
  GenerationService(Engine& engine, const ServiceOptions& options);
  ~GenerationService();  // Stop()

  // ResourceExhausted when max_queue requests wait already, InvalidArgument for one that can
  // never run (its prompt fills the context, bad sampler settings).
  // `top_logprobs` >= 0: the job records each token's log probabilities.
  // With prompt_logprobs (and top_logprobs >= 0) the job also reports its prompt's log
  // probabilities; such a request runs its whole prompt (never resumed from the prompt cache).
  absl::StatusOr<std::shared_ptr<Job>> Submit(BatchRequest request, int top_logprobs = -1,
                                              bool prompt_logprobs = false);
  // Ends the live jobs as interrupted and the engine thread; idempotent.
  void Stop();
  // Refuses new requests (Unavailable) from now on; those in flight go on to their end.
  void Drain();
  // Requests submitted and not yet ended (live or waiting).
  int64_t in_flight() const;

  ServiceStats stats() const;
  // The engine seen live (GET /k3/events): each step's figures, while a client listens.
  EngineEvents& events() { return events_; }
  const ServiceOptions& options() const { return options_; }
  int64_t max_context() const { return engine_.max_context(); }

 private:
  void Loop();
  void Admit(std::vector<std::shared_ptr<Job>>& incoming);
  BatchEvents Events();
  void OnDone(BatchResult& result);
  void End(Job& job, FinishReason finish, absl::Status status);  // the job's last word
  void PublishGauges();  // the scheduler's live and waiting sequences into stats_ (mu_ held)
  void PublishStep();    // the last step's figures to events_

  const Engine& engine_;  // its layer clock and context
  ServiceOptions options_;
  BatchScheduler scheduler_;                     // engine thread only
  std::map<size_t, std::shared_ptr<Job>> jobs_;  // engine thread only: by scheduler index

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Job>> inbox_;
  int64_t in_flight_ = 0;  // submitted and not yet ended
  bool stopping_ = false;
  bool draining_ = false;
  ServiceStats stats_;
  int64_t prompt_cache_hits_ = 0;  // requests resumed from the prompt cache (engine thread)
  // The drives as of the last step published, and its number (engine thread).
  std::vector<io::DeviceReport> devices_;
  uint64_t devices_step_ = std::numeric_limits<uint64_t>::max();
  EngineEvents events_;
  std::thread thread_;
};

}  // namespace k3::server
