// Engine::Open: wires the checkpoint, the memory plan, the pinned trunk, the expert cache, the
// read engine, the streaming expert provider and the trunk streamer into a Model.
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/progress.h"
#include "core/trunk_pack.h"
#include "pipeline/cache/policy.h"
#include "pipeline/engine.h"
#include "pipeline/expert_stream.h"
#include "pipeline/held_trunk.h"
#include "pipeline/trunk_stream.h"

namespace k3 {
namespace {

using Clock = std::chrono::steady_clock;

class StreamingEngine : public Engine {
 public:
  ~StreamingEngine() override {
    // Order matters: the users of the read engine go first, the memory reads land in last.
    model_.reset();
    held_.reset();
    streamer_.reset();
    provider_.reset();
    reads_.reset();
    cache_.reset();
  }

  const Checkpoint& checkpoint() const override { return *ckpt_; }
  const ModelConfig& config() const override { return ckpt_->config(); }
  const MemoryPlan& plan() const override { return plan_; }
  const EngineOptions& options() const override { return options_; }
  SequenceState NewState() const override { return SequenceState(config()); }
  std::vector<PrefetchAccuracy> prefetch_accuracy() const override { return provider_->accuracy(); }
  void StartReadLog() override { reads_->StartLog(); }

  io::ReadLog TakeReadLog() override {
    io::ReadLog log{.paths = {}, .reads = reads_->TakeLog(), .options = reads_->options()};
    log.options.arena = nullptr;
    log.options.faults = nullptr;
    const std::vector<io::FileId> ids = FileIds();
    log.paths.resize(*std::max_element(ids.begin(), ids.end()) + 1);
    for (io::FileId id : ids) log.paths[id] = reads_->file(id).path;
    return log;
  }

  nlohmann::json Settings() const override {
    return {
        {"model", options_.model_dir},
        {"trunk_pack", options_.trunk_dir},
        {"memory", plan_.source},
        {"budget_bytes", plan_.budget_bytes},
        {"cache_bytes", plan_.cache_bytes},
        {"cache_slots", plan_.cache_slots},
        {"pinned_trunk_bytes", plan_.pinned_trunk_bytes},
        {"streamed_layers", plan_.streamed_layers()},
        {"ring_slots", plan_.ring_slots},
        {"ring_piece_bytes", plan_.piece_bytes},
        {"embedding_resident", plan_.embedding_resident},
        {"lm_head_resident", plan_.lm_head_resident},
        {"routers_resident", plan_.routers_resident},
        {"cache_policy", std::string(cache_->policy_name())},
        {"queue_depth", options_.queue_depth},
        {"prefetch_distance", options_.overlap ? options_.prefetch_distance : 0},
        {"prefill_prefetch_distance", options_.overlap ? options_.prefill_prefetch_distance : 0},
        {"prefetch_width", prefetch_width_},
        {"prefetch_cap_bytes", prefetch_cap_},
        {"threads", threads_},
        {"overlap", options_.overlap},
        {"prefill_chunk", options_.prefill_chunk},
        {"storage_profile", options_.storage_profile},
        {"io_backend", std::string(reads_->backend_name())},
        {"direct_io", options_.direct_io},
        {"buffered_files", BufferedFiles()}};
  }

  std::string DescribeReads() const override {
    const int buffered = BufferedFiles();
    const size_t files = FileIds().size();
    std::string line = absl::StrCat("  reads                 ", std::string(reads_->backend_name()),
                                    ", queue depth ", options_.queue_depth, ", ");
    if (buffered == 0) return absl::StrCat(line, "O_DIRECT\n");
    return absl::StrCat(line, "buffered: the file system refused O_DIRECT for ", buffered, " of ",
                        files,
                        " files, so the page cache also holds what is read and the budget is "
                        "not exact\n");
  }

  absl::Status Prefill(std::span<const int32_t> ids, SequenceState& state,
                       std::vector<float>& logits, StepMetrics* metrics) override {
    for (size_t at = 0; at < ids.size(); at += options_.prefill_chunk) {
      const size_t n = std::min<size_t>(options_.prefill_chunk, ids.size() - at);
      if (auto s = Forward(ids.subspan(at, n), state, false, logits, metrics); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Decode(int32_t id, SequenceState& state, std::vector<float>& logits,
                      StepMetrics* metrics) override {
    return Forward({&id, 1}, state, false, logits, metrics);
  }

  absl::Status Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                       std::vector<float>& logits, StepMetrics* metrics) override {
    return Measured(ids.size(), metrics,
                    [&] { return model_->Forward(ids, state, all_positions, logits); });
  }

  absl::Status Step(std::span<const BatchSegment> segments, std::vector<float>& logits,
                    StepMetrics* metrics) override {
    size_t tokens = 0;
    for (const BatchSegment& s : segments) tokens += s.ids.size();
    return Measured(tokens, metrics, [&] { return model_->ForwardBatch(segments, logits); });
  }

  absl::Status Init(const EngineOptions& options);

 private:
  // Every file the engine reads: the shards, and the trunk pack when there is one.
  std::vector<io::FileId> FileIds() const {
    std::vector<io::FileId> ids = shard_files_;
    if (pack_ != nullptr) ids.push_back(pack_file_);
    return ids;
  }

  int BufferedFiles() const {
    const std::vector<io::FileId> ids = FileIds();
    return static_cast<int>(std::count_if(ids.begin(), ids.end(),
                                          [&](io::FileId id) { return !reads_->file(id).direct; }));
  }

  // Runs `forward` and adds its figures (time, bytes, stalls, disk busy) to `metrics`.
  template <typename Fn>
  absl::Status Measured(size_t tokens, StepMetrics* metrics, Fn forward) {
    const auto t0 = Clock::now();
    const double busy0 = disk_.seconds();
    absl::Status s = forward();
    StepMetrics m;
    provider_->TakeMetrics(m);
    streamer_->TakeMetrics(m);
    if (held_ != nullptr) held_->TakeMetrics(m);
    m.tokens = static_cast<int64_t>(tokens);
    m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    m.disk_busy_seconds = disk_.seconds() - busy0;
    if (metrics != nullptr) metrics->Add(m);
    return s;
  }

  absl::Status LoadPinnedTrunk();
  absl::Status OpenReads(const ModelFootprint& footprint);

  EngineOptions options_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<TrunkPack> pack_;
  MemoryPlan plan_;
  int threads_ = 0;
  int prefetch_width_ = 0;
  uint64_t prefetch_cap_ = 0;
  std::unique_ptr<tbb::global_control> limit_;
  std::unique_ptr<TrunkWeights> trunk_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<io::ReadEngine> reads_;
  std::vector<io::FileId> shard_files_;
  io::FileId pack_file_ = -1;
  BusyClock disk_;
  std::unique_ptr<StreamingExpertProvider> provider_;
  std::unique_ptr<TrunkStreamer> streamer_;
  std::unique_ptr<HeldTrunk> held_;  // pinned matrices held compressed, if any
  std::unique_ptr<Model> model_;
};

absl::Status StreamingEngine::LoadPinnedTrunk() {
  std::optional<ProgressBar> bar;
  // One bar per part loaded, created on the first figures (so it knows the total).
  auto progress = [&](const char* label) {
    return [&bar, label, this](uint64_t done, uint64_t total) {
      if (!bar) bar.emplace(label, total, "B", options_.show_progress && total > (256u << 20));
      bar->Update(done);
    };
  };
  if (auto held = HeldCompressedTensors(*ckpt_, pack_.get(), plan_); !held.empty()) {
    auto loaded =
        HeldTrunk::Load(*pack_, held, *reads_, pack_file_, progress("loading compressed trunk"));
    bar.reset();  // finishes it
    if (!loaded.ok()) return loaded.status();
    held_ = *std::move(loaded);
    streamer_->ReportErrorsOf(held_.get());
  }
  TrunkResidency residency = plan_.residency();
  residency.held = [this](const TensorInfo& t) { return held_ != nullptr && held_->Holds(t); };
  residency.stream = [this](const TensorInfo& t) {
    return held_ != nullptr && held_->Holds(t) ? held_->Handle(t) : streamer_->Handle(t);
  };
  auto trunk = LoadTrunkWeights(*ckpt_, progress("loading trunk"), residency);
  bar.reset();
  if (!trunk.ok()) return trunk.status();
  trunk_ = *std::move(trunk);
  return absl::OkStatus();
}

absl::Status StreamingEngine::OpenReads(const ModelFootprint& footprint) {
  auto policy = MakePolicy(
      options_.cache_policy.empty() ? kDefaultPolicy : options_.cache_policy,
      {.capacity = plan_.cache_slots, .num_layers = static_cast<int32_t>(config().num_layers)});
  if (!policy.ok()) return policy.status();
  auto cache = ExpertCache::Create(
      {.budget_bytes = plan_.cache_bytes, .slot_bytes = footprint.expert_slot_bytes},
      *std::move(policy));
  if (!cache.ok()) return cache.status();
  cache_ = *std::move(cache);
  auto profile = io::ParseStorageProfile(options_.storage_profile);
  if (!profile.ok()) return profile.status();
  io::EngineOptions io_options;
  io_options.queue_depth = options_.queue_depth;
  io_options.direct = options_.direct_io;
  io_options.profile = *profile;
  io_options.arena = cache_->arena();
  io_options.faults = options_.faults;
  auto reads = io::ReadEngine::Create(io_options);
  if (!reads.ok()) return reads.status();
  reads_ = *std::move(reads);
  for (const std::string& path : ckpt_->shard_paths()) {
    auto id = reads_->OpenFile(path);
    if (!id.ok()) return id.status();
    shard_files_.push_back(*id);
  }
  if (pack_ != nullptr) {
    auto id = reads_->OpenFile(pack_->pack_path());
    if (!id.ok()) return id.status();
    pack_file_ = *id;
  }
  return absl::OkStatus();
}

absl::Status StreamingEngine::Init(const EngineOptions& options) {
  options_ = options;
  auto ckpt = Checkpoint::Open(options.model_dir);
  if (!ckpt.ok()) return ckpt.status();
  ckpt_ = *std::move(ckpt);
  if (!options.trunk_dir.empty()) {
    auto pack = TrunkPack::Open(options.trunk_dir, *ckpt_);
    if (!pack.ok()) return pack.status();
    pack_ = *std::move(pack);
  }
  const ModelFootprint one = MeasureFootprint(*ckpt_, options.max_context, options.prefill_chunk,
                                              {.piece_bytes = options.ring_piece_bytes,
                                               .slots = options.ring_slots,
                                               .pack = pack_.get(),
                                               .threads = options.threads});
  if (options.sequences < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  const ModelFootprint footprint = one.WithSequences(options.sequences);
  auto plan = PlanMemory(footprint, options.memory, AvailableRamBytes());
  if (!plan.ok() && options.sequences > 1) {
    const int fits = MaxSequences(one, options.memory, AvailableRamBytes(), options.sequences);
    if (fits >= 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch ", options.sequences, ": the budget holds at most ", fits,
                       fits == 1 ? " sequence" : " sequences", " (each needs ",
                       FormatBytes(static_cast<double>(one.state_bytes_per_sequence)),
                       " of state at --max-context ", options.max_context, "); use --batch ", fits,
                       ", a larger budget or a smaller --max-context"));
    }
  }
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  threads_ = options.threads > 0 ? options.threads : tbb::info::default_concurrency();
  limit_ =
      std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads_);
  if (absl::Status s = OpenReads(footprint); !s.ok()) return s;
  // The streamer first: the weights hold its handles for what is not resident.
  auto streamer =
      TrunkStreamer::Create(*ckpt_, plan_, pack_.get(), *reads_, shard_files_, pack_file_, disk_);
  if (!streamer.ok()) return streamer.status();
  streamer_ = *std::move(streamer);
  if (absl::Status s = LoadPinnedTrunk(); !s.ok()) return s;
  streamer_->Attach(*trunk_);
  prefetch_width_ = options.prefetch_width > 0 ? options.prefetch_width
                                               : static_cast<int>(config().num_experts_per_token);
  prefetch_cap_ = static_cast<uint64_t>(options.prefetch_cap_fraction * plan_.cache_bytes);
  ExpertStreamOptions stream;
  stream.overlap = options.overlap;
  stream.prefetch_distance = options.prefetch_distance;
  stream.prefill_prefetch_distance = options.prefill_prefetch_distance;
  stream.prefetch_width = prefetch_width_;
  stream.prefetch_cap_bytes = prefetch_cap_;
  provider_ = std::make_unique<StreamingExpertProvider>(*ckpt_, *trunk_, *cache_, *reads_,
                                                        shard_files_, disk_, stream);
  model_ = std::make_unique<Model>(config(), *trunk_, *provider_, *streamer_);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  auto engine = std::make_unique<StreamingEngine>();
  if (absl::Status s = engine->Init(options); !s.ok()) return s;
  return engine;
}

}  // namespace k3
