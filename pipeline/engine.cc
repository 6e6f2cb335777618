// Engine::Open: wires the checkpoint, the memory plan, the pinned trunk, the expert cache, the
// read router, the streaming expert provider and the trunk streamer into a Model.
#include "pipeline/engine.h"

#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/stripe.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/model/model.h"
#include "core/util/progress.h"
#include "pipeline/cache/policy.h"
#include "pipeline/expert_reads.h"
#include "pipeline/expert_stream.h"
#include "pipeline/held_trunk.h"
#include "pipeline/ranks/comm.h"
#include "pipeline/ranks/distributed_experts.h"
#include "pipeline/ranks/identity.h"
#include "pipeline/trunk_stream.h"

namespace k3 {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// Everything the engine owns, in the order it is built; destroyed users first (~Parts).
struct Engine::Parts {
  ~Parts() {
    // Order matters: the users of the reads go first, the memory reads land in last.
    model.reset();
    held.reset();
    streamer.reset();
    ranked.reset();
  }  // then `side`: the provider, the reads, the cache

  absl::Status Init(const EngineOptions& options);
  absl::Status OpenReads();
  absl::Status Connect();
  absl::Status LoadPinnedTrunk();

  // Every file the engine reads: the shards, and the trunk pack when there is one.
  std::vector<io::FileId> FileIds() const {
    std::vector<io::FileId> ids = side.shard_files;
    if (pack != nullptr) ids.push_back(pack_file);
    return ids;
  }

  int BufferedFiles() const {
    const std::vector<io::FileId> ids = FileIds();
    return static_cast<int>(std::count_if(
        ids.begin(), ids.end(), [&](io::FileId id) { return !side.reads->file(id).direct; }));
  }

  // Runs `forward` and adds its figures (time, bytes, stalls, disk busy) to `metrics`.
  template <typename Fn>
  absl::Status Measured(size_t tokens, StepMetrics* metrics, Fn forward) {
    side.provider->BeginStep();
    const auto t0 = Clock::now();
    const double busy0 = disk.seconds();
    absl::Status s = forward();
    StepMetrics m;
    side.provider->TakeMetrics(m);
    if (ranked != nullptr) ranked->TakeMetrics(m);
    streamer->TakeMetrics(m);
    if (held != nullptr) held->TakeMetrics(m);
    m.tokens = static_cast<int64_t>(tokens);
    m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    m.disk_busy_seconds = disk.seconds() - busy0;
    if (metrics != nullptr) metrics->Add(m);
    return s;
  }

  EngineOptions options;  // as given
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<TrunkPack> pack;
  RunPlan run;
  const MemoryPlan& plan = run.memory;
  int threads = 0;
  std::unique_ptr<tbb::global_control> limit;
  std::unique_ptr<TrunkWeights> trunk;
  BusyClock disk;    // told about every read: outlives `side`
  ExpertReads side;  // the expert cache, the read engine over the shards and the provider
  io::FileId pack_file = -1;
  // Under mpirun with several ranks: rank 0's experts from side.provider, the others' from theirs.
  std::unique_ptr<ranks::DistributedExperts> ranked;
  std::unique_ptr<TrunkStreamer> streamer;
  std::unique_ptr<HeldTrunk> held;  // pinned matrices held compressed, if any
  std::unique_ptr<Model> model;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  auto parts = std::make_unique<Parts>();
  if (absl::Status s = parts->Init(options); !s.ok()) return s;
  return std::unique_ptr<Engine>(new Engine(std::move(parts)));
}

Engine::Engine(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
Engine::~Engine() = default;

const Checkpoint& Engine::checkpoint() const { return *parts_->ckpt; }
const ModelConfig& Engine::config() const { return parts_->ckpt->config(); }
const MemoryPlan& Engine::plan() const { return parts_->plan; }
const EngineOptions& Engine::options() const { return parts_->options; }
int Engine::sequences() const { return parts_->plan.sequences; }
int64_t Engine::prefill_chunk() const { return parts_->plan.prefill_chunk; }
int64_t Engine::max_context() const { return parts_->plan.context; }
int64_t Engine::layers_run() const { return parts_->model->layers_run(); }
const std::string& Engine::context_warning() const { return parts_->run.context_warning; }
int Engine::sequences_budget_holds() const { return parts_->run.sequences_budget_holds; }
SequenceState Engine::NewState() const { return SequenceState(config()); }

std::vector<PrefetchAccuracy> Engine::prefetch_accuracy() const {
  return parts_->side.provider->accuracy();
}

std::vector<io::DeviceReport> Engine::devices() const { return parts_->side.reads->devices(); }

void Engine::StepLayers(std::vector<LayerFigures>& out) const {
  parts_->side.provider->StepLayers(out);
}
std::vector<ranks::RankTraffic> Engine::ranks() const {
  return parts_->ranked != nullptr ? parts_->ranked->traffic() : std::vector<ranks::RankTraffic>{};
}

void Engine::StartReadLog() { parts_->side.reads->StartLog(); }

io::ReadLog Engine::TakeReadLog() {
  io::ReadRouter& reads = *parts_->side.reads;
  io::ReadLog log{.paths = {}, .reads = reads.TakeLog(), .options = reads.options()};
  log.options.engine.arena = nullptr;
  log.options.engine.faults = nullptr;
  log.options.on_warning = nullptr;
  const std::vector<io::FileId> ids = parts_->FileIds();
  log.paths.resize(*std::max_element(ids.begin(), ids.end()) + 1);
  log.stripes.resize(log.paths.size());
  for (io::FileId id : ids) {
    log.paths[id] = reads.file(id).path;
    log.stripes[id] = reads.stripes(id);
  }
  return log;
}

nlohmann::json Engine::Settings() const {
  const EngineOptions& o = parts_->options;
  const MemoryPlan& plan = parts_->plan;
  return {{"model", o.model_dir},
          {"trunk_pack", o.trunk_dir},
          {"memory", plan.source},
          {"budget_bytes", plan.budget_bytes},
          {"cache_bytes", plan.cache_bytes},
          {"cache_slots", plan.cache_slots},
          {"trunk_pinned_bytes", plan.pinned_trunk_bytes},
          {"streamed_layers", plan.streamed_layers()},
          {"ring_slots", plan.ring_slots},
          {"ring_piece_bytes", plan.piece_bytes},
          {"embedding_resident", plan.embedding_resident},
          {"lm_head_resident", plan.lm_head_resident},
          {"routers_resident", plan.routers_resident},
          {"cache_policy", std::string(parts_->side.cache->policy_name())},
          {"queue_depth", o.queue_depth},
          {"prefetch_distance", o.overlap ? o.prefetch_distance : 0},
          {"prefill_prefetch_distance", o.overlap ? o.prefill_prefetch_distance : 0},
          {"prefetch_width", parts_->side.stream.prefetch_width},
          {"prefetch_cap_bytes", parts_->side.stream.prefetch_cap_bytes},
          {"threads", parts_->threads},
          {"overlap", o.overlap},
          {"prefill_chunk", plan.prefill_chunk},
          {"max_context", plan.context},
          {"storage_profile", o.storage_profile.name},
          {"io_backend", std::string(parts_->side.reads->backend_name())},
          {"direct_io", o.direct_io},
          {"volumes", io::VolumeSpecs(o.volumes)},
          {"buffered_files", parts_->BufferedFiles()},
          {"ranks", parts_->ranked != nullptr ? parts_->ranked->partition().ranks() : 1}};
}

std::string Engine::DescribeReads() const {
  const int buffered = parts_->BufferedFiles();
  const size_t files = parts_->FileIds().size();
  const std::vector<io::DeviceReport> devices = parts_->side.reads->devices();
  std::string line = absl::StrCat(
      "  reads                 ", std::string(parts_->side.reads->backend_name()), ", queue depth ",
      parts_->options.queue_depth, devices.size() > 1 ? " per drive, " : ", ");
  if (buffered == 0) {
    absl::StrAppend(&line, "O_DIRECT\n");
  } else {
    absl::StrAppend(&line, "buffered: the file system refused O_DIRECT for ", buffered, " of ",
                    files,
                    " files, so the page cache also holds what is read and the budget is "
                    "not exact\n");
  }
  if (parts_->ranked != nullptr) absl::StrAppend(&line, parts_->ranked->Describe());
  if (devices.size() > 1) {
    absl::StrAppend(&line, "  drives                ", devices.size(),
                    ", each read split over the drives holding its bytes by their rates\n");
    for (const io::DeviceReport& d : devices) {
      const bool own = d.dirs.size() == 1 && d.dirs[0] == d.id;  // a volume with its profile
      absl::StrAppend(&line, "    ", own ? "" : d.id + "  ", absl::StrJoin(d.dirs, ", "), "  (",
                      d.profile, ")\n");
    }
  }
  return line;
}

absl::Status Engine::Prefill(std::span<const int32_t> ids, SequenceState& state,
                             std::vector<float>& logits, StepMetrics* metrics) {
  const auto chunk = static_cast<size_t>(prefill_chunk());
  for (size_t at = 0; at < ids.size(); at += chunk) {
    const size_t n = std::min(chunk, ids.size() - at);
    if (auto s = Forward(ids.subspan(at, n), state, false, logits, metrics); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Engine::Decode(int32_t id, SequenceState& state, std::vector<float>& logits,
                            StepMetrics* metrics) {
  return Forward({&id, 1}, state, false, logits, metrics);
}

absl::Status Engine::Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                             std::vector<float>& logits, StepMetrics* metrics) {
  return parts_->Measured(ids.size(), metrics, [&] {
    return parts_->model->Forward(ids, state, all_positions, logits);
  });
}

absl::Status Engine::Step(std::span<const BatchSegment> segments, std::vector<float>& logits,
                          StepMetrics* metrics, const LayerObserver& observer) {
  size_t tokens = 0;
  for (const BatchSegment& s : segments) tokens += s.ids.size();
  return parts_->Measured(tokens, metrics,
                          [&] { return parts_->model->ForwardBatch(segments, logits, observer); });
}

absl::Status Engine::Parts::LoadPinnedTrunk() {
  std::optional<ProgressBar> bar;
  // One bar per part loaded, created on the first figures (so it knows the total).
  auto progress = [&](const char* label) {
    return [&bar, label, this](uint64_t done, uint64_t total) {
      if (!bar) bar.emplace(label, total, "B", options.show_progress && total > (256u << 20));
      bar->Update(done);
    };
  };
  if (auto tensors = HeldCompressedTensors(*ckpt, pack.get(), plan); !tensors.empty()) {
    auto loaded = HeldTrunk::Load(*pack, tensors, *side.reads, pack_file,
                                  progress("loading compressed trunk"));
    bar.reset();  // finishes it
    if (!loaded.ok()) return loaded.status();
    held = *std::move(loaded);
    streamer->ReportErrorsOf(held.get());
  }
  TrunkResidency residency = plan.residency();
  residency.held = [this](const TensorInfo& t) { return held != nullptr && held->Holds(t); };
  residency.stream = [this](const TensorInfo& t) {
    return held != nullptr && held->Holds(t) ? held->Handle(t) : streamer->Handle(t);
  };
  auto loaded = LoadTrunkWeights(*ckpt, progress("loading trunk"), residency);
  bar.reset();
  if (!loaded.ok()) return loaded.status();
  trunk = *std::move(loaded);
  return absl::OkStatus();
}

absl::Status Engine::Parts::OpenReads() {
  auto opened = OpenExpertReads(*ckpt, options, run);
  if (!opened.ok()) return opened.status();
  side = *std::move(opened);
  if (pack != nullptr) {
    auto id = side.reads->OpenFile(pack->pack_path());
    if (!id.ok()) return id.status();
    pack_file = *id;
  }
  return absl::OkStatus();
}

// Under mpirun with several ranks: the other ranks' experts beside rank 0's own.
absl::Status Engine::Parts::Connect() {
  double rate = 0;
  for (const io::DeviceReport& d : side.reads->devices()) rate += d.rate;
  auto identity = ranks::IdentifyRank(ckpt->dir());
  if (!identity.ok()) return identity.status();
  auto connected = ranks::DistributedExperts::Connect(
      ckpt->config(), *side.provider, {.cache_bytes = plan.cache_bytes, .disk_rate = rate},
      *identity);
  if (!connected.ok()) return connected.status();
  ranked = *std::move(connected);
  ranks::DistributedExperts* r = ranked.get();
  side.provider->ShareGuesses([r](int64_t l, int32_t e) { return r->Remote(l, e); },
                              [r](int64_t l, std::vector<int32_t> e) { r->ForwardGuesses(l, e); });
  return absl::OkStatus();
}

absl::Status Engine::Parts::Init(const EngineOptions& given) {
  options = given;
  auto opened = Checkpoint::Open(options.model_dir);
  if (!opened.ok()) return opened.status();
  ckpt = *std::move(opened);
  if (!options.trunk_dir.empty()) {
    auto packed = TrunkPack::Open(options.trunk_dir, *ckpt);
    if (!packed.ok()) return packed.status();
    pack = *std::move(packed);
  }
  auto planned = PlanRun(*ckpt, PlanRequestOf(options, pack.get()), AvailableRamBytes());
  if (!planned.ok()) return planned.status();
  run = *std::move(planned);
  threads = options.threads > 0 ? options.threads : tbb::info::default_concurrency();
  limit =
      std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
  if (absl::Status s = OpenReads(); !s.ok()) return s;
  // The streamer first: the weights hold its handles for what is not resident.
  auto created = TrunkStreamer::Create(*ckpt, plan, pack.get(), *side.reads, side.shard_files,
                                       pack_file, disk);
  if (!created.ok()) return created.status();
  streamer = *std::move(created);
  if (absl::Status s = LoadPinnedTrunk(); !s.ok()) return s;
  streamer->Attach(*trunk);
  StreamExperts(side, *ckpt, *trunk, disk, options);
  ExpertProvider* experts = side.provider.get();
  if (ranks::Distributed()) {
    if (absl::Status s = Connect(); !s.ok()) return s;
    experts = ranked.get();
  }
  model = std::make_unique<Model>(ckpt->config(), *trunk, *experts, *streamer);
  return absl::OkStatus();
}

}  // namespace k3
