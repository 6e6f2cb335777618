#include "apps/server/engine_events.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "apps/reports/device_report.h"
#include "apps/server/http_internal.h"
#include "pipeline/engine.h"
#include "pipeline/memory_plan_json.h"

namespace k3::server {
namespace {

using nlohmann::json;

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// -1 (nothing of the kind in the step) as null, so that no client takes it for a time.
json Ms(double ms) { return ms < 0 ? json(nullptr) : json(ms); }

json LayerJson(const LayerFigures& f) {
  return {{"layer", f.layer},
          {"asked", f.asked},
          {"cached", f.cached},
          {"read", f.read},
          {"prefetched", f.prefetched},
          {"bytes_first_ms", Ms(f.bytes_first_ms)},
          {"bytes_last_ms", Ms(f.bytes_last_ms)},
          {"compute_start_ms", Ms(f.compute_start_ms)},
          {"compute_end_ms", Ms(f.compute_end_ms)}};
}

}  // namespace

void StepFigures::Merge(StepFigures&& later) {
  steps += later.steps;
  decode_tokens += later.decode_tokens;
  prefill_tokens += later.prefill_tokens;
  seconds += later.seconds;
  stall_seconds += later.stall_seconds;
  disk_busy_seconds += later.disk_busy_seconds;
  cache_requests += later.cache_requests;
  cache_hits += later.cache_hits;
  for (io::DeviceReport& d : later.devices) {
    auto same = std::find_if(devices.begin(), devices.end(),
                             [&](const io::DeviceReport& e) { return e.id == d.id; });
    if (same == devices.end()) {
      devices.push_back(std::move(d));
    } else {
      same->bytes += d.bytes;
      same->reads += d.reads;
      same->busy_seconds += d.busy_seconds;
      same->failovers += d.failovers;
    }
  }
  layers = std::move(later.layers);
  waiting = later.waiting;
  running = later.running;
  prompt_cache_entries = later.prompt_cache_entries;
  prompt_cache_hits = later.prompt_cache_hits;
  requests_finished = later.requests_finished;
  requests_cancelled = later.requests_cancelled;
}

json StepFigures::ToJson(int64_t seq, double time_ms) const {
  // Fractions and rates of the steps' own time (not of the gaps between them).
  auto per_second = [&](double x) { return seconds > 0 ? x / seconds : 0.0; };
  uint64_t read_bytes = 0;
  for (const io::DeviceReport& d : devices) read_bytes += d.bytes;
  json layer_list = json::array();
  for (const LayerFigures& f : layers) layer_list.push_back(LayerJson(f));
  const char* kind = prefill_tokens == 0 ? "decode" : decode_tokens == 0 ? "prefill" : "mixed";
  return {{"seq", seq},
          {"time_ms", time_ms},
          {"steps", steps},
          {"kind", kind},
          {"tokens", decode_tokens + prefill_tokens},
          {"seconds", seconds},
          {"stall_seconds", stall_seconds},
          {"hit_rate", cache_requests > 0 ? static_cast<double>(cache_hits) / cache_requests : 0},
          {"disk",
           {{"read_bytes", read_bytes},
            {"busy_fraction", std::min(1.0, per_second(disk_busy_seconds))},
            {"rate_bytes_per_second", per_second(static_cast<double>(read_bytes))}}},
          {"devices", DevicesJson(devices, seconds)},
          {"layers", std::move(layer_list)},
          {"queue", {{"waiting", waiting}, {"running", running}}},
          {"prompt_cache", {{"entries", prompt_cache_entries}, {"hits", prompt_cache_hits}}},
          {"requests", {{"finished", requests_finished}, {"cancelled", requests_cancelled}}}};
}

json PlanJson(const Engine& engine, int max_batch) {
  const ModelConfig& c = engine.config();
  json moe = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_dense(l)) moe.push_back(l);
  }
  json memory = MemoryPlanJson(engine.plan());
  memory["expert_bytes"] = c.expert_bytes();  // the model's: what a cache slot holds
  return {{"layers", c.num_layers},
          {"moe_layers", std::move(moe)},
          {"experts_per_layer", c.num_experts},
          {"experts_per_token", c.num_experts_per_token},
          {"memory", std::move(memory)},
          {"drives", DevicesJson(engine.devices(), 0)},
          {"max_batch", max_batch},
          {"context", engine.max_context()},
          {"prefill_chunk", engine.prefill_chunk()}};
}

EngineEvents::EngineEvents(json plan, Seconds now)
    : plan_(std::move(plan)), now_(now ? std::move(now) : SteadySeconds), start_(now_()) {}

std::string EngineEvents::Event::Data() const {
  return figures ? Dump(figures->ToJson(seq, time_ms)) : "{}";
}

void EngineEvents::Publish(StepFigures step) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (pending_) {
      pending_->Merge(std::move(step));
    } else {
      pending_ = std::move(step);
      wake = true;  // the clients wait for the merged steps' time from now on
    }
    wake |= FlushDueLocked(now_());
  }
  if (wake) cv_.notify_all();
}

bool EngineEvents::FlushDueLocked(double now) {
  if (!pending_ || now - last_out_ < kMinGap) return false;
  latest_ = {.seq = latest_.seq + 1,
             .time_ms = (now - start_) * 1000,
             .figures = std::make_shared<const StepFigures>(*std::move(pending_))};
  pending_.reset();
  last_out_ = now;
  return true;
}

std::shared_ptr<EngineEvents::Client> EngineEvents::Join() {
  for (int n = clients_.load(); n < kMaxClients;) {
    if (clients_.compare_exchange_weak(n, n + 1)) return std::shared_ptr<Client>(new Client(*this));
  }
  return nullptr;
}

EngineEvents::Client::~Client() {
  if (--hub_->clients_ > 0) return;
  std::lock_guard lock(hub_->mu_);  // what was merged is stale by the next client's time
  hub_->pending_.reset();
}

int64_t EngineEvents::last_seq() const {
  std::lock_guard lock(mu_);
  return latest_.seq;
}

std::optional<EngineEvents::Event> EngineEvents::Next(int64_t after,
                                                      std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const double deadline = now_() + std::chrono::duration<double>(timeout).count();
  for (;;) {
    const double now = now_();
    if (FlushDueLocked(now)) cv_.notify_all();  // the other clients' too
    if (latest_.seq > after) return latest_;
    if (closed_ || now >= deadline) return std::nullopt;
    // Until the deadline, or until merged steps are due (no step may come to send them).
    const double wake = pending_ ? std::min(deadline, last_out_ + kMinGap) : deadline;
    cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, wake - now)));
  }
}

void EngineEvents::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool EngineEvents::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

}  // namespace k3::server
