#include "pipeline/expert_stream.h"

#include <tbb/flow_graph.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/model/weights.h"

namespace k3 {
namespace {

using Clock = std::chrono::steady_clock;

// How long a demand waits for a cache slot when every slot is pinned or being filled (only
// prefetches can hold slots then, and those complete or are cancelled).
constexpr absl::Duration kSlotWait = absl::Seconds(60);

}  // namespace

StreamingExpertProvider::StreamingExpertProvider(const Checkpoint& ckpt, const TrunkWeights& trunk,
                                                 ExpertCache& cache, io::Reads& reads,
                                                 std::vector<io::FileId> files, BusyClock& disk,
                                                 const ExpertStreamOptions& options)
    : ckpt_(ckpt),
      trunk_(trunk),
      cache_(cache),
      reads_(reads),
      files_(std::move(files)),
      disk_(disk),
      options_(options) {
  for (int d = 1; d <= options_.prefetch_distance; ++d) accuracy_.push_back({.distance = d});
  layers_.resize(static_cast<size_t>(ckpt_.config().num_layers));
}

StreamingExpertProvider::~StreamingExpertProvider() {
  reads_.CancelPrefetches();
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return pending_.empty(); });
  ReleaseGuardsLocked(kAllLayers);
}

void StreamingExpertProvider::ReleaseGuardsLocked(int64_t layer) {
  for (auto it = guarded_.begin(); it != guarded_.end();) {
    auto here = it++;
    if (here->layer > layer) continue;
    (void)cache_.Unpin(*here);
    guarded_.erase(here);
  }
}

std::span<const uint8_t> StreamingExpertProvider::InSlot(const ExpertKey& key,
                                                         std::span<uint8_t> slot) const {
  const ExpertLocation& loc = ckpt_.expert(key.layer, key.expert);
  const uint64_t head = loc.contiguous() ? loc.spans[0].offset % io::kDirectAlignment : 0;
  return slot.subspan(head, loc.total_bytes);
}

size_t StreamingExpertProvider::Window() const {
  return static_cast<size_t>(std::max<int64_t>(1, cache_.slots()));
}

// ---- reads ----------------------------------------------------------------------------------

void StreamingExpertProvider::SubmitRead(const ExpertKey& key, std::span<uint8_t> slot,
                                         bool prefetch) {
  const ExpertLocation& loc = ckpt_.expert(key.layer, key.expert);
  Pending& p = pending_[key];
  p.prefetch = prefetch;
  p.slot = slot;
  if (!loc.contiguous()) {
    p.id = 0;  // read synchronously by the caller (Demand), outside the lock
    return;
  }
  const ByteSpan& span = loc.spans[0];
  io::ReadRequest request{
      .file = files_[span.shard],
      .offset = span.offset,
      .length = span.length,
      .buffer = slot,
      .priority = prefetch ? io::Priority::kPrefetch : io::Priority::kDemand,
      .user_data = 0,
      .on_complete = [this, key](io::ReadResult r) { OnRead(key, std::move(r)); }};
  disk_.Start();
  auto id = reads_.Submit(std::move(request));
  if (id.ok()) {
    p.id = *id;
    return;
  }
  // Refused at once (e.g. the file shrank below the expert): fail like a read would.
  disk_.Stop();
  pending_.erase(key);
  (void)cache_.Abandon(key);  // frees the slot and its pins
  guarded_.erase(key);
  if (!prefetch && error_.ok()) error_ = id.status();
}

void StreamingExpertProvider::OnRead(const ExpertKey& key, io::ReadResult result) {
  absl::Status status = result.status;
  if (status.ok()) status = CheckExpertBytes(ckpt_, key.layer, key.expert, result.data);
  std::vector<std::pair<size_t, bool>> handoff;  // to the flow graph: (want, bytes ok)
  Gateway* gateway = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteArrival(key.layer);
    auto it = pending_.find(key);
    Pending& p = it->second;
    if (p.prefetch) prefetch_bytes_in_flight_ -= ExpertBytes();
    if (!status.ok() && absl::IsCancelled(status) && p.demanded) {
      // A prefetch cancelled just as a demand attached to it: read it again, as a demand.
      std::vector<size_t> waiters = std::move(p.waiters);
      const std::span<uint8_t> slot = p.slot;
      pending_.erase(it);
      disk_.Stop();
      SubmitRead(key, slot, /*prefetch=*/false);
      if (auto again = pending_.find(key); again != pending_.end()) {
        again->second.demanded = true;
        again->second.waiters = std::move(waiters);
        return;
      }
      for (size_t i : waiters) {
        wants_[i].state = WantState::kFailed;
        if (i < waiting_.size() && waiting_[i]) handoff.emplace_back(i, false);
      }
      gateway = gateway_;
    } else {
      const bool ok = status.ok();
      if (ok) {
        (void)cache_.MarkFilled(key);
        if (p.prefetch && !p.demanded) prefetched_unused_.insert(key);
      } else {
        (void)cache_.Abandon(key);  // frees the slot and its pins
        guarded_.erase(key);
        // A failed guess costs nothing; the demand, if it comes, reads again.
        if (p.demanded && error_.ok()) error_ = status;
      }
      for (size_t i : p.waiters) {
        wants_[i].state = ok ? WantState::kReady : WantState::kFailed;
        if (ok) wants_[i].bytes = result.data;
        if (i < waiting_.size() && waiting_[i]) handoff.emplace_back(i, ok);
      }
      gateway = gateway_;
      pending_.erase(it);
      disk_.Stop();
    }
    changed_.notify_all();  // under the lock, for the same reason as in TrunkStreamer::OnRead
  }
  // Outside the lock: the graph may run the multiply at once, on this thread. (The provider
  // outlives this: its destructor waits for pending_ to empty, and a flow graph waits for
  // every handoff's release_wait.)
  if (handoff.empty()) return;
  // The graph's end waits for the last release_wait to return inside libtbb, which
  // ThreadSanitizer does not see; this lock, taken by ForEachExpert after the wait, shows it
  // that the gateway (on that frame) is no longer touched here.
  std::lock_guard<std::mutex> handing(handoff_mu_);
  for (const auto& [i, ok] : handoff) {
    if (ok) gateway->try_put(i);
    gateway->release_wait();
  }
}

// ---- demand ---------------------------------------------------------------------------------

// Returns false when the caller must ask the cache again (a fill finished in between).
bool StreamingExpertProvider::DemandLocked(size_t i, const CacheGrant& grant) {
  Want& w = wants_[i];
  LayerFigures& figures = layers_[w.key.layer];
  switch (grant.outcome) {
    case CacheOutcome::kHit:
      ++metrics_.cache_hits;
      ++figures.cached;
      if (prefetched_unused_.erase(w.key) > 0) {
        metrics_.expert_prefetch_used_bytes += ExpertBytes();
        ++figures.prefetched;
      }
      w.state = WantState::kReady;
      w.bytes = InSlot(w.key, grant.bytes);
      return true;
    case CacheOutcome::kInFlight: {
      auto it = pending_.find(w.key);
      if (it == pending_.end() || !cache_.Pin(w.key).ok()) return false;
      Pending& p = it->second;
      ++figures.cached;
      if (p.prefetch && !p.demanded) {
        ++metrics_.cache_hits;  // no demand read: the guess was already on its way
        metrics_.expert_prefetch_used_bytes += ExpertBytes();
        ++figures.prefetched;
      }
      p.demanded = true;
      p.waiters.push_back(i);
      return true;
    }
    case CacheOutcome::kFill:
      ++metrics_.experts_demand_read;
      ++figures.read;
      metrics_.expert_demand_bytes += ExpertBytes();
      SubmitRead(w.key, grant.bytes, /*prefetch=*/false);
      if (auto it = pending_.find(w.key); it != pending_.end()) {
        it->second.demanded = true;
        it->second.waiters.push_back(i);
      } else {
        w.state = WantState::kFailed;
      }
      return true;
  }
  return true;
}

void StreamingExpertProvider::Demand(size_t i) {
  const ExpertKey key = wants_[i].key;
  const CacheRequest now{.kind = RequestKind::kDemand, .pin = true};
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.cache_requests;
  }
  for (int attempt = 0; attempt < 1000; ++attempt) {
    absl::StatusOr<CacheGrant> grant;
    {
      std::lock_guard<std::mutex> lock(mu_);
      grant = cache_.Request(key, now);
      if (grant.ok()) {
        if (DemandLocked(i, *grant)) break;
        continue;
      }
      if (!absl::IsResourceExhausted(grant.status())) {
        if (error_.ok()) error_ = grant.status();
        wants_[i].state = WantState::kFailed;
        return;
      }
    }
    // Every slot is pinned or being filled: drop the guesses and wait for a slot.
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseGuardsLocked(kAllLayers);
    }
    reads_.CancelPrefetches();
    CacheRequest wait = now;
    wait.wait_for_slot = kSlotWait;
    grant = cache_.Request(key, wait);
    std::lock_guard<std::mutex> lock(mu_);
    if (!grant.ok()) {
      if (error_.ok()) {
        error_ = absl::ResourceExhaustedError(
            absl::StrCat("no expert cache slot for ", key.ToString(), " within ",
                         absl::FormatDuration(kSlotWait), ": ", grant.status().message()));
      }
      wants_[i].state = WantState::kFailed;
      return;
    }
    if (DemandLocked(i, *grant)) break;
  }
  // An expert split across the file (not the release layout): read it here, synchronously.
  std::span<uint8_t> slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(key);
    if (it == pending_.end() || it->second.id != 0 || it->second.prefetch) return;
    slot = it->second.slot;
  }
  const ExpertLocation& loc = ckpt_.expert(key.layer, key.expert);
  io::ReadResult r;
  uint64_t at = 0;
  disk_.Start();
  for (const ByteSpan& s : loc.spans) {
    if (r.status = ckpt_.ReadSpan(s, slot.subspan(at, s.length)); !r.status.ok()) break;
    at += s.length;
  }
  if (r.status.ok()) r.data = slot.subspan(0, loc.total_bytes);
  OnRead(key, std::move(r));
}

// The order of a layer's demands: first the experts already resident or landing (hits, and
// guesses whose prefetch is in flight), then the misses, each group in expert order (the order
// they lie in the file). Demanding the resident ones first pins them before any miss asks for a
// slot; a miss's fill could otherwise evict one of them (the policy chooses among the unpinned
// slots) and the layer would read it again. That costs no read and no slot they do not hold
// already, so they all fit in the first window. The misses take the rest of the window at once,
// before anything is multiplied: their reads are in flight while the resident experts, ready at
// once, keep the compute busy, and each multiply that gives a slot back starts the next miss.
// (Misses first would put no more reads in flight, since the window is the same, and would
// expose the hits to eviction.)
void StreamingExpertProvider::StartLayer(int64_t layer, std::span<const int32_t> experts) {
  size_t window = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    layer_ = layer;
    wants_.clear();
    order_.clear();
    std::vector<size_t> misses;
    for (size_t i = 0; i < experts.size(); ++i) {
      Want w;
      w.key = {static_cast<int32_t>(layer), experts[i]};
      wants_.push_back(w);
      (cache_.Contains(w.key) || pending_.contains(w.key) ? order_ : misses).push_back(i);
    }
    order_.insert(order_.end(), misses.begin(), misses.end());
    error_ = absl::OkStatus();
    demanded_ = 0;
    window = std::min(experts.size(), Window());
  }
  DemandThrough(window);
}

void StreamingExpertProvider::DemandThrough(size_t end) {
  for (;;) {
    size_t i = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (demanded_ >= end) return;
      i = order_[demanded_++];
    }
    Demand(i);
  }
}

size_t StreamingExpertProvider::TakeNextDemand() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok() || demanded_ >= order_.size()) return kNone;
  return order_[demanded_++];
}

void StreamingExpertProvider::StartFetch(int64_t layer, std::span<const int32_t> experts) {
  const auto t0 = Clock::now();
  ScorePredictions(layer, experts);
  if (options_.overlap) StartLayer(layer, experts);
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseGuardsLocked(layer);  // the demands hold their own pins now
  metrics_.fetch_seconds += SecondsSince(t0);
}

// ---- compute --------------------------------------------------------------------------------

// At most Window() wants are pinned at once: StartLayer demanded that many, and a multiply
// demands the next want only after unpinning its own. So a demand that finds every slot taken
// only waits for the guesses it drops and the prefetches it cancels (Demand), never for a
// multiply: however few threads run the graph, it cannot deadlock.
absl::Status StreamingExpertProvider::RunWindow(const ExpertUse& use,
                                                const std::function<void()>& alongside) {
  using Arrivals = tbb::flow::async_node<size_t, size_t>;
  const ModelConfig& config = ckpt_.config();
  BusyClock compute;
  const auto t0 = Clock::now();
  tbb::flow::graph g;
  std::vector<size_t> first_window;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_.assign(wants_.size(), false);
    first_window.assign(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(demanded_));
  }
  // Stage A's completions: hits pass at once, the others when their read lands (OnRead).
  Arrivals arrivals(g, tbb::flow::unlimited, [&](size_t i, Arrivals::gateway_type& gw) {
    std::unique_lock<std::mutex> lock(mu_);
    gateway_ = &gw;
    if (wants_[i].state == WantState::kWaiting) {
      gw.reserve_wait();
      waiting_[i] = true;  // OnRead hands it over when its read lands
    } else if (wants_[i].state == WantState::kReady) {
      lock.unlock();
      gw.try_put(i);
    }
  });
  // Stage B: multiply each expert as soon as its bytes are in, give its slot back and demand
  // the layer's next expert in its place.
  tbb::flow::function_node<size_t> multiply(g, tbb::flow::unlimited, [&](size_t i) {
    compute.Start();
    Want w;
    {
      // The completion wrote it under the lock on an engine thread; read it the same way.
      std::lock_guard<std::mutex> lock(mu_);
      w = wants_[i];
    }
    use(i, ViewExpert(config, ckpt_.expert(w.key.layer, w.key.expert), w.bytes));
    compute.Stop();
    (void)cache_.Unpin(w.key);
    const size_t next = TakeNextDemand();
    if (next == kNone) return;
    const auto t1 = Clock::now();
    Demand(next);
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.fetch_seconds += SecondsSince(t1);
    }
    arrivals.try_put(next);
  });
  tbb::flow::make_edge(arrivals, multiply);
  // Stage C's part in the layer: the shared experts, while the reads are in flight.
  tbb::flow::function_node<int> side(g, 1, [&](int) {
    compute.Start();
    alongside();
    compute.Stop();
  });
  if (alongside) side.try_put(0);
  for (size_t i : first_window) arrivals.try_put(i);
  g.wait_for_all();
  { std::lock_guard<std::mutex> handed(handoff_mu_); }  // OnRead's last handoff has returned
  std::lock_guard<std::mutex> lock(mu_);
  waiting_.clear();
  gateway_ = nullptr;
  NoteCompute(layer_, compute.first_start(), compute.last_stop());
  metrics_.io_wait_seconds += std::max(0.0, SecondsSince(t0) - compute.seconds());
  metrics_.expert_compute_seconds += compute.seconds();
  return error_;
}

absl::Status StreamingExpertProvider::RunBatchSerial(const ExpertUse& use, size_t first,
                                                     const std::function<void()>& alongside) {
  const auto t0 = Clock::now();
  size_t end = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    end = demanded_;
    changed_.wait(lock, [&] {
      for (size_t p = first; p < end; ++p) {
        if (wants_[order_[p]].state == WantState::kWaiting) return false;
      }
      return true;
    });
    metrics_.io_wait_seconds += SecondsSince(t0);
    if (!error_.ok()) return error_;
  }
  const ModelConfig& config = ckpt_.config();
  const auto t1 = Clock::now();
  for (size_t p = first; p < end; ++p) {
    const Want& w = wants_[order_[p]];
    use(order_[p], ViewExpert(config, ckpt_.expert(w.key.layer, w.key.expert), w.bytes));
  }
  if (alongside) alongside();
  std::lock_guard<std::mutex> lock(mu_);
  NoteCompute(layer_, t1, Clock::now());
  metrics_.expert_compute_seconds += SecondsSince(t1);
  return absl::OkStatus();
}

absl::Status StreamingExpertProvider::ForEachExpert(int64_t layer, std::span<const int32_t> experts,
                                                    const ExpertUse& use,
                                                    const std::function<void()>& alongside) {
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    started = layer_ == layer && wants_.size() == experts.size();
    LayerFigures& figures = layers_[layer];
    figures.layer = static_cast<int32_t>(layer);
    figures.asked = static_cast<uint32_t>(experts.size());
  }
  absl::Status status;
  if (options_.overlap) {
    if (!started) StartLayer(layer, experts);  // no StartFetch came first
    status = RunWindow(use, alongside);        // every multiply unpins its own expert
  } else {
    // Batches of Window() experts: a prefill union larger than the cache takes several. With
    // none (every expert of the layer is another rank's) the shared experts still run.
    if (experts.empty() && alongside) alongside();
    for (size_t first = 0; status.ok() && first < experts.size();) {
      const auto t0 = Clock::now();
      if (first == 0) {
        StartLayer(layer, experts);
      } else {
        DemandThrough(std::min(experts.size(), first + Window()));
      }
      size_t end = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        metrics_.fetch_seconds += SecondsSince(t0);
        end = demanded_;
      }
      status = RunBatchSerial(use, first, end == experts.size() ? alongside : nullptr);
      for (size_t p = first; p < end; ++p) {
        const Want& w = wants_[order_[p]];
        if (w.state == WantState::kReady) (void)cache_.Unpin(w.key);
      }
      first = end;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!status.ok()) {
    // Reads of this layer still landing keep their slots; wait so nothing outlives the call.
    changed_.wait(lock, [&] {
      for (size_t p = 0; p < demanded_; ++p) {
        const Want& w = wants_[order_[p]];
        if (w.state == WantState::kWaiting && pending_.contains(w.key)) return false;
      }
      return true;
    });
  }
  wants_.clear();
  order_.clear();
  demanded_ = 0;
  layer_ = -1;
  return status;
}

// ---- figures --------------------------------------------------------------------------------

void StreamingExpertProvider::TakeMetrics(StepMetrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ExpertKey> gone;
  for (const ExpertKey& k : prefetched_unused_) {
    if (!cache_.Contains(k)) gone.push_back(k);
  }
  for (const ExpertKey& k : gone) prefetched_unused_.erase(k);
  metrics_.expert_prefetch_wasted_bytes += gone.size() * ExpertBytes();
  m.Add(metrics_);
  metrics_ = {};
}

void StreamingExpertProvider::BeginStep() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(layers_.begin(), layers_.end(), LayerFigures{});
  step_start_ = Clock::now();
}

void StreamingExpertProvider::StepLayers(std::vector<LayerFigures>& out) const {
  out.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (const LayerFigures& f : layers_) {
    if (f.layer >= 0) out.push_back(f);
  }
}

void StreamingExpertProvider::NoteArrival(int64_t layer) {
  LayerFigures& f = layers_[layer];
  const double ms = StepMs(Clock::now());
  if (f.bytes_first_ms < 0) f.bytes_first_ms = ms;
  f.bytes_last_ms = ms;
}

void StreamingExpertProvider::NoteCompute(int64_t layer, Clock::time_point start,
                                          Clock::time_point end) {
  if (layer < 0 || start == Clock::time_point{}) return;  // nothing multiplied
  LayerFigures& f = layers_[layer];
  if (f.compute_start_ms < 0) f.compute_start_ms = StepMs(start);  // the serial path's batches
  f.compute_end_ms = StepMs(end);
}

std::vector<PrefetchAccuracy> StreamingExpertProvider::accuracy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accuracy_;
}

}  // namespace k3
