#include "apps/server/http_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "apps/reports/device_report.h"
#include "apps/server/anthropic_request.h"
#include "apps/server/engine_events.h"
#include "apps/server/gateway_metrics.h"
#include "apps/server/http_internal.h"
#include "apps/server/page_routes.h"
#include "core/text/grammar/token_mask.h"
#include "httplib.h"

namespace k3::server {

using nlohmann::json;

// Requests answered, by route and status, for /metrics.
struct HttpServer::Counters {
  mutable std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;
};

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendEventStream(const httplib::Request& req, httplib::Response& res,
                     std::function<bool(size_t, httplib::DataSink&)> provide,
                     std::function<void(bool)> released) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // httplib compresses every text/ type but exactly "text/event-stream" for a client that
  // accepts an encoding (every browser), and its compressors hold the events back until the
  // stream ends. The charset must stay (a client that trusts the header would decode UTF-8 as
  // Latin-1), so the stream is answered as to a client that accepts none. `req` is httplib's
  // own, not const: it only hands it to us so.
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
  res.set_chunked_content_provider("text/event-stream; charset=utf-8", std::move(provide),
                                   std::move(released));
}

void SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.http_status == 429) res.set_header("Retry-After", "1");
  res.set_content(Dump(error.ToJson()), "application/json");
}

void SendError(const httplib::Request& req, httplib::Response& res, const ApiError& error) {
  SendError(res, error);
  if (req.path.starts_with("/v1/messages")) {
    res.set_content(Dump(AnthropicErrorJson(error)), "application/json");
  }
}

ApiError ErrorFromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return {400, std::string(status.message()), "invalid_request_error", "", ""};
    case absl::StatusCode::kResourceExhausted:
      return {429, std::string(status.message()), "rate_limit_error", "", "queue_full"};
    case absl::StatusCode::kUnavailable:
      return {503, std::string(status.message()), "server_error", "", "unavailable"};
    default:
      return {500, std::string(status.message()), "server_error", "", ""};
  }
}

HttpServer::HttpServer(GenerationService& service, const Tokenizer& tokenizer,
                       std::vector<int32_t> stop_ids, int vocab_size, const ServerOptions& options)
    : service_(service),
      tok_(tokenizer),
      stop_ids_(std::move(stop_ids)),
      vocab_size_(vocab_size),
      options_(options),
      http_(std::make_unique<httplib::Server>()),
      counters_(std::make_unique<Counters>()) {
  Routes();
}

HttpServer::~HttpServer() = default;

namespace {

// SO_REUSEADDR, the usual option of a server's socket: the connections a previous run closed
// (a minute in TIME_WAIT) do not keep a restarted server from its port, a listening socket
// does. httplib's default, SO_REUSEPORT alone, would let a second server share a port in use
// silently and still refuses a restart over TIME_WAIT.
void ReuseAddress(int fd) {
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// A bind of our own first, to say "in use" rather than httplib's bare failure.
bool PortInUse(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool in_use = false;
  for (addrinfo* a = found; a != nullptr && !in_use; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    ReuseAddress(fd);
    in_use = bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
    close(fd);
  }
  freeaddrinfo(found);
  return in_use;
}

}  // namespace

absl::StatusOr<int> HttpServer::Bind() {
  http_->set_socket_options(ReuseAddress);
  int port = options_.port;
  if (port != 0 && PortInUse(options_.host, port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", port, ": the port is in use"));
  }
  const bool bound = port == 0 ? (port = http_->bind_to_any_port(options_.host)) > 0
                               : http_->bind_to_port(options_.host, port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":",
                                               options_.port,
                                               " (in use, or not an address of this machine)"));
  }
  return port;
}

void HttpServer::Serve() { http_->listen_after_bind(); }
void HttpServer::Stop() { http_->stop(); }

void HttpServer::Routes() {
  httplib::Server& s = *http_;
  // Each thread follows one request (a stream holds it to the end); more wait their turn.
  const size_t threads = static_cast<size_t>(std::max(2, options_.threads));
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // The probes and the gateway's scrapes carry no key (vLLM leaves /metrics open too). The
    // page is public: it asks for the key and sends it on the API calls.
    if (options_.api_key.empty() || req.path == "/health" || req.path == "/metrics" ||
        IsPagePath(req.path))
      return httplib::Server::HandlerResponse::Unhandled;
    // Anthropic's clients send the key as x-api-key.
    const std::string want = "Bearer " + options_.api_key;
    if (req.get_header_value("Authorization") == want ||
        req.get_header_value("x-api-key") == options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    // A browser's EventSource sets no headers: the event stream takes the key as ?key= too.
    if (req.path == "/k3/events" && req.get_param_value("key") == options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    const bool given = req.has_header("Authorization") || req.has_header("x-api-key");
    SendError(req, res,
              {401,
               given ? "Incorrect API key provided."
                     : "You didn't provide an API key: send it as 'Authorization: Bearer KEY' "
                       "or 'x-api-key: KEY'.",
               "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib answers itself (413, 404, 400 for a broken request) in the API's shape.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = absl::StrCat("HTTP ", res.status);
    std::string code;
    if (res.status == 413) {
      message = absl::StrCat("The request body is larger than ", options_.max_body_bytes,
                             " bytes (--max-body-mb).");
      code = "request_too_large";
    } else if (res.status == 404) {
      message = absl::StrCat("Unknown request URL: ", req.method, " ", req.path);
      code = "unknown_url";
    } else if (res.status == 405) {
      message = absl::StrCat("Method ", req.method, " is not allowed for ", req.path);
    }
    SendError(req, res,
              {res.status, message, res.status >= 500 ? "server_error" : "invalid_request_error",
               "", code});
  });
  // A bug must not take the server down or leave the client without an answer.
  s.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr e) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        SendError(req, res, {500, "internal error: " + what, "server_error", "", ""});
      });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    {
      std::lock_guard lock(counters_->mu);
      // Known routes by name, anything else as one label: a client cannot grow the table.
      const bool known = req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                         req.path == "/v1/messages" || req.path == "/v1/messages/count_tokens" ||
                         req.path == "/v1/models" || req.path == "/health" ||
                         req.path == "/metrics" || req.path == "/k3/events";
      ++counters_->requests[{known ? req.path : "other", res.status}];
    }
    if (options_.log_requests) {
      std::fprintf(stderr, "k3 serve: %s %s %d\n", req.method.c_str(), req.path.c_str(),
                   res.status);
    }
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Complete(req, res, Endpoint::kChat);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Complete(req, res, Endpoint::kCompletion);
  });
  s.Post("/v1/messages",
         [this](const httplib::Request& req, httplib::Response& res) { Messages(req, res); });
  s.Post("/v1/messages/count_tokens",
         [this](const httplib::Request& req, httplib::Response& res) { CountTokens(req, res); });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    // The context under both names clients read it by (vLLM's, and OpenRouter's).
    const int64_t context = service_.max_context();
    const json model = {
        {"id", options_.model_id}, {"object", "model"},        {"created", 0},
        {"owned_by", "k3"},        {"max_model_len", context}, {"context_length", context}};
    res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  // Ready once it answers at all (the server listens only after the model is open); 503 while
  // draining, so that a readiness probe takes the replica out of the pool.
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const ServiceStats st = service_.stats();
    if (st.draining) res.status = 503;
    res.set_content(Dump({{"status", st.draining ? "draining" : "ok"},
                          {"live", st.live},
                          {"queued", st.queued}}),
                    "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });
  s.Get("/k3/events", [this](const httplib::Request& req, httplib::Response& res) {
    ServeEngineEvents(service_.events(), options_.model_id, req, res);
  });
  AddPageRoutes(s, {.model_id = options_.model_id,
                    .api_key_required = !options_.api_key.empty(),
                    .context = service_.max_context(),
                    .max_tokens_default = options_.default_max_tokens});
}

std::string HttpServer::Metrics() const {
  const ServiceStats st = service_.stats();
  const StepMetrics& m = st.totals.steps;
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  metric("k3_http_requests_total", "counter", "HTTP requests answered, by path and status.");
  {
    std::lock_guard lock(counters_->mu);
    for (const auto& [key, n] : counters_->requests) {
      absl::StrAppend(&out, "k3_http_requests_total{path=\"", key.first, "\",code=\"", key.second,
                      "\"} ", n, "\n");
    }
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

}  // namespace k3::server
