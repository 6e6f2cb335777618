// The trunk streamer: layers the memory plan does not pin are read ahead of use into a ring
// of slots (at least two), from the trunk pack (one read per layer) or from the checkpoint's
// shards (one read per tensor). While layer l computes from one slot, the next streamed layers
// load into the others; releasing a layer frees its slot for the next one in line, wrapping
// around to the start of the next token. Pinned layers are returned as they are.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/checkpoint.h"
#include "core/model/model.h"
#include "core/model/weights.h"
#include "core/trunk_pack.h"
#include "io/aligned_buffer.h"
#include "io/read_engine.h"
#include "pipeline/busy_clock.h"
#include "pipeline/engine.h"

namespace k3 {

class TrunkStreamer : public LayerSource {
 public:
  // `trunk` holds the pinned layers (trunk.resident) and every router; `pack` may be null;
  // `shard_files` are the read engine's ids of the shards, `pack_file` of the pack (or -1).
  static absl::StatusOr<std::unique_ptr<TrunkStreamer>> Create(
      const Checkpoint& ckpt, const TrunkWeights& trunk, const TrunkPack* pack,
      io::ReadEngine& engine, std::vector<io::FileId> shard_files, io::FileId pack_file,
      int ring_slots, BusyClock& disk);
  // Waits for reads still landing in the ring.
  ~TrunkStreamer() override;

  absl::StatusOr<const LayerWeights*> AcquireLayer(int64_t layer) override;
  void ReleaseLayer(int64_t layer) override;

  // Adds trunk bytes read and time waited since the last call to `m`.
  void TakeMetrics(StepMetrics& m);
  // Bytes one ring slot holds (the largest streamed layer's reads).
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  enum class SlotState { kFree, kLoading, kReady, kFailed };
  struct Read {
    const TensorInfo* tensor = nullptr;  // null: the whole pack run
    uint64_t file_offset = 0, length = 0;
    uint64_t slot_offset = 0;  // where the aligned read starts in the slot
  };
  // A tensor inside a pack run: where its bytes start, relative to the run.
  struct PackedPart {
    const TensorInfo* tensor = nullptr;
    uint64_t offset_in_run = 0, length = 0;
  };
  // What loading one streamed layer takes, worked out once at start.
  struct LayerPlan {
    std::vector<Read> reads;
    std::vector<PackedPart> packed;  // empty unless read from a pack
  };
  struct Slot {
    int64_t layer = -1;
    SlotState state = SlotState::kFree;
    int reads_left = 0;
    absl::Status status;
    std::span<uint8_t> memory;
    // Where each tensor's bytes are in `memory`, once loaded.
    absl::flat_hash_map<const TensorInfo*, std::span<const uint8_t>> tensors;
    LayerWeights weights;
    std::vector<std::vector<uint8_t>> storage;
    bool built = false;
    int users = 0;
  };

  TrunkStreamer(const Checkpoint& ckpt, const TrunkWeights& trunk, const TrunkPack* pack,
                io::ReadEngine& engine, std::vector<io::FileId> shard_files, io::FileId pack_file,
                BusyClock& disk)
      : ckpt_(ckpt),
        trunk_(trunk),
        pack_(pack),
        engine_(engine),
        shard_files_(std::move(shard_files)),
        pack_file_(pack_file),
        disk_(disk) {}

  LayerPlan PlanFor(int64_t layer) const;
  uint64_t BytesFor(const std::vector<Read>& reads) const;
  // Starts loading `layer` into a free slot, if there is one and it is not loaded already.
  void Schedule(int64_t layer);
  void ScheduleAhead(int64_t layer);
  void OnRead(Slot& slot, const Read& read, io::ReadResult result);
  absl::Status Build(Slot& slot);
  int64_t NextStreamed(int64_t layer) const;

  const Checkpoint& ckpt_;
  const TrunkWeights& trunk_;
  const TrunkPack* pack_;
  io::ReadEngine& engine_;
  const std::vector<io::FileId> shard_files_;
  const io::FileId pack_file_;
  BusyClock& disk_;
  std::unique_ptr<io::BufferArena> arena_;
  uint64_t slot_bytes_ = 0;
  std::vector<int64_t> streamed_;  // layer ids, ascending
  std::vector<LayerPlan> plans_;   // per layer (empty for pinned ones)

  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int reads_in_flight_ = 0;
  uint64_t bytes_read_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace k3
