#include "pipeline/trunk_stream.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/tensor_names.h"

namespace k3 {
namespace {

bool IsRouter(const TensorSpec& spec) { return spec.group == TensorGroup::kRouter; }

}  // namespace

absl::StatusOr<std::unique_ptr<TrunkStreamer>> TrunkStreamer::Create(
    const Checkpoint& ckpt, const TrunkWeights& trunk, const TrunkPack* pack,
    io::ReadEngine& engine, std::vector<io::FileId> shard_files, io::FileId pack_file,
    int ring_slots, BusyClock& disk) {
  std::unique_ptr<TrunkStreamer> s(
      new TrunkStreamer(ckpt, trunk, pack, engine, std::move(shard_files), pack_file, disk));
  s->plans_.resize(ckpt.config().num_layers);
  for (int64_t l = 0; l < ckpt.config().num_layers; ++l) {
    if (!trunk.resident[l]) {
      s->streamed_.push_back(l);
      s->plans_[l] = s->PlanFor(l);
      s->slot_bytes_ = std::max(s->slot_bytes_, s->BytesFor(s->plans_[l].reads));
    }
  }
  if (s->streamed_.empty()) return s;
  if (ring_slots < 2) return absl::InvalidArgumentError("the trunk ring needs at least 2 slots");
  auto arena = io::BufferArena::Create(s->slot_bytes_ * ring_slots);
  if (!arena.ok()) return arena.status();
  s->arena_ = *std::move(arena);
  for (int i = 0; i < ring_slots; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->memory = s->arena_->Slice(i * s->slot_bytes_, s->slot_bytes_);
    s->slots_.push_back(std::move(slot));
  }
  return s;
}

TrunkStreamer::~TrunkStreamer() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return reads_in_flight_ == 0; });
}

// The layer's tensors but the router (resident for lookahead): one read of the pack's run, or
// one per tensor from the shards, each into its own 4 KiB-aligned stretch of the slot.
TrunkStreamer::LayerPlan TrunkStreamer::PlanFor(int64_t layer) const {
  LayerPlan plan;
  if (pack_ != nullptr) {
    if (const PackedRun* run = pack_->layer_run(layer); run != nullptr) {
      plan.reads.push_back({nullptr, run->offset, run->length, 0});
      for (const PackedTensor& pt : run->tensors) {
        if (const TensorInfo* t = ckpt_.Find(pt.name); t != nullptr) {
          plan.packed.push_back({t, pt.offset - run->offset, pt.length});
        }
      }
      return plan;
    }
  }
  uint64_t at = 0;
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt_.config(), ckpt_.names())) {
    if (spec.layer != layer || IsRouter(spec)) continue;
    const TensorInfo* t = ckpt_.Find(spec.name);
    plan.reads.push_back({t, t->file_offset, t->byte_size, at});
    at += io::BufferBytesFor(t->file_offset, t->byte_size);
  }
  return plan;
}

uint64_t TrunkStreamer::BytesFor(const std::vector<Read>& reads) const {
  uint64_t total = 0;
  for (const Read& r : reads) {
    total = std::max(total, r.slot_offset + io::BufferBytesFor(r.file_offset, r.length));
  }
  return total;
}

int64_t TrunkStreamer::NextStreamed(int64_t layer) const {
  auto it = std::upper_bound(streamed_.begin(), streamed_.end(), layer);
  return it == streamed_.end() ? streamed_.front() : *it;  // wraps to the next token
}

void TrunkStreamer::Schedule(int64_t layer) {
  Slot* free = nullptr;
  for (auto& s : slots_) {
    if (s->layer == layer) return;
    if (free == nullptr && s->state == SlotState::kFree) free = s.get();
  }
  if (free == nullptr) return;
  Slot& slot = *free;
  slot.layer = layer;
  slot.state = SlotState::kLoading;
  slot.status = absl::OkStatus();
  slot.tensors.clear();
  slot.built = false;
  const std::vector<Read>& reads = plans_[layer].reads;
  slot.reads_left = static_cast<int>(reads.size());
  for (const Read& r : reads) {
    const io::FileId file = r.tensor == nullptr ? pack_file_ : shard_files_[r.tensor->shard];
    io::ReadRequest req{
        .file = file,
        .offset = r.file_offset,
        .length = r.length,
        .buffer = slot.memory.subspan(r.slot_offset, io::BufferBytesFor(r.file_offset, r.length)),
        .priority = io::Priority::kTrunk,
        .user_data = 0,
        .on_complete = [this, &slot, r](io::ReadResult res) { OnRead(slot, r, std::move(res)); }};
    ++reads_in_flight_;
    disk_.Start();
    if (auto id = engine_.Submit(std::move(req)); !id.ok()) {
      --reads_in_flight_;
      disk_.Stop();
      if (slot.status.ok()) slot.status = id.status();
      if (--slot.reads_left == 0) slot.state = SlotState::kFailed;
    }
  }
}

void TrunkStreamer::OnRead(Slot& slot, const Read& read, io::ReadResult result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result.status.ok()) {
      if (slot.status.ok()) slot.status = result.status;
    } else {
      bytes_read_ += read.length;
      if (read.tensor != nullptr) {
        slot.tensors[read.tensor] = result.data;
      } else {
        // A pack run: every tensor of the layer at its offset inside the run.
        for (const PackedPart& p : plans_[slot.layer].packed) {
          slot.tensors[p.tensor] = result.data.subspan(p.offset_in_run, p.length);
        }
      }
    }
    if (--slot.reads_left == 0) {
      slot.state = slot.status.ok() ? SlotState::kReady : SlotState::kFailed;
    }
    --reads_in_flight_;
    disk_.Stop();
    // Under the lock: once reads_in_flight_ is 0 the destructor may run as soon as we let go.
    changed_.notify_all();
  }
}

absl::Status TrunkStreamer::Build(Slot& slot) {
  slot.weights = LayerWeights{};
  slot.storage.clear();
  const TensorBytesFn source =
      [&slot](const TensorInfo& t,
              std::vector<uint8_t>&) -> absl::StatusOr<std::span<const uint8_t>> {
    auto it = slot.tensors.find(&t);
    if (it == slot.tensors.end()) {
      return absl::InternalError(absl::StrCat(t.name, " was not in the streamed layer"));
    }
    return it->second;
  };
  auto built = LoadLayerWeights(ckpt_, slot.layer, source, slot.weights, slot.storage);
  if (!built.ok()) return built.status();
  const MoeWeights& resident = trunk_.layers[slot.layer].moe;
  slot.weights.moe.router = resident.router;
  slot.weights.moe.router_bias = resident.router_bias;
  slot.built = true;
  return absl::OkStatus();
}

absl::StatusOr<const LayerWeights*> TrunkStreamer::AcquireLayer(int64_t layer) {
  if (trunk_.resident[layer]) return &trunk_.layers[layer];
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  Schedule(layer);
  Slot* slot = nullptr;
  for (auto& s : slots_) {
    if (s->layer == layer) slot = s.get();
  }
  if (slot == nullptr) {
    return absl::InternalError(absl::StrCat("no free trunk ring slot for layer ", layer));
  }
  changed_.wait(lock, [&] { return slot->state != SlotState::kLoading; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ScheduleAhead(layer);
  if (slot->state == SlotState::kFailed) {
    const absl::Status status = slot->status;
    slot->state = SlotState::kFree;
    slot->layer = -1;
    return status;
  }
  if (!slot->built) {
    if (absl::Status s = Build(*slot); !s.ok()) return s;
  }
  ++slot->users;
  return &slot->weights;
}

void TrunkStreamer::ScheduleAhead(int64_t layer) {
  int64_t next = layer;
  for (size_t i = 0; i < slots_.size() && i < streamed_.size(); ++i) {
    next = NextStreamed(next);
    Schedule(next);
  }
}

void TrunkStreamer::ReleaseLayer(int64_t layer) {
  if (trunk_.resident[layer]) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : slots_) {
    if (s->layer == layer && --s->users == 0) {
      s->state = SlotState::kFree;
      s->layer = -1;
    }
  }
  ScheduleAhead(layer);
}

void TrunkStreamer::TakeMetrics(StepMetrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  m.trunk_bytes += bytes_read_;
  m.io_wait_seconds += wait_seconds_;
  bytes_read_ = 0;
  wait_seconds_ = 0;
}

}  // namespace k3
