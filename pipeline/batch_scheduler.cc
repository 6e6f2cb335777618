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
  size_t prefilled = 0;                // prompt tokens already run
  int32_t next = -1;                   // the last sampled token, decoded in the next step
  bool dropped = false;                // cancelled during a step: the state is half-run
  StepMetrics since;                   // the steps it took part in since its last token
  std::optional<FinishReason> finish;  // set in a step, acted on once the step is through

  bool decoding() const { return prefilled == request.prompt.size(); }
  bool cancelled() const {
    return request.cancelled != nullptr && request.cancelled->load(std::memory_order_relaxed);
  }
  bool at_snapshot() const {
    const auto& at = request.snapshot_at;
    return std::find(at.begin(), at.end(), state.position()) != at.end();
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

// One segment of a step: the live sequence it runs, and how much of its prompt. Its place among
// the step's rows is its place in the step's segments and logits.
struct BatchScheduler::Row {
  Live* seq = nullptr;
  size_t prompt_tokens = 0;  // 0: it decodes seq->next
};

BatchScheduler::BatchScheduler(Engine& engine, const BatchOptions& options, BatchEvents events)
    : engine_(engine),
      batch_(std::max(1, options.batch)),
      prefill_tokens_per_step_(options.prefill_tokens_per_step > 0
                                   ? options.prefill_tokens_per_step
                                   : static_cast<int>(engine.prefill_chunk())),
      max_context_(engine.max_context()),
      events_(std::move(events)) {}

BatchScheduler::~BatchScheduler() = default;

size_t BatchScheduler::live() const { return live_.size(); }

uint64_t BatchScheduler::live_state_bytes() const {
  uint64_t bytes = 0;
  for (const Live& seq : live_) bytes += seq.state.bytes();
  return bytes;
}

absl::StatusOr<size_t> BatchScheduler::Add(BatchRequest request) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  const int64_t before = request.resume ? request.resume->position() : 0;
  const int64_t tokens = before + static_cast<int64_t>(request.prompt.size());
  if (tokens >= max_context_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", tokens, " tokens, the context holds ", max_context_));
  }
  if (request.max_tokens < 0) return absl::InvalidArgumentError("max tokens must be >= 0");
  if (absl::Status s = ValidateSamplerOptions(request.sampler); !s.ok()) return s;
  waiting_.emplace_back(added_, std::move(request));
  return added_++;
}

void BatchScheduler::Admit() {
  while (static_cast<int>(live_.size()) < batch_ && !waiting_.empty()) {
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

void BatchScheduler::Finish(Live& seq, FinishReason reason) {
  seq.result.finish = reason;
  seq.result.finished_at = Now() - started_;
  if (seq.request.keep_final_state && !seq.dropped) seq.result.state = std::move(seq.state);
  if (events_.on_done) events_.on_done(seq.result);
}

void BatchScheduler::EndCancelled() {
  for (const size_t index : cancelled_) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->first != index) continue;
      BatchResult result;
      result.index = index;
      result.finish = FinishReason::kInterrupted;
      result.admitted_at = result.finished_at = Now() - started_;
      waiting_.erase(it);
      if (events_.on_done) events_.on_done(result);
      break;
    }
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (it->result.index != index) continue;
      Finish(*it, FinishReason::kInterrupted);
      live_.erase(it);
      break;
    }
  }
  cancelled_.clear();
}

// Decode rows first, then prompt chunks in the order the prompts joined, up to the share.
std::vector<BatchScheduler::Row> BatchScheduler::PlanRows() {
  std::vector<Row> rows;
  totals_.last_decode_tokens = totals_.last_prefill_tokens = 0;
  for (Live& seq : live_) {
    if (!seq.decoding()) continue;
    rows.push_back({.seq = &seq});
    ++totals_.last_decode_tokens;
  }
  totals_.decode_tokens += totals_.last_decode_tokens;
  auto share = static_cast<size_t>(prefill_tokens_per_step_);
  for (Live& seq : live_) {
    if (share == 0) break;
    if (seq.decoding()) continue;
    const size_t chunk = std::min(share, seq.ChunkRoom());
    share -= chunk;
    rows.push_back({.seq = &seq, .prompt_tokens = chunk});
    totals_.last_prefill_tokens += static_cast<int64_t>(chunk);
  }
  totals_.prefill_tokens += totals_.last_prefill_tokens;
  return rows;
}

// Takes in what a step ran for `row`: the prompt's progress, or the logits to sample from.
void BatchScheduler::Advance(const Row& row, std::span<float> logits, double now) {
  Live& seq = *row.seq;
  if (seq.cancelled()) {  // perhaps left the step at a layer: nothing of it is used
    seq.dropped = true;
    seq.finish = FinishReason::kInterrupted;
    return;
  }
  seq.prefilled += row.prompt_tokens;
  const size_t index = seq.result.index;
  if (row.prompt_tokens > 0 && events_.on_prompt_progress) {
    events_.on_prompt_progress(index, seq.prefilled, now - seq.result.admitted_at);
  }
  if (!seq.decoding()) {  // more of its prompt to run
    if (events_.on_prompt_state && seq.at_snapshot()) events_.on_prompt_state(index, seq.state);
    return;
  }
  if (row.prompt_tokens > 0) {  // the step ran the prompt's last chunk
    if (seq.request.keep_prompt_state && events_.on_prompt_state) {
      events_.on_prompt_state(index, seq.state);
    }
    if (events_.on_prompt_end) events_.on_prompt_end(index, logits, seq.since);
  }
  if (static_cast<int32_t>(seq.result.ids.size()) == seq.request.max_tokens) {  // max_tokens 0
    seq.finish = FinishReason::kLength;
    return;
  }
  Sample(seq, logits, now);
}

// Samples the sequence's next token and marks whether that ends it.
void BatchScheduler::Sample(Live& seq, std::span<float> logits, double now) {
  BatchResult& r = seq.result;
  if (seq.request.constraint) seq.request.constraint->Mask(logits);
  const int32_t id = seq.sampler.Sample(logits);
  if (seq.request.constraint) seq.request.constraint->Accept(id);
  if (r.ids.empty()) r.first_token_at = now;
  r.ids.push_back(id);
  ++totals_.sampled_tokens;
  if (events_.on_token) events_.on_token(r.index, id, logits, seq.since);
  seq.since = {};
  seq.next = id;
  const auto& stops = seq.request.stop_ids;
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    seq.finish = FinishReason::kStop;
  } else if (static_cast<int32_t>(r.ids.size()) == seq.request.max_tokens) {
    seq.finish = FinishReason::kLength;
  } else if (seq.state.position() + 1 >= max_context_) {
    seq.finish = FinishReason::kContext;  // decoding `id` would pass the planned context
  }
}

// Reports the prompt chunks' progress after each layer but the last (whose report, the chunk
// whole, Advance makes once the step is through). Null when no row runs a prompt: a decode step
// is left as it was.
LayerObserver BatchScheduler::PromptProgress(const std::vector<Row>& rows) const {
  if (!events_.on_prompt_progress) return {};
  std::vector<const Row*> prompts;
  for (const Row& row : rows) {
    if (row.prompt_tokens > 0) prompts.push_back(&row);
  }
  if (prompts.empty()) return {};
  const int64_t layers = engine_.config().num_layers;
  return [this, prompts = std::move(prompts), layers](int64_t layer, std::span<const float>) {
    const int64_t done = layer + 1;
    if (done >= layers) return;
    const double now = Now() - started_;
    for (const Row* row : prompts) {
      const Live& seq = *row->seq;
      if (seq.cancelled()) continue;  // it may have left the step: nothing of it counts
      const auto share =
          static_cast<size_t>(static_cast<int64_t>(row->prompt_tokens) * done / layers);
      events_.on_prompt_progress(seq.result.index, seq.prefilled + share,
                                 now - seq.result.admitted_at);
    }
  };
}

absl::Status BatchScheduler::Step() {
  const std::vector<Row> rows = PlanRows();
  std::vector<BatchSegment> segments;
  segments.reserve(rows.size());
  for (const Row& row : rows) segments.push_back(row.seq->Segment(row.prompt_tokens));
  StepMetrics step;
  const absl::Status status = engine_.Step(segments, logits_, &step, PromptProgress(rows));
  totals_.steps.Add(step);
  totals_.last_step = step;
  if (!status.ok()) return status;
  ++totals_.step_count;
  totals_.max_live = std::max(totals_.max_live, static_cast<int>(live_.size()));
  const size_t vocab = logits_.size() / rows.size();
  const double now = Now() - started_;
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].seq->since.Add(step);
    Advance(rows[r], {logits_.data() + r * vocab, vocab}, now);
  }
  // Finished sequences leave in place order; their places go to waiting prompts next step.
  std::vector<Live> kept;
  for (Live& seq : live_) {
    if (seq.finish) {
      Finish(seq, *seq.finish);
    } else {
      kept.push_back(std::move(seq));
    }
  }
  live_ = std::move(kept);
  return absl::OkStatus();
}

absl::StatusOr<bool> BatchScheduler::RunStep() {
  if (started_ < 0) started_ = Now();
  EndCancelled();
  Admit();
  if (events_.on_admitted) events_.on_admitted();
  if (live_.empty()) return false;
  absl::Status status = Step();
  totals_.seconds = Now() - started_;
  if (!status.ok()) {
    live_.clear();
    return status;
  }
  return true;
}

absl::Status BatchScheduler::Run() {
  for (;;) {
    if (events_.stop && events_.stop()) {
      Admit();  // those that would have run this step end as interrupted; the rest go unreported
      for (Live& seq : live_) Finish(seq, FinishReason::kInterrupted);
      live_.clear();
      waiting_.clear();
      break;
    }
    absl::StatusOr<bool> ran = RunStep();
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
                                        const BatchEvents& events) {
  std::optional<BatchResult> result;
  BatchEvents one = events;
  one.on_done = [&](BatchResult& done) {
    if (events.on_done) events.on_done(done);
    result = std::move(done);
  };
  BatchScheduler scheduler(engine, {.batch = 1}, std::move(one));
  if (auto added = scheduler.Add(std::move(request)); !added.ok()) return added.status();
  if (absl::Status status = scheduler.Run(); !status.ok()) return status;
  if (!result.has_value()) return absl::InternalError("the sequence was never reported");
  return *std::move(result);
}

}  // namespace k3
