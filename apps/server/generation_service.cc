#include "apps/server/generation_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace k3::server {

Job::Progress Job::Wait(size_t seen, std::chrono::milliseconds timeout, size_t points_seen) {
  std::unique_lock lock(mu_);
  const std::vector<PromptPoint>& points = progress_.prompt_points;
  cv_.wait_for(lock, timeout, [&] {
    return progress_.ids.size() > seen || progress_.done ||
           (points_seen != kNoProgress && points.size() > points_seen);
  });
  Progress out;
  out.ids.assign(progress_.ids.begin() + std::min(seen, progress_.ids.size()), progress_.ids.end());
  out.logprobs.assign(progress_.logprobs.begin() + std::min(seen, progress_.logprobs.size()),
                      progress_.logprobs.end());
  if (seen == 0 && (!progress_.ids.empty() || progress_.done)) {
    out.prompt_logprobs = progress_.prompt_logprobs;  // complete: the prompt has run
  }
  out.done = progress_.done;
  out.finish = progress_.finish;
  out.status = progress_.status;
  out.prompt_tokens = progress_.prompt_tokens;
  out.cached_tokens = progress_.cached_tokens;
  if (points_seen < points.size())
    out.prompt_points.assign(points.begin() + points_seen, points.end());
  return out;
}

void Job::PushPromptPoint(int64_t run, double ms) {
  {
    std::lock_guard lock(mu_);
    std::vector<PromptPoint>& points = progress_.prompt_points;
    const int64_t processed = progress_.cached_tokens + run;
    // A chunk with fewer tokens than the model has layers moves by a token every few layers:
    // the layers between say nothing new.
    if (!points.empty() && points.back().processed >= processed) return;
    points.push_back({processed, ms});
  }
  cv_.notify_all();
}

void Job::Cancel() {
  if (cancelled_.exchange(true)) return;
  if (clock_ != nullptr) cancelled_at_layer_ = clock_->layers_run();
}

void Job::PushPromptLogprob(int32_t id, std::span<const float> logits) {
  TokenLogprob logprob = LogProbs(logits, id, top_logprobs_);
  std::lock_guard lock(mu_);
  progress_.prompt_logprobs.push_back(std::move(logprob));
}

void Job::Push(int32_t id, std::span<const float> logits) {
  // Computed on the engine thread, outside the lock: a pass over the vocabulary.
  std::optional<TokenLogprob> logprob;
  if (top_logprobs_ >= 0) logprob = LogProbs(logits, id, top_logprobs_);
  {
    std::lock_guard lock(mu_);
    progress_.ids.push_back(id);
    if (logprob) progress_.logprobs.push_back(*std::move(logprob));
  }
  cv_.notify_all();
}

void Job::Finish(FinishReason finish, absl::Status status) {
  {
    std::lock_guard lock(mu_);
    progress_.done = true;
    progress_.finish = finish;
    progress_.status = std::move(status);
  }
  cv_.notify_all();
}

GenerationService::GenerationService(Engine& engine, const ServiceOptions& options)
    : engine_(engine),
      options_(options),
      scheduler_(engine, options.batch, Events()),
      events_(PlanJson(engine, std::max(1, options.batch.batch))) {
  // The plan reserves one state at the planned context for each of its sequences.
  const MemoryPlan& plan = engine.plan();
  stats_.places = options.batch.batch;
  stats_.planned_states = plan.sequences;
  stats_.state_bytes_capacity = plan.state_bytes /
                                static_cast<uint64_t>(std::max(1, plan.sequences)) *
                                static_cast<uint64_t>(std::max(0, options.batch.batch));
  stats_.context = engine.max_context();
  stats_.prefix_cache = options.prompt_cache != nullptr;
  thread_ = std::thread([this] { Loop(); });
}

// Heard on the engine thread, inside RunStep: jobs_ is that thread's alone, so no lock.
BatchEvents GenerationService::Events() {
  BatchEvents events;
  events.on_token = [this](size_t index, int32_t id, std::span<const float> logits,
                           const StepMetrics&) {
    if (auto it = jobs_.find(index); it != jobs_.end()) it->second->Push(id, logits);
  };
  events.on_done = [this](BatchResult& result) { OnDone(result); };
  // The step's own sequences, not the previous step's: a request admitted now counts as running
  // during the step that runs it.
  events.on_admitted = [this] {
    std::lock_guard lock(mu_);
    PublishGauges();
  };
  events.on_prompt_progress = [this](size_t index, size_t run, double seconds) {
    if (auto it = jobs_.find(index); it != jobs_.end()) {
      it->second->PushPromptPoint(static_cast<int64_t>(run), seconds * 1000);
    }
  };
  if (PromptCache* cache = options_.prompt_cache) {
    events.on_prompt_state = [cache](size_t, const SequenceState& state) { cache->Store(state); };
  }
  return events;
}

GenerationService::~GenerationService() { Stop(); }

void GenerationService::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  events_.Close();
  if (thread_.joinable()) thread_.join();
}

void GenerationService::Drain() {
  std::lock_guard lock(mu_);
  draining_ = stats_.draining = true;
}

int64_t GenerationService::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

void GenerationService::PublishGauges() {
  stats_.queued = static_cast<int64_t>(scheduler_.waiting());
  stats_.live = static_cast<int64_t>(scheduler_.live());
  stats_.live_state_bytes = scheduler_.live_state_bytes();
}

absl::StatusOr<std::shared_ptr<Job>> GenerationService::Submit(BatchRequest request,
                                                               int top_logprobs,
                                                               bool prompt_logprobs) {
  const int64_t context = engine_.max_context();
  if (request.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (static_cast<int64_t>(request.prompt.size()) >= context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", request.prompt.size(),
                                                   " tokens; this server's context holds ", context,
                                                   " (--max-context)"));
  }
  if (absl::Status s = ValidateSamplerOptions(request.sampler); !s.ok()) return s;
  auto job = std::make_shared<Job>();
  job->clock_ = &engine_;
  job->top_logprobs_ = top_logprobs;
  // The scheduler holds the request while the job lives in jobs_, so these may point into it.
  request.cancelled = &job->cancelled_;
  if (prompt_logprobs && top_logprobs >= 0) {
    request.on_prompt_logits = [raw = job.get()](int32_t id, std::span<const float> logits) {
      raw->PushPromptLogprob(id, logits);
    };
  }
  job->request_ = std::move(request);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (draining_) {
      return absl::UnavailableError(
          "the server is draining: it finishes the requests in flight and takes no new ones");
    }
    // Counted from submission to the end, so the verdict never depends on whether the engine
    // thread has admitted the earlier ones yet.
    if (in_flight_ >= options_.batch.batch + options_.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the queue is full: ", in_flight_ - options_.batch.batch,
                       " requests wait for a place (--max-queue ", options_.max_queue, ")"));
    }
    ++in_flight_;
    inbox_.push_back(job);
  }
  wake_.notify_all();
  return job;
}

ServiceStats GenerationService::stats() const {
  std::lock_guard lock(mu_);
  ServiceStats s = stats_;
  s.queued += static_cast<int64_t>(inbox_.size());
  s.devices = engine_.devices();
  return s;
}

void GenerationService::Admit(std::vector<std::shared_ptr<Job>>& incoming) {
  for (std::shared_ptr<Job>& job : incoming) {
    BatchRequest request = std::move(job->request_);
    const int64_t total = static_cast<int64_t>(request.prompt.size());
    int64_t cached = 0;
    // A request for its prompt's log probabilities runs every prompt token for its logits.
    if (options_.prompt_cache != nullptr && !request.on_prompt_logits) {
      cached = ResumeFromPromptCache(*options_.prompt_cache, request);
      prompt_cache_hits_ += cached > 0;
      request.keep_prompt_state = request.keep_final_state = true;
    }
    {
      std::lock_guard lock(job->mu_);
      job->progress_.prompt_tokens = total;
      job->progress_.cached_tokens = cached;
      job->progress_.prompt_points.push_back({cached, 0});
    }
    absl::StatusOr<size_t> index = scheduler_.Add(std::move(request));
    if (!index.ok()) {
      End(*job, FinishReason::kInterrupted, index.status());
      continue;
    }
    jobs_[*index] = std::move(job);
    std::lock_guard lock(mu_);
    stats_.prompt_tokens += total;
    stats_.cached_tokens += cached;
  }
  incoming.clear();
}

void GenerationService::End(Job& job, FinishReason finish, absl::Status status) {
  {
    std::lock_guard lock(mu_);
    --in_flight_;
    ++(!status.ok()      ? stats_.requests_failed
       : job.cancelled() ? stats_.requests_cancelled
                         : stats_.requests_finished);
    if (job.cancelled()) {
      stats_.cancel_layers_max =
          std::max(stats_.cancel_layers_max, engine_.layers_run() - job.cancelled_at_layer_.load());
    }
  }
  job.Finish(finish, std::move(status));
}

void GenerationService::OnDone(BatchResult& result) {
  auto it = jobs_.find(result.index);
  if (it == jobs_.end()) return;
  if (result.state && options_.prompt_cache != nullptr) options_.prompt_cache->Store(*result.state);
  End(*it->second, result.finish, absl::OkStatus());
  jobs_.erase(it);
}

void GenerationService::Loop() {
  std::vector<std::shared_ptr<Job>> incoming;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !jobs_.empty(); });
      if (stopping_) break;
      incoming.swap(inbox_);
    }
    Admit(incoming);
    for (const auto& [index, job] : jobs_) {
      if (job->cancelled()) scheduler_.Cancel(index);
    }
    // A client that has just come needs the drives' totals before the step, to count its bytes.
    const auto steps_before = static_cast<uint64_t>(scheduler_.totals().step_count);
    if (events_.has_clients() && devices_step_ != steps_before) {
      devices_ = engine_.devices();
      devices_step_ = steps_before;
    }
    const auto started = std::chrono::steady_clock::now();
    absl::StatusOr<bool> ran = scheduler_.RunStep();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!ran.ok()) {
      for (auto& [index, job] : jobs_) {
        End(*job, FinishReason::kInterrupted, ran.status());
        scheduler_.Cancel(index);  // those still waiting go too: the engine just failed
      }
      jobs_.clear();
    }
    std::lock_guard lock(mu_);
    stats_.totals = scheduler_.totals();
    PublishGauges();
    stats_.layers_run = engine_.layers_run();
    if (options_.prompt_cache != nullptr) {
      stats_.saved_states = static_cast<int64_t>(options_.prompt_cache->states_in_memory());
    }
    if (ran.ok() && *ran) stats_.last_step_seconds = seconds;
    if (ran.ok() && *ran && events_.has_clients()) PublishStep();
  }
  const absl::Status shutdown = absl::UnavailableError("the server is shutting down");
  for (auto& [index, job] : jobs_) End(*job, FinishReason::kInterrupted, shutdown);
  jobs_.clear();
  std::vector<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(inbox_);
  }
  for (auto& job : left) End(*job, FinishReason::kInterrupted, shutdown);
}

// On the engine thread, under mu_ (stats_ is up to date), only while a client listens.
void GenerationService::PublishStep() {
  const BatchTotals& totals = scheduler_.totals();
  const StepMetrics& m = totals.last_step;
  StepFigures step;
  step.decode_tokens = totals.last_decode_tokens;
  step.prefill_tokens = totals.last_prefill_tokens;
  step.seconds = m.seconds;
  step.stall_seconds = m.io_wait_seconds;
  step.disk_busy_seconds = m.disk_busy_seconds;
  step.cache_requests = m.cache_requests;
  step.cache_hits = m.cache_hits;
  // The drives' figures are totals since the engine opened: a step's are the difference from
  // those before it (Loop took them when the step before was not published; a client that
  // came during the step sees none of its bytes).
  std::vector<io::DeviceReport> devices = engine_.devices();
  const auto step_count = static_cast<uint64_t>(totals.step_count);
  if (devices_step_ + 1 != step_count) devices_ = devices;
  step.devices = io::DevicesSince(devices_, devices);
  devices_ = std::move(devices);
  devices_step_ = step_count;
  engine_.StepLayers(step.layers);
  step.waiting = stats_.queued + static_cast<int64_t>(inbox_.size());
  step.running = stats_.live;
  step.prompt_cache_entries = stats_.saved_states;
  step.prompt_cache_hits = prompt_cache_hits_;
  step.requests_finished = stats_.requests_finished;
  step.requests_cancelled = stats_.requests_cancelled;
  events_.Publish(std::move(step));
}

}  // namespace k3::server
