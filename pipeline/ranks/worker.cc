#include "pipeline/ranks/worker.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/model/model.h"
#include "nlohmann/json.hpp"
#include "pipeline/busy_clock.h"
#include "pipeline/expert_reads.h"
#include "pipeline/expert_stream.h"
#include "pipeline/ranks/comm.h"

#ifdef K3_WITH_MPI
#include <mpi.h>
#endif

namespace k3::ranks {
namespace {

// The experts this rank reads and multiplies: the engine's expert streaming without the trunk.
struct Experts {
  ~Experts() {
    provider.reset();  // waits for its reads; then the reads, then the cache they land in
    reads.reads.reset();
  }
  std::unique_ptr<Checkpoint> ckpt;
  TrunkWeights no_trunk;  // the provider reads routers only to predict, which workers do not
  ExpertReads reads;
  BusyClock disk;
  std::unique_ptr<StreamingExpertProvider> provider;
};

absl::StatusOr<std::unique_ptr<Experts>> OpenExperts(const EngineOptions& options,
                                                     uint64_t& cache_bytes) {
  auto e = std::make_unique<Experts>();
  auto opened = Checkpoint::Open(options.model_dir);
  if (!opened.ok()) return opened.status();
  e->ckpt = *std::move(opened);
  // This rank's budget as one process would plan it; it holds no trunk, no sequence state and
  // no lm_head, so all but the activations' buffers (a job's rows and products fit in them) and
  // the vectors goes to the cache, up to every expert.
  auto run = PlanRun(*e->ckpt, PlanRequestOf(options, nullptr), AvailableRamBytes());
  if (!run.ok()) return run.status();
  const MemoryPlan& plan = run->memory;
  const ModelConfig& c = e->ckpt->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_dense(l) ? 0 : 1;
  const uint64_t slot = run->expert_slot_bytes;
  const uint64_t reserved = plan.buffer_bytes + plan.vector_bytes;
  const uint64_t room = plan.budget_bytes > reserved ? plan.budget_bytes - reserved : 0;
  const int64_t slots =
      std::min<int64_t>(std::max<int64_t>(plan.cache_slots, static_cast<int64_t>(room / slot)),
                        moe_layers * static_cast<int64_t>(c.num_experts));
  cache_bytes = static_cast<uint64_t>(slots) * slot;
  auto reads = OpenExpertReads(*e->ckpt, options, cache_bytes, slots, slot);
  if (!reads.ok()) return reads.status();
  e->reads = *std::move(reads);
  ExpertStreamOptions stream;
  stream.overlap = options.overlap;
  // Rank 0's lookahead sends its guesses for this rank's experts (kPrefetch).
  stream.prefetch_cap_bytes =
      static_cast<uint64_t>(options.prefetch_cap_fraction * static_cast<double>(cache_bytes));
  e->provider = std::make_unique<StreamingExpertProvider>(*e->ckpt, e->no_trunk, *e->reads.cache,
                                                          *e->reads.reads, e->reads.shard_files,
                                                          e->disk, stream);
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
  if (header.size() < 3) return absl::InternalError("a job without its header");
  const int64_t layer = header[0];
  const auto n = static_cast<size_t>(header[1]);
  if (header.size() < 3 + 2 * n) return absl::InternalError("a job's header cut short");
  MaybeFault(layer);
  const ModelConfig& config = e.ckpt->config();
  const size_t latent = config.routed_expert_hidden_size, width = config.moe_intermediate_size;
  // {layer, experts, rows, expert ids..., row counts..., each pair's row...}
  std::vector<int32_t> experts(n);
  std::vector<size_t> at(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    experts[i] = static_cast<int32_t>(header[3 + i]);
    at[i + 1] = at[i] + static_cast<size_t>(header[3 + n + i]);
  }
  if (header.size() != 3 + 2 * n + at[n] ||
      rows.size() != static_cast<size_t>(header[2]) * latent) {
    return absl::InternalError(absl::StrCat("a malformed job for layer ", layer));
  }
  const std::span<const int64_t> row_of(header.data() + 3 + 2 * n, at[n]);
  for (int64_t r : row_of) {
    if (r < 0 || r >= header[2]) return absl::InternalError("a job's row index out of range");
  }
  std::vector<float> products(at[n] * latent);
  auto use = [&](size_t i, const ExpertWeights& ew) {
    StepScratch::ExpertPass pass;
    for (size_t first = at[i]; first < at[i + 1]; first += kExpertRowsPerPass) {
      const size_t count = std::min(kExpertRowsPerPass, at[i + 1] - first);
      pass.in.resize(count * latent);
      pass.gate.resize(count * width);
      pass.up.resize(count * width);
      for (size_t k = 0; k < count; ++k) {
        std::copy_n(rows.data() + static_cast<size_t>(row_of[first + k]) * latent, latent,
                    pass.in.data() + k * latent);
      }
      RoutedExpertProduct(config, ew, pass.in, count, pass,
                          {products.data() + first * latent, count * latent});
    }
  };
  e.provider->StartFetch(layer, experts);
  if (absl::Status s = e.provider->ForEachExpert(layer, experts, use, nullptr); !s.ok()) return s;
  // Last, the seconds this rank spent on the job (reads and multiplies): what rank 0's round
  // trip took beyond it was on the wire.
  products.push_back(static_cast<float>(SecondsSince(t0)));
  if (absl::Status s = PostSend(0, kProducts, products); !s.ok()) return s;
  return WaitSends(Timeout());
}

// What rank 0 learns from the greeting's answer.
std::string Greeting(const absl::StatusOr<std::unique_ptr<Experts>>& e, uint64_t cache_bytes) {
  if (!e.ok()) return nlohmann::json{{"error", std::string(e.status().message())}}.dump();
  double rate = 0;
  for (const io::DeviceReport& d : (*e)->reads.reads->devices()) rate += d.rate;
  return nlohmann::json{{"cache_bytes", cache_bytes}, {"disk_rate", rate}}.dump();
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
      uint64_t cache_bytes = 0;
      auto o = options();
      absl::StatusOr<std::unique_ptr<Experts>> opened =
          o.ok() ? OpenExperts(*o, cache_bytes) : o.status();
      const std::string answer = Greeting(opened, cache_bytes);
      if (opened.ok()) experts = *std::move(opened);
      if (!PostSend(0, kInfo, answer).ok() || !WaitSends(Timeout()).ok()) return 1;
      continue;
    }
    if (m->tag == kPrefetch) {  // rank 0's lookahead guessed these of ours for a later layer
      std::vector<int64_t> guess;
      if (!Receive(*m, guess).ok()) return 1;
      if (experts != nullptr && guess.size() > 1) {
        const std::vector<int32_t> ids(guess.begin() + 1, guess.end());
        experts->provider->Prefetch(guess[0], ids);
      }
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
