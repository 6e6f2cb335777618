// k3's own routes: the probes' /health, /metrics, and the engine's events (GET /k3/events).
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "apps/reports/device_report.h"
#include "apps/server/event_stream.h"
#include "apps/server/gateway_metrics.h"
#include "apps/server/http_internal.h"
#include "apps/server/route_handlers.h"
#include "apps/server/server_context.h"
#include "httplib.h"

namespace k3::server {
namespace {

using nlohmann::json;

// A stream with no event for this long says it is alive with a comment line, which clients
// ignore and proxies see as traffic.
constexpr std::chrono::seconds kKeepalive{15};

std::string MetricsText(const ServerContext& server) {
  const ServiceStats st = server.service().stats();
  const StepMetrics& m = st.totals.steps;
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  metric("k3_http_requests_total", "counter", "HTTP requests answered, by path and status.");
  for (const auto& [key, n] : server.answered()) {
    absl::StrAppend(&out, "k3_http_requests_total{path=\"", key.first, "\",code=\"", key.second,
                    "\"} ", n, "\n");
  }
  metric("k3_requests_total", "counter", "Generation requests ended, by how.");
  absl::StrAppend(&out, "k3_requests_total{outcome=\"finished\"} ", st.requests_finished, "\n",
                  "k3_requests_total{outcome=\"cancelled\"} ", st.requests_cancelled, "\n",
                  "k3_requests_total{outcome=\"failed\"} ", st.requests_failed, "\n");
  metric("k3_tokens_total", "counter",
         "Tokens: prompt (all), cached (resumed, not run), completion.");
  absl::StrAppend(&out, "k3_tokens_total{kind=\"prompt\"} ", st.prompt_tokens, "\n",
                  "k3_tokens_total{kind=\"cached\"} ", st.cached_tokens, "\n",
                  "k3_tokens_total{kind=\"completion\"} ", st.totals.sampled_tokens, "\n");
  metric("k3_queue_length", "gauge", "Requests waiting for a place in the batch.");
  absl::StrAppend(&out, "k3_queue_length ", st.queued, "\n");
  metric("k3_live_sequences", "gauge", "Sequences in the batch.");
  absl::StrAppend(&out, "k3_live_sequences ", st.live, "\n");
  metric("k3_saved_states", "gauge", "Sequence states kept for prefix reuse.");
  absl::StrAppend(&out, "k3_saved_states ", st.saved_states, "\n");
  metric("k3_steps_total", "counter", "Batched engine steps.");
  absl::StrAppend(&out, "k3_steps_total ", st.totals.step_count, "\n");
  metric("k3_layers_total", "counter", "Model layers run, over every step.");
  absl::StrAppend(&out, "k3_layers_total ", st.layers_run, "\n");
  metric("k3_cancel_layers_max", "gauge",
         "The most layers run between a request's cancellation and its place freeing.");
  absl::StrAppend(&out, "k3_cancel_layers_max ", st.cancel_layers_max, "\n");
  metric("k3_step_seconds_total", "counter", "Seconds spent in engine steps.");
  absl::StrAppend(&out, "k3_step_seconds_total ", m.seconds, "\n");
  metric("k3_seconds_per_token", "gauge",
         "Seconds of the last step: the time between two tokens of every live sequence.");
  absl::StrAppend(&out, "k3_seconds_per_token ", st.last_step_seconds, "\n");
  metric("k3_read_bytes_total", "counter", "Bytes read from the checkpoint, by kind.");
  absl::StrAppend(
      &out, "k3_read_bytes_total{kind=\"expert_demand\"} ", m.expert_demand_bytes, "\n",
      "k3_read_bytes_total{kind=\"expert_prefetch_used\"} ", m.expert_prefetch_used_bytes, "\n",
      "k3_read_bytes_total{kind=\"expert_prefetch_wasted\"} ", m.expert_prefetch_wasted_bytes, "\n",
      "k3_read_bytes_total{kind=\"trunk\"} ", m.trunk_bytes, "\n");
  metric("k3_expert_cache_hit_ratio", "gauge", "Demanded experts already resident, over the run.");
  absl::StrAppend(&out, "k3_expert_cache_hit_ratio ", m.hit_rate(), "\n");
  metric("k3_disk_busy_seconds_total", "counter", "Seconds with at least one read in flight.");
  absl::StrAppend(&out, "k3_disk_busy_seconds_total ", m.disk_busy_seconds, "\n");
  metric("k3_disk_busy_ratio", "gauge", "Disk busy seconds over step seconds, over the run.");
  absl::StrAppend(&out, "k3_disk_busy_ratio ", m.seconds > 0 ? m.disk_busy_seconds / m.seconds : 0,
                  "\n");
  absl::StrAppend(&out, DevicesMetrics(st.devices), GatewayMetrics(st));
  return out;
}

// The steps as they come out of `hub`, until the server stops; false when the client has gone.
bool StreamSteps(EngineEvents& hub, EventStream& out) {
  int64_t seen = hub.last_seq();
  auto quiet_since = std::chrono::steady_clock::now();
  while (!hub.closed() && out.ok()) {
    const std::optional<EngineEvents::Event> event = hub.Next(seen, std::chrono::seconds(1));
    const auto now = std::chrono::steady_clock::now();
    if (event) {
      seen = event->seq;
      out.Event("step", event->Data());
      quiet_since = now;
    } else if (now - quiet_since >= kKeepalive) {
      out.Comment("keepalive");
      quiet_since = now;
    }
  }
  return out.ok();
}

}  // namespace

void Health(ServerContext& server, const httplib::Request&, httplib::Response& res) {
  const ServiceStats st = server.service().stats();
  if (st.draining) res.status = 503;
  res.set_content(
      Dump({{"status", st.draining ? "draining" : "ok"}, {"live", st.live}, {"queued", st.queued}}),
      "application/json");
}

void Metrics(ServerContext& server, const httplib::Request&, httplib::Response& res) {
  res.set_content(MetricsText(server), "text/plain; version=0.0.4");
}

void Events(ServerContext& server, const httplib::Request& req, httplib::Response& res) {
  EngineEvents& hub = server.service().events();
  std::shared_ptr<EngineEvents::Client> client = hub.Join();
  if (client == nullptr) {
    return SendError(res, {503,
                           absl::StrCat("already ", EngineEvents::kMaxClients,
                                        " clients listen to the engine's events; try later"),
                           "server_error", "", "too_many_listeners"});
  }
  json plan = hub.plan();
  plan["model"] = server.options().model_id;
  // The client leaves with the writer, when httplib is done with the response.
  SendEventStream(req, res, [&hub, client, head = Dump(plan)](EventStream& out) {
    return out.Event("plan", head) && StreamSteps(hub, out);
  });
}

}  // namespace k3::server
