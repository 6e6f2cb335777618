#include "apps/server/http_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "apps/server/anthropic_request.h"
#include "apps/server/http_internal.h"
#include "apps/server/routes.h"
#include "httplib.h"

namespace k3::server {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string DumpOrdered(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
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
    : server_(std::make_unique<ServerContext>(service, tokenizer, std::move(stop_ids), vocab_size,
                                              options)),
      http_(std::make_unique<httplib::Server>()) {
  Configure();
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
  const ServerOptions& options = server_->options();
  int port = options.port;
  if (port != 0 && PortInUse(options.host, port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", port, ": the port is in use"));
  }
  const bool bound = port == 0 ? (port = http_->bind_to_any_port(options.host)) > 0
                               : http_->bind_to_port(options.host, port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":", options.port,
                                               " (in use, or not an address of this machine)"));
  }
  return port;
}

void HttpServer::Serve() { http_->listen_after_bind(); }
void HttpServer::Stop() { http_->stop(); }

namespace {

// A bug must not take the server down or leave the client without an answer.
void AnswerException(const httplib::Request& req, httplib::Response& res, std::exception_ptr e) {
  std::string what = "unknown error";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
  }
  SendError(req, res, {500, "internal error: " + what, "server_error", "", ""});
}

}  // namespace

void HttpServer::Configure() {
  httplib::Server& s = *http_;
  // Each thread follows one request (a stream holds it to the end); more wait their turn.
  const size_t threads = static_cast<size_t>(std::max(2, server_->options().threads));
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(server_->options().max_body_bytes);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (Admitted(req)) return httplib::Server::HandlerResponse::Unhandled;
    Refuse(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler(
      [this](const httplib::Request& req, httplib::Response& res) { AnswerError(req, res); });
  s.set_exception_handler(AnswerException);
  s.set_logger(
      [this](const httplib::Request& req, const httplib::Response& res) { Log(req, res); });
  for (const Route& route : RouteTable()) {
    auto handler = [server = server_.get(), handle = route.handler](const httplib::Request& req,
                                                                    httplib::Response& res) {
      handle(*server, req, res);
    };
    if (route.method == "POST") {
      s.Post(std::string(route.pattern), handler);
    } else {
      s.Get(std::string(route.pattern), handler);
    }
  }
}

bool HttpServer::Admitted(const httplib::Request& req) const {
  const std::string& key = server_->options().api_key;
  const Route* route = FindRoute(req.path);
  const Access access = route != nullptr ? route->access : Access::kKey;
  if (key.empty() || access == Access::kPublic) return true;
  // Anthropic's clients send the key as x-api-key.
  if (req.get_header_value("Authorization") == "Bearer " + key ||
      req.get_header_value("x-api-key") == key)
    return true;
  return access == Access::kKeyOrQuery && req.get_param_value("key") == key;
}

void HttpServer::Refuse(const httplib::Request& req, httplib::Response& res) const {
  const bool given = req.has_header("Authorization") || req.has_header("x-api-key");
  SendError(req, res,
            {401,
             given ? "Incorrect API key provided."
                   : "You didn't provide an API key: send it as 'Authorization: Bearer KEY' "
                     "or 'x-api-key: KEY'.",
             "invalid_request_error", "", "invalid_api_key"});
}

// Errors httplib answers itself (413, 404, 400 for a broken request) in the API's shape.
void HttpServer::AnswerError(const httplib::Request& req, httplib::Response& res) const {
  if (!res.body.empty()) return;
  std::string message = absl::StrCat("HTTP ", res.status);
  std::string code;
  if (res.status == 413) {
    message = absl::StrCat("The request body is larger than ", server_->options().max_body_bytes,
                           " bytes (--max-body-mb).");
    code = "request_too_large";
  } else if (res.status == 404) {
    message = absl::StrCat("Unknown request URL: ", req.method, " ", req.path);
    code = "unknown_url";
  } else if (res.status == 405) {
    message = absl::StrCat("Method ", req.method, " is not allowed for ", req.path);
  }
  SendError(req, res,
            {res.status, message, res.status >= 500 ? "server_error" : "invalid_request_error", "",
             code});
}

void HttpServer::Log(const httplib::Request& req, const httplib::Response& res) {
  server_->Count(RouteLabel(req.path), res.status);
  if (server_->options().log_requests) {
    std::fprintf(stderr, "k3 serve: %s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
  }
}

}  // namespace k3::server
