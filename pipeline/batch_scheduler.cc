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

  bool decoding() const { return prefilled == request.prompt.size(); }
};

BatchScheduler::BatchScheduler(Engine& engine, const BatchOptions& options)
    : engine_(engine), options_(options) {
  options_.batch = std::max(1, options_.batch);
  options_.prefill_tokens_per_step = std::max(1, options_.prefill_tokens_per_step);
}

absl::StatusOr<size_t> BatchScheduler::Add(BatchRequest request) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (static_cast<int64_t>(request.prompt.size()) >= options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", request.prompt.size(),
                                                   " tokens, the context holds ",
                                                   options_.max_context));
  }
  if (request.max_tokens < 0) return absl::InvalidArgumentError("max tokens must be >= 0");
  if (absl::Status s = ValidateSamplerOptions(request.sampler); !s.ok()) return s;
  waiting_.emplace_back(added_, std::move(request));
  return added_++;
}

void BatchScheduler::Admit(std::vector<Live>& live) {
  while (static_cast<int>(live.size()) < options_.batch && !waiting_.empty()) {
    auto [index, request] = std::move(waiting_.front());
    waiting_.pop_front();
    Sampler sampler(request.sampler);
    Live seq{std::move(request), {}, engine_.NewState(), std::move(sampler)};
    seq.result.index = index;
    seq.result.prompt_tokens = static_cast<int64_t>(seq.request.prompt.size());
    seq.result.admitted_at = Now() - started_;
    live.push_back(std::move(seq));
  }
}

absl::Status BatchScheduler::Step(std::vector<Live>& live, const TokenFn& on_token,
                                  const DoneFn& on_done) {
  // Decode rows first, then prompt chunks in the order the prompts joined, up to the share.
  std::vector<BatchSegment> segments;
  std::vector<size_t> owner;  // segment -> live sequence
  std::vector<size_t> chunk(live.size(), 0);
  int share = options_.prefill_tokens_per_step;
  for (size_t i = 0; i < live.size(); ++i) {
    if (live[i].decoding()) {
      segments.push_back({{&live[i].next, 1}, &live[i].state});
      owner.push_back(i);
      ++totals_.decode_tokens;
    }
  }
  for (size_t i = 0; i < live.size() && share > 0; ++i) {
    if (live[i].decoding()) continue;
    const auto& prompt = live[i].request.prompt;
    chunk[i] = std::min<size_t>(share, prompt.size() - live[i].prefilled);
    share -= static_cast<int>(chunk[i]);
    segments.push_back({{prompt.data() + live[i].prefilled, chunk[i]}, &live[i].state});
    owner.push_back(i);
    totals_.prefill_tokens += static_cast<int64_t>(chunk[i]);
  }
  std::vector<float> logits;
  if (absl::Status s = engine_.Step(segments, logits, &totals_.steps); !s.ok()) return s;
  ++totals_.step_count;
  totals_.max_live = std::max(totals_.max_live, static_cast<int>(live.size()));
  const size_t vocab = logits.size() / segments.size();
  const double now = Now() - started_;
  std::vector<bool> done(live.size(), false);
  for (size_t s = 0; s < segments.size(); ++s) {
    Live& seq = live[owner[s]];
    seq.prefilled += chunk[owner[s]];
    if (!seq.decoding()) continue;  // more of its prompt to run
    BatchResult& r = seq.result;
    if (static_cast<int32_t>(r.ids.size()) == seq.request.max_tokens) {  // max_tokens 0
      r.finish = FinishReason::kLength;
      done[owner[s]] = true;
      continue;
    }
    const std::span<const float> row(logits.data() + s * vocab, vocab);
    const int32_t id = seq.sampler.Sample(row);
    if (r.ids.empty()) r.first_token_at = now;
    r.ids.push_back(id);
    ++totals_.sampled_tokens;
    if (on_token) on_token(r.index, id, row);
    seq.next = id;
    const auto& stops = seq.request.stop_ids;
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      r.finish = FinishReason::kStop;
      done[owner[s]] = true;
    } else if (static_cast<int32_t>(r.ids.size()) == seq.request.max_tokens) {
      r.finish = FinishReason::kLength;
      done[owner[s]] = true;
    } else if (seq.state.position() + 1 >= options_.max_context) {
      r.finish = FinishReason::kContext;  // decoding `id` would pass the planned context
      done[owner[s]] = true;
    }
  }
  // Finished sequences leave in place order; their places go to waiting prompts next step.
  std::vector<Live> kept;
  for (size_t i = 0; i < live.size(); ++i) {
    if (!done[i]) {
      kept.push_back(std::move(live[i]));
      continue;
    }
    live[i].result.finished_at = now;
    if (on_done) on_done(live[i].result);
  }
  live = std::move(kept);
  return absl::OkStatus();
}

absl::Status BatchScheduler::Run(const TokenFn& on_token, const DoneFn& on_done,
                                 const StopFn& stop) {
  started_ = Now();
  std::vector<Live> live;
  absl::Status status;
  for (Admit(live); !live.empty(); Admit(live)) {
    if (stop && stop()) {
      for (Live& seq : live) {
        seq.result.finish = FinishReason::kInterrupted;
        seq.result.finished_at = Now() - started_;
        if (on_done) on_done(seq.result);
      }
      live.clear();
      break;
    }
    status = Step(live, on_token, on_done);
    if (!status.ok()) break;
  }
  totals_.seconds = Now() - started_;
  return status;
}

}  // namespace k3
