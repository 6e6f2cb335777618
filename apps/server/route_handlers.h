// The handlers the route table (routes.h) names, one file an API: each answers one request
// with what ServerContext gives it.
#pragma once

#include "apps/server/routes.h"

namespace k3::server {

// OpenAI's (openai_routes.cc): POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
void ChatCompletions(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Completions(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Models(ServerContext& server, const httplib::Request& req, httplib::Response& res);

// Anthropic's (anthropic_routes.cc): POST /v1/messages and /v1/messages/count_tokens.
void Messages(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void CountTokens(ServerContext& server, const httplib::Request& req, httplib::Response& res);

// k3's own (k3_routes.cc). /health: ready once it answers at all (the server listens only
// after the model is open), 503 while draining, so that a readiness probe takes the replica
// out of the pool. /metrics: Prometheus text, the requests answered counted by route label.
// /k3/events: the plan event, then the engine's steps as EngineEvents gives them.
void Health(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Metrics(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Events(ServerContext& server, const httplib::Request& req, httplib::Response& res);

// The page's (page_routes.cc). GET / and /pipeline: the page (its script opens the tab the
// path names); GET /assets/NAME: one of its files, 404 for a name it does not have; GET
// /k3/info: the model's id, whether the API asks for a key, the context, and the max_tokens a
// request without one gets.
void Page(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Asset(ServerContext& server, const httplib::Request& req, httplib::Response& res);
void Info(ServerContext& server, const httplib::Request& req, httplib::Response& res);

}  // namespace k3::server
