// The engine seen live: GET /k3/events (k3_routes.cc), a server-sent event stream of per-step
// figures (the memory plan on connect, then the steps, at most four events a second).
//
// The engine thread publishes each step's figures to an EngineEvents hub, and only while a
// client listens (has_clients): steps that come faster than kMinGap apart are merged into one
// event (counts summed, the layer timeline the last step's). The HTTP threads of the clients
// wait on the hub's condition variable and write each event as it comes out; a client that
// falls behind gets the latest event, never a backlog.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/read_router.h"
#include "nlohmann/json.hpp"
#include "pipeline/step_metrics.h"

namespace k3 {
class Engine;
}  // namespace k3

namespace k3::server {

// One engine step's figures, or the sum of several (Merge).
struct StepFigures {
  int64_t steps = 1;
  int64_t decode_tokens = 0, prefill_tokens = 0;  // the step's rows
  double seconds = 0;
  double stall_seconds = 0;      // compute waiting for bytes
  double disk_busy_seconds = 0;  // some read in flight
  uint64_t cache_requests = 0, cache_hits = 0;
  std::vector<io::DeviceReport> devices;  // what each drive did in the steps
  std::vector<LayerFigures> layers;       // the MoE layers of the last step
  // As of the last step.
  int64_t waiting = 0, running = 0;
  int64_t prompt_cache_entries = 0, prompt_cache_hits = 0;
  int64_t requests_finished = 0, requests_cancelled = 0;

  // Adds `later`'s counts to these and takes its layers and gauges.
  void Merge(StepFigures&& later);
  // The `step` event's data (docs: GET /k3/events).
  nlohmann::json ToJson(int64_t seq, double time_ms) const;
};

// The `plan` event's data but the model's id: the model's shape, the memory plan, the drives,
// the batch and the context.
nlohmann::json PlanJson(const Engine& engine, int max_batch);

class EngineEvents {
 public:
  // Events at least this many seconds apart: at most 4 a second.
  static constexpr double kMinGap = 0.25;
  using Seconds = std::function<double()>;  // a steady clock; tests inject their own

  // `plan`: the plan event's data. `now`: the steady clock by default. Times of events count
  // from construction (the server's start).
  explicit EngineEvents(nlohmann::json plan = nlohmann::json::object(), Seconds now = nullptr);

  const nlohmann::json& plan() const { return plan_; }
  // Whether a client listens: the engine thread gathers no figures otherwise.
  bool has_clients() const { return clients_.load(std::memory_order_relaxed) > 0; }

  // Clients listening at once at most: each holds one of the server's HTTP threads, which
  // k3 serve adds to its pool for them.
  static constexpr int kMaxClients = 8;

  // A listening client, for as long as it lives.
  class Client {
   public:
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;
    ~Client();

   private:
    friend class EngineEvents;
    explicit Client(EngineEvents& hub) : hub_(&hub) {}
    EngineEvents* hub_;
  };
  // A new client, or null when kMaxClients listen already.
  std::shared_ptr<Client> Join();

  // The engine thread: one step's figures. They go out at once when the last event is kMinGap
  // old, else they wait, merged with the steps after them, until it is.
  void Publish(StepFigures step);

  struct Event {
    int64_t seq = 0;  // 1, 2, ...: each event a number higher
    double time_ms = 0;
    std::shared_ptr<const StepFigures> figures;
    std::string Data() const;  // the JSON of the event's data line
  };
  // The number of the last event out (0: none yet).
  int64_t last_seq() const;
  // Waits up to `timeout` for an event after `after`: the latest one, or nothing (timeout, or
  // the hub closed). Merged steps whose time has come go out on the way.
  std::optional<Event> Next(int64_t after, std::chrono::milliseconds timeout);
  // Ends every wait, now and later (the server stops).
  void Close();
  bool closed() const;

 private:
  bool FlushDueLocked(double now);  // true when an event went out

  const nlohmann::json plan_;
  const Seconds now_;
  const double start_;
  std::atomic<int> clients_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<StepFigures> pending_;  // published, not yet out
  Event latest_;
  double last_out_ = -std::numeric_limits<double>::infinity();
  bool closed_ = false;
};

}  // namespace k3::server
