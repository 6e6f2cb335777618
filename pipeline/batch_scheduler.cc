#include "pipeline/batch_scheduler.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kInterrupted:
      return "interrupted";
  }
  return "unknown";
}

double BatchResult::seconds_per_token() const {
  return ids.size() > 1 ? (finished_at - first_token_at) / static_cast<double>(ids.size() - 1) : 0;
}

// A sequence in the batch: its state, its sampler, how much of its prompt has run, and the
// token it decodes next.
struct BatchScheduler::Live {
  BatchRequest request;
  BatchResult result;
  SequenceState state;
  Sampler sampler;
  size_t prefilled = 0;  // prompt tokens already run
  int32_t next = -1;     // the last sampled token, decoded in the next step
  bool dropped = false;  // cancelled during a step: the state is half-run

  bool decoding() const { return prefilled == request.prompt.size(); }
  bool cancelled() const {
    return request.cancelled != nullptr && request.cancelled->load(std::memory_order_relaxed);
  }
  // The segment of the next step: its prompt's next `chunk` tokens, or the token to decode.
  BatchSegment Segment(size_t chunk) {
    BatchSegment segment{.state = &state, .cancelled = request.cancelled};
    if (decoding()) {
      segment.ids = {&next, 1};
      return segment;
    }
    segment.ids = {request.prompt.data() + prefilled, chunk};
    if (request.on_prompt_logits) {
      segment.on_position_logits = [this, first = prefilled](size_t row, auto logits) {
        const size_t next = first + row + 1;
        if (next < request.prompt.size()) request.on_prompt_logits(request.prompt[next], logits);
      };
    }
    return segment;
  }
  // The prompt tokens the next chunk may run: up to the next snapshot position, if any.
  size_t ChunkRoom() const {
    const size_t left = request.prompt.size() - prefilled;
    for (int64_t at : request.snapshot_at) {
      if (at > state.position() && at - state.position() < static_cast<int64_t>(left)) {
        return static_cast<size_t>(at - state.position());
      }
    }
    return left;
  }
};

BatchScheduler::BatchScheduler(Engine& engine, const BatchOptions& options)
    : engine_(engine), options_(options) {
  options_.batch = std::max(1, options_.batch);
  options_.prefill_tokens_per_step = std::max(1, options_.prefill_tokens_per_step);
}

BatchScheduler::~BatchScheduler() = default;

size_t BatchScheduler::live() const { return live_.size(); }

absl::StatusOr<size_t> BatchScheduler::Add(BatchRequest request) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  const int64_t before = request.resume ? request.resume->position() : 0;
  const int64_t tokens = before + static_cast<int64_t>(request.prompt.size());
  if (tokens >= options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", tokens, " tokens, the context holds ", options_.max_context));
  }
  if (request.max_tokens < 0) return absl::InvalidArgumentError("max tokens must be >= 0");
  if (absl::Status s = ValidateSamplerOptions(request.sampler); !s.ok()) return s;
  waiting_.emplace_back(added_, std::move(request));
  return added_++;
}

void BatchScheduler::Admit() {
  while (static_cast<int>(live_.size()) < options_.batch && !waiting_.empty()) {
    auto [index, request] = std::move(waiting_.front());
    waiting_.pop_front();
    Sampler sampler(request.sampler);
    SequenceState state = request.resume ? std::move(*request.resume) : engine_.NewState();
    request.resume.reset();
    std::sort(request.snapshot_at.begin(), request.snapshot_at.end());
    Live seq{std::move(request), {}, std::move(state), std::move(sampler)};
    seq.result.index = index;
    seq.result.prompt_tokens =
        seq.state.position() + static_cast<int64_t>(seq.request.prompt.size());
    seq.result.admitted_at = Now() - started_;
    live_.push_back(std::move(seq));
  }
}

void BatchScheduler::Finish(Live& seq, FinishReason reason, const DoneFn& on_done) {
  seq.result.finish = reason;
  seq.result.finished_at = Now() - started_;
  if (seq.request.keep_final_state && !seq.dropped) seq.result.state = std::move(seq.state);
  if (on_done) on_done(seq.result);
}

void BatchScheduler::EndCancelled(const DoneFn& on_done) {
  for (const size_t index : cancelled_) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->first != index) continue;
      BatchResult result;
      result.index = index;
      result.finish = FinishReason::kInterrupted;
      result.admitted_at = result.finished_at = Now() - started_;
      waiting_.erase(it);
      if (on_done) on_done(result);
      break;
    }
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (it->result.index != index) continue;
      Finish(*it, FinishReason::kInterrupted, on_done);
      live_.erase(it);
      break;
    }
  }
  cancelled_.clear();
}

absl::Status BatchScheduler::Step(const TokenFn& on_token, const DoneFn& on_done) {
  std::vector<Live>& live = live_;
  // Decode rows first, then prompt chunks in the order the prompts joined, up to the share.
  std::vector<BatchSegment> segments;
  std::vector<size_t> owner;  // segment -> live sequence
  std::vector<size_t> chunk(live.size(), 0);
  int share = options_.prefill_tokens_per_step;
  for (size_t i = 0; i < live.size(); ++i) {
    if (live[i].decoding()) {
      segments.push_back(live[i].Segment(1));
      owner.push_back(i);
      ++totals_.decode_tokens;
    }
  }
  for (size_t i = 0; i < live.size() && share > 0; ++i) {
    if (live[i].decoding()) continue;
    chunk[i] = std::min<size_t>(share, live[i].ChunkRoom());
    share -= static_cast<int>(chunk[i]);
    segments.push_back(live[i].Segment(chunk[i]));
    owner.push_back(i);
    totals_.prefill_tokens += static_cast<int64_t>(chunk[i]);
  }
  StepMetrics step;
  const absl::Status status = engine_.Step(segments, logits_, &step);
  totals_.steps.Add(step);
  if (!status.ok()) return status;
  if (on_step_) on_step_(step);
  ++totals_.step_count;
  totals_.max_live = std::max(totals_.max_live, static_cast<int>(live.size()));
  const size_t vocab = logits_.size() / segments.size();
  const double now = Now() - started_;
  std::vector<std::optional<FinishReason>> done(live.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    Live& seq = live[owner[s]];
    if (seq.cancelled()) {  // perhaps left the step at a layer: nothing of it is used
      seq.dropped = true;
      done[owner[s]] = FinishReason::kInterrupted;
      continue;
    }
    seq.prefilled += chunk[owner[s]];
    if (!seq.decoding()) {  // more of its prompt to run
      const auto& at = seq.request.snapshot_at;
      if (on_prompt_state_ && std::find(at.begin(), at.end(), seq.state.position()) != at.end()) {
        on_prompt_state_(seq.result.index, seq.state);
      }
      continue;
    }
    BatchResult& r = seq.result;
    const std::span<float> row(logits_.data() + s * vocab, vocab);
    if (chunk[owner[s]] > 0) {
      if (seq.request.keep_prompt_state && on_prompt_state_) on_prompt_state_(r.index, seq.state);
      if (on_prompt_end_) on_prompt_end_(r.index, row);
    }
    if (static_cast<int32_t>(r.ids.size()) == seq.request.max_tokens) {  // max_tokens 0
      done[owner[s]] = FinishReason::kLength;
      continue;
    }
    if (seq.request.constraint) seq.request.constraint->Mask(row);
    const int32_t id = seq.sampler.Sample(row);
    if (seq.request.constraint) seq.request.constraint->Accept(id);
    if (r.ids.empty()) r.first_token_at = now;
    r.ids.push_back(id);
    ++totals_.sampled_tokens;
    if (on_token) on_token(r.index, id, row);
    seq.next = id;
    const auto& stops = seq.request.stop_ids;
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      done[owner[s]] = FinishReason::kStop;
    } else if (static_cast<int32_t>(r.ids.size()) == seq.request.max_tokens) {
      done[owner[s]] = FinishReason::kLength;
    } else if (seq.state.position() + 1 >= options_.max_context) {
      done[owner[s]] = FinishReason::kContext;  // decoding `id` would pass the planned context
    }
  }
  // Finished sequences leave in place order; their places go to waiting prompts next step.
  std::vector<Live> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (done[i]) {
      Finish(live[i], *done[i], on_done);
    } else {
      kept.push_back(std::move(live[i]));
    }
  }
  live = std::move(kept);
  return absl::OkStatus();
}

absl::StatusOr<bool> BatchScheduler::RunStep(const TokenFn& on_token, const DoneFn& on_done) {
  if (started_ < 0) started_ = Now();
  EndCancelled(on_done);
  Admit();
  if (live_.empty()) return false;
  absl::Status status = Step(on_token, on_done);
  totals_.seconds = Now() - started_;
  if (!status.ok()) {
    live_.clear();
    return status;
  }
  return true;
}

absl::Status BatchScheduler::Run(const TokenFn& on_token, const DoneFn& on_done,
                                 const StopFn& stop) {
  for (;;) {
    if (stop && stop()) {
      Admit();  // those that would have run this step end as interrupted; the rest go unreported
      for (Live& seq : live_) Finish(seq, FinishReason::kInterrupted, on_done);
      live_.clear();
      waiting_.clear();
      break;
    }
    absl::StatusOr<bool> ran = RunStep(on_token, on_done);
    if (!ran.ok()) return ran.status();
    if (!*ran) break;
  }
  return absl::OkStatus();
}

int64_t ResumeFromPromptCache(PromptCache& cache, BatchRequest& request) {
  const int64_t before = request.resume ? request.resume->position() : 0;
  std::vector<int32_t> whole = request.resume ? request.resume->tokens() : std::vector<int32_t>{};
  whole.insert(whole.end(), request.prompt.begin(), request.prompt.end());
  int64_t cached = 0;
  if (std::optional<SequenceState> hit = cache.Lookup(whole); hit && hit->position() > before) {
    cached = hit->position() - before;
    request.prompt.erase(request.prompt.begin(), request.prompt.begin() + cached);
    request.resume = std::move(hit);
  }
  const auto last = static_cast<int64_t>(whole.size()) - 1;
  if (last > before + cached) request.snapshot_at.push_back(last);
  return cached;
}

absl::StatusOr<BatchResult> RunSequence(Engine& engine, BatchRequest request,
                                        const SequenceHooks& hooks) {
  BatchScheduler scheduler(engine,
                           {.batch = 1,
                            .prefill_tokens_per_step = static_cast<int>(engine.prefill_chunk()),
                            .max_context = engine.max_context()});
  if (auto added = scheduler.Add(std::move(request)); !added.ok()) return added.status();
  StepMetrics since;  // the steps since the last token
  scheduler.set_step_fn([&](const StepMetrics& step) { since.Add(step); });
  if (hooks.on_prompt_state) scheduler.set_prompt_state_fn(hooks.on_prompt_state);
  if (hooks.on_prompt_end) {
    scheduler.set_prompt_end_fn(
        [&](size_t, std::span<const float> logits) { hooks.on_prompt_end(logits, since); });
  }
  std::optional<BatchResult> result;
  const absl::Status status = scheduler.Run(
      [&](size_t, int32_t id, std::span<const float> logits) {
        if (hooks.on_token) hooks.on_token(id, logits, since);
        since = {};
      },
      [&](BatchResult& done) { result = std::move(done); }, hooks.stop);
  if (!status.ok()) return status;
  if (!result.has_value()) return absl::InternalError("the sequence was never reported");
  return *std::move(result);
}

}  // namespace k3
