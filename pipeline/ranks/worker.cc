#include "pipeline/ranks/worker.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/model/moe.h"
#include "pipeline/busy_clock.h"
#include "pipeline/expert_reads.h"
#include "pipeline/ranks/comm.h"
#include "pipeline/ranks/identity.h"
#include "pipeline/ranks/protocol.h"
#include "pipeline/run_plan.h"

#ifdef K3_WITH_MPI
#include <mpi.h>
#endif

namespace k3::ranks {
namespace {

// The experts this rank reads and multiplies: the engine's expert side without the trunk.
struct Experts {
  std::unique_ptr<Checkpoint> ckpt;
  TrunkWeights no_trunk;  // the provider reads routers only to predict, which workers do not
  BusyClock disk;
  ExpertReads side;
  std::unique_ptr<StepScratch> scratch;  // its expert passes
  RankIdentity identity;
};

absl::StatusOr<std::unique_ptr<Experts>> OpenExperts(const EngineOptions& options) {
  auto e = std::make_unique<Experts>();
  auto opened = Checkpoint::Open(options.model_dir);
  if (!opened.ok()) return opened.status();
  e->ckpt = *std::move(opened);
  auto run = PlanExpertRank(*e->ckpt, PlanRequestOf(options, nullptr), AvailableRamBytes());
  if (!run.ok()) return run.status();
  auto side = OpenExpertReads(*e->ckpt, options, *run);
  if (!side.ok()) return side.status();
  e->side = *std::move(side);
  // Rank 0's lookahead sends its guesses for this rank's experts (kPrefetch).
  StreamExperts(e->side, *e->ckpt, e->no_trunk, e->disk, options);
  e->scratch = std::make_unique<StepScratch>(e->ckpt->config());
  auto identity = IdentifyRank(options.model_dir);
  if (!identity.ok()) return identity.status();
  e->identity = *std::move(identity);
  return e;
}

// Set once rank 0 said to exit; until then a worker that exits says so, naming itself (mpirun
// then ends the job, naming the process only by its job id and rank).
bool told_to_exit = false;

void SayUnexpectedExit() {
  if (told_to_exit) return;
  std::fprintf(stderr, "k3: %s exits before rank 0 ended the job\n", Name(world().rank).c_str());
}

// Tests: K3_RANK_FAULT=RANK:LAYER:MODE makes rank RANK fail on its first job at or past LAYER:
// exit (std::exit(3) in the middle of the job, no answer), kill (SIGKILL, as a crash or the
// out-of-memory killer would) or hang (never answers).
void MaybeFault(int64_t layer) {
  const char* spec = std::getenv("K3_RANK_FAULT");
  if (spec == nullptr) return;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int rank = -1;
  int64_t at = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &rank) || !absl::SimpleAtoi(parts[1], &at) ||
      rank != world().rank || layer < at) {
    return;
  }
  if (parts[2] == "kill") raise(SIGKILL);
  if (parts[2] == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::exit(3);
}

// One layer job: its header and rows from rank 0, the products back.
absl::Status RunJob(Experts& e, Incoming& m) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> header;
  if (absl::Status s = Receive(m, header); !s.ok()) return s;
  static const Tag kRowsTag[] = {kRows};
  auto rows_msg = Await(0, kRowsTag, Timeout());
  if (!rows_msg.ok()) return rows_msg.status();
  std::vector<float> rows;
  if (absl::Status s = Receive(*rows_msg, rows); !s.ok()) return s;
  const ModelConfig& config = e.ckpt->config();
  auto job = DecodeLayerJob(header, std::move(rows), config);
  if (!job.ok()) return job.status();
  MaybeFault(job->layer);
  // Expert i's pairs are [at[i], at[i + 1]) of the job's; each product goes to its pair's row.
  std::vector<size_t> at(job->experts.size() + 1, 0), pair(job->row_of.size());
  for (size_t i = 0; i < job->experts.size(); ++i) at[i + 1] = at[i] + job->counts[i];
  std::iota(pair.begin(), pair.end(), size_t{0});
  const std::span<const size_t> row_of = job->row_of, to = pair;
  LayerResult result;
  result.products.reserve(pair.size() * config.routed_expert_hidden_size + 1);  // + the seconds
  result.products.resize(pair.size() * config.routed_expert_hidden_size);
  auto use = [&](size_t i, const ExpertWeights& ew) {
    const size_t n = at[i + 1] - at[i];
    ExpertRows(config, ew, job->rows, row_of.subspan(at[i], n), to.subspan(at[i], n), *e.scratch,
               result.products);
  };
  StreamingExpertProvider& provider = *e.side.provider;
  provider.StartFetch(job->layer, job->experts);
  if (absl::Status s = provider.ForEachExpert(job->layer, job->experts, use, nullptr); !s.ok()) {
    return s;
  }
  // What rank 0's round trip took beyond this was on the wire.
  result.seconds = SecondsSince(t0);
  const std::vector<float> message = EncodeLayerResult(std::move(result));
  if (absl::Status s = PostSend(0, kProducts, message); !s.ok()) return s;
  return WaitSends(Timeout());
}

// What rank 0 learns from the greeting's answer.
std::string Greeting(const absl::StatusOr<std::unique_ptr<Experts>>& e) {
  if (!e.ok()) return EncodeWorkerInfo({.error = std::string(e.status().message())});
  double rate = 0;
  for (const io::DeviceReport& d : (*e)->side.reads->devices()) rate += d.rate;
  return EncodeWorkerInfo({.capacity = {.cache_bytes = (*e)->side.cache_bytes, .disk_rate = rate},
                           .identity = (*e)->identity});
}

}  // namespace

int RunWorker(const std::function<absl::StatusOr<EngineOptions>()>& options) {
  static const Tag kWork[] = {kHello, kJob, kShutdown, kPing, kPrefetch};
  std::atexit(SayUnexpectedExit);
  std::unique_ptr<Experts> experts;
  for (;;) {
    auto m = Await(0, kWork, absl::InfiniteDuration());
    if (!m.ok()) return 1;
    if (m->tag == kShutdown) {
      told_to_exit = true;
      std::vector<int64_t> bye;
      (void)Receive(*m, bye);
      break;
    }
    if (m->tag == kHello) {
      std::vector<int64_t> hello;
      (void)Receive(*m, hello);
      experts.reset();
      auto o = options();
      absl::StatusOr<std::unique_ptr<Experts>> opened = o.ok() ? OpenExperts(*o) : o.status();
      const std::string answer = Greeting(opened);
      if (opened.ok()) experts = *std::move(opened);
      if (!PostSend(0, kInfo, answer).ok() || !WaitSends(Timeout()).ok()) return 1;
      continue;
    }
    if (m->tag == kPrefetch) {  // rank 0's lookahead guessed these of ours for a later layer
      std::vector<int64_t> message;
      if (!Receive(*m, message).ok()) return 1;
      if (experts == nullptr) continue;
      // A garbled guess costs nothing: the layer's job will read what it needs.
      auto guess = DecodeLayerGuess(message, experts->ckpt->config());
      if (guess.ok()) experts->side.provider->Prefetch(guess->layer, guess->experts);
      continue;
    }
    if (m->tag == kPing) {  // rank 0 measures the link: answer with as many floats as asked
      std::vector<float> ping;
      if (!Receive(*m, ping).ok() || ping.empty()) return 1;
      const std::vector<float> pong(static_cast<size_t>(ping[0]), 0.0f);
      if (!PostSend(0, kPing, pong).ok() || !WaitSends(Timeout()).ok()) return 1;
      continue;
    }
    absl::Status s = experts != nullptr
                         ? RunJob(*experts, *m)
                         : absl::FailedPreconditionError("a layer job came before the experts");
    if (!s.ok()) {
      // Rank 0 reports it, names this rank and ends the job.
      const std::string text(s.message());  // kept until the send completes
      if (!PostSend(0, kError, text).ok() || !WaitSends(Timeout()).ok()) return 1;
    }
  }
  experts.reset();
#ifdef K3_WITH_MPI
  MPI_Finalize();
#endif
  return 0;
}

}  // namespace k3::ranks
