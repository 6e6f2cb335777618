// k3 serve: an OpenAI-compatible HTTP server (apps/server/) on the batched engine, so that
// existing clients, editors and agents can use the model. Concurrent requests share every
// trunk pass and expert read (pipeline/batch_scheduler.h).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/options/generate_options.h"
#include "apps/options/prompt_cache_flags.h"
#include "apps/reports/run_report.h"
#include "apps/server/generation_service.h"
#include "apps/server/http_server.h"
#include "apps/server/routes.h"
#include "pipeline/engine.h"

namespace k3::cli {
namespace {

constexpr char kServeName[] = "serve";
constexpr int kDefaultBatch = 8;
constexpr int kDefaultSavedStates = 4;

struct Shape {
  int batch = 1;
  int saved_states = 0;
};

// The sequences the batch and the saved states may take, for the engine to plan: as asked, or
// what the budget holds beside the model (a batch of up to 8, then up to 4 saved states). More
// than the budget holds is refused naming the most it holds.
absl::Status ChooseShape(EngineOptions& options) {
  const int asked_batch = absl::GetFlag(FLAGS_batch);
  const int asked_saved = absl::GetFlag(FLAGS_saved_states);
  if (asked_batch < 0) return absl::InvalidArgumentError("--batch must be >= 0");
  if (asked_saved < -1) return absl::InvalidArgumentError("--saved-states must be >= -1");
  options.sequences = 0;
  options.min_sequences = std::max(asked_batch, 1) + std::max(asked_saved, 0);
  options.max_sequences = (asked_batch > 0 ? asked_batch : kDefaultBatch) +
                          (asked_saved >= 0 ? asked_saved : kDefaultSavedStates);
  if (asked_saved >= 0) {  // else a refusal names the --batch asked for
    options.sequences_source =
        asked_batch > 0 ? absl::StrCat("--batch ", asked_batch, " and --saved-states ", asked_saved)
                        : absl::StrCat("--saved-states ", asked_saved, " beside a batch of 1");
  }
  return absl::OkStatus();
}

// The sequences the engine planned, split into the batch and the saved states.
Shape ShapeOf(const Engine& engine) {
  const int planned = engine.sequences();
  const int asked_batch = absl::GetFlag(FLAGS_batch);
  const int asked_saved = absl::GetFlag(FLAGS_saved_states);
  Shape s;
  s.batch = asked_saved >= 0  ? planned - asked_saved
            : asked_batch > 0 ? asked_batch
                              : std::min(planned, kDefaultBatch);
  s.saved_states = planned - s.batch;
  return s;
}

absl::StatusOr<server::ServerOptions> ServerOptionsFromFlags(const EngineOptions& engine) {
  server::ServerOptions o;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  if (o.port < 0 || o.port > 65535)
    return absl::InvalidArgumentError("--port must be in [0, 65535]");
  o.api_key = absl::GetFlag(FLAGS_api_key);
  if (const char* env = std::getenv("K3_API_KEY"); o.api_key.empty() && env != nullptr)
    o.api_key = env;
  const double mb = absl::GetFlag(FLAGS_max_body_mb);
  if (!(mb > 0 && mb <= 1024))
    return absl::InvalidArgumentError("--max-body-mb must be in (0, 1024]");
  o.max_body_bytes = static_cast<size_t>(mb * 1024 * 1024);
  o.default_max_tokens = absl::GetFlag(FLAGS_n_predict);
  if (o.default_max_tokens < 0) return absl::InvalidArgumentError("--n-predict must be >= 0");
  o.reasoning_budget = absl::GetFlag(FLAGS_reasoning_budget);
  if (o.reasoning_budget < -1) {
    return absl::InvalidArgumentError("--reasoning-budget must be -1 (no limit) or >= 0");
  }
  o.model_id = absl::GetFlag(FLAGS_model_id);
  if (o.model_id.empty()) {
    o.model_id = std::filesystem::path(engine.model_dir).lexically_normal().filename().string();
    if (o.model_id.empty())
      o.model_id = std::filesystem::path(engine.model_dir).parent_path().filename().string();
  }
  o.log_requests = !absl::GetFlag(FLAGS_quiet);
  return o;
}

// Draining: new requests get 503 (and /health), those in flight run to their end, for up to
// `seconds` or until another signal comes. Polled: the wait for a signal is the pause.
void Drain(server::GenerationService& service, const sigset_t& signals, double seconds) {
  service.Drain();
  std::fprintf(stderr,
               "k3 serve: terminated, draining: %lld requests in flight, at most %g s "
               "(--drain-seconds; a second signal stops at once)\n",
               static_cast<long long>(service.in_flight()), seconds);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(seconds));
  while (service.in_flight() > 0) {
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "k3 serve: drain time up, ending %lld requests\n",
                   static_cast<long long>(service.in_flight()));
      return;
    }
    timespec pause = {0, 100'000'000};
    if (sigtimedwait(&signals, nullptr, &pause) > 0) {
      std::fprintf(stderr, "k3 serve: signalled again, ending %lld requests\n",
                   static_cast<long long>(service.in_flight()));
      return;
    }
  }
  std::fprintf(stderr, "k3 serve: drained, stopping\n");
}

int RunServe(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kServeName, "unexpected argument: " + positional[0]);
  // Signals go to one thread that stops the server, not to whichever thread they hit: block
  // them before the engine starts its threads. A client that goes away must not kill us.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto options = EngineOptionsFromFlags();
  if (!options.ok()) return ReportError(kServeName, options.status());
  if (absl::GetFlag(FLAGS_max_queue) < 0) return UsageError(kServeName, "--max-queue must be >= 0");
  if (const double d = absl::GetFlag(FLAGS_drain_seconds); !(d >= 0 && d <= 86400)) {
    return UsageError(kServeName, "--drain-seconds must be in [0, 86400]");
  }
  auto tokenizer = FindTokenizer(options->model_dir, /*required=*/true);
  if (!tokenizer.ok()) return ReportError(kServeName, tokenizer.status());
  if (auto s = ChooseShape(*options); !s.ok()) return ReportError(kServeName, s);
  auto server_options = ServerOptionsFromFlags(*options);
  if (!server_options.ok()) return ReportError(kServeName, server_options.status());
  auto engine = Engine::Open(*options);
  if (!engine.ok()) return ReportError(kServeName, engine.status());
  const Shape shape = ShapeOf(**engine);
  // One thread follows each request in the batch or the queue, one each client of the
  // engine's events, and a few answer the rest.
  server_options->threads =
      shape.batch + absl::GetFlag(FLAGS_max_queue) + server::EngineEvents::kMaxClients + 4;
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  if (!quiet) std::fprintf(stderr, "%s", PlanText(**engine).c_str());
  WarnAtStart(**engine);
  auto stops = StopIds((*engine)->config(), *tokenizer);
  if (!stops.ok()) return ReportError(kServeName, stops.status());

  server::ServiceOptions service_options;
  service_options.batch = {.batch = shape.batch};
  service_options.max_queue = absl::GetFlag(FLAGS_max_queue);
  auto cache = PromptCacheFromFlags(**engine, kServeName, static_cast<size_t>(shape.saved_states));
  if (!cache.ok()) return ReportError(kServeName, cache.status());
  service_options.prompt_cache = cache->get();
  server::GenerationService service(**engine, service_options);
  server::HttpServer http(service, **tokenizer, *stops,
                          static_cast<int>((*engine)->config().vocab_size), *server_options);
  auto port = http.Bind();
  if (!port.ok()) return ReportError(kServeName, port.status());
  std::fprintf(stderr,
               "listening on http://%s:%d (model %s; batch %d, queue %d, saved states "
               "%d, context %lld, prompt cache %s)%s\n",
               server_options->host.c_str(), *port, server_options->model_id.c_str(), shape.batch,
               service_options.max_queue, shape.saved_states,
               static_cast<long long>((*engine)->max_context()),
               *cache != nullptr && (*cache)->on_disk() ? (*cache)->directory().c_str() : "none",
               server_options->api_key.empty() ? "" : "; an API key is required");
  // SIGTERM (what an orchestrator sends) drains first, up to --drain-seconds. Then, or at once
  // on Ctrl-C: the live and waiting requests end (a stream gets an error event, a plain
  // request 503), so that the HTTP threads are free when the server stops.
  const double drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  std::atomic<bool> signalled{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (signalled.exchange(true)) return;  // the wake-up below
    if (sig == SIGTERM && drain_seconds > 0) {
      Drain(service, signals, drain_seconds);
    } else {
      std::fprintf(stderr, "k3 serve: %s, stopping\n",
                   sig == SIGINT ? "interrupted" : "terminated");
    }
    service.Stop();
    http.Stop();
  });
  http.Serve();
  // The stopper waits for a signal that never comes when Serve ended otherwise.
  if (!signalled.exchange(true)) pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  service.Stop();
  std::fprintf(stderr, "k3 serve: stopped\n");
  return kExitOk;
}

constexpr char kServeText[] =
    "Serves the routes listed below: OpenAI's chat completions (the Kimi chat template) and\n"
    "completions, Anthropic's Messages, the engine's figures as server-sent events\n"
    "(docs/EVENTS.md), and a page of its own (the chat, and the engine live), compiled into\n"
    "the binary. \"return_progress\": true on a stream sends the prompt's progress as it runs\n"
    "(llama.cpp's prompt_progress). With --api-key, every route but those marked (no key)\n"
    "asks for the key; GET /k3/events also takes it as ?key=KEY (the page asks the user for\n"
    "it). Requests run together in one batch of --batch sequences (default: what the\n"
    "budget holds, at most 8): they share every trunk pass and expert read.\n"
    "Up to --max-queue more wait for a place; past\n"
    "that a request gets 429 with Retry-After. A streaming client that disconnects ends its\n"
    "sequence at the next step. A request whose tokens extend an earlier one (the next turn\n"
    "of a chat, the same request again) resumes that sequence's saved state instead of\n"
    "running the whole prompt again; the tokens are the same either way. The states are kept\n"
    "in memory (--saved-states, least recently used out) and in --prompt-cache DIR (default\n"
    "$XDG_CACHE_HOME/k3/prompt-cache, none: off; bounded by --prompt-cache-gb), which a\n"
    "restart keeps.\n"
    "Chat requests may declare tools (tools, tool_choice, parallel_tool_calls) and ask for\n"
    "JSON (response_format json_object or json_schema): the reply is then sampled under the\n"
    "grammar of Kimi K3's tool-call markup and the schemas, and its calls come back as\n"
    "tool_calls (docs/TOOLS.md). chat_template_kwargs {\"thinking\": false} turns the think\n"
    "channel off; reasoning_effort is low, high or max (the default). --reasoning-budget N\n"
    "(or a request's reasoning_budget) closes the think channel after N tokens and opens\n"
    "the response, so that an answer comes.\n"
    "Sampling follows the API: temperature 1 and top_p 1 unless the request says otherwise\n"
    "(temperature 0 is greedy), a random seed unless it gives one; max_tokens defaults to\n"
    "--n-predict. Errors come in the API's shape ({\"error\": {\"message\", \"type\",\n"
    "\"param\", \"code\"}}). Listens on loopback unless --host says otherwise.\n"
    "GET /health answers 200 once the model is open and 503 while draining. SIGTERM drains:\n"
    "new requests get 503, those in flight finish (for up to --drain-seconds, default 30),\n"
    "then it exits 0; Ctrl-C, a second signal or --drain-seconds 0 ends the requests in\n"
    "flight at once (a stream gets an error event) and exits 0. /metrics also carries the\n"
    "gauges an inference gateway routes by, under vLLM's names (docs/SCALE.md).";

}  // namespace

const Subcommand& ServeCommand() {
  static const std::string kDescription =
      absl::StrCat(kServeText, "\n\nroutes:\n", server::RoutesHelp());
  static const Subcommand kCommand = {
      kServeName,
      "an OpenAI-compatible HTTP server (chat and completions, streaming) on the batched engine",
      "serve [--model DIR] [memory flags] [--host 127.0.0.1] [--port 8080] [--api-key KEY] "
      "[--max-queue N] [--batch B] [--drain-seconds S]",
      kDescription,
      kServe,
      RunServe};
  return kCommand;
}

}  // namespace k3::cli
