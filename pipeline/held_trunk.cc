#include "pipeline/held_trunk.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/trunk_codec.h"

namespace k3 {

uint64_t HeldTrunk::MemoryFor(const PackedTensor& packed) {
  return io::BufferBytesFor(packed.blocks[0].offset,
                            PieceStoredBytes(packed, {0, packed.blocks.size()}));
}

absl::StatusOr<std::unique_ptr<HeldTrunk>> HeldTrunk::Load(
    const TrunkPack& pack, const std::vector<const TensorInfo*>& tensors, io::Reads& reads,
    io::FileId pack_file, const std::function<void(uint64_t, uint64_t)>& progress) {
  std::unique_ptr<HeldTrunk> h(new HeldTrunk());
  h->pack_path_ = pack.pack_path();
  uint64_t memory = 0, total = 0;
  for (const TensorInfo* t : tensors) {
    const PackedTensor* packed = pack.Find(t->name);
    if (packed == nullptr || !packed->compressed()) {
      return absl::InternalError(
          absl::StrCat("held trunk: ", t->name, " is not compressed in ", h->pack_path_));
    }
    const std::pair<size_t, size_t> all = {0, packed->blocks.size()};
    h->index_[t] = static_cast<int64_t>(h->held_.size());
    h->held_.push_back({.tensor = t,
                        .packed = packed,
                        .offset = packed->blocks[0].offset,
                        .length = PieceStoredBytes(*packed, all),
                        .block_row_begin = BlockRowBegin(*packed, all)});
    memory += MemoryFor(*packed);
    total += h->held_.back().length;
  }
  if (memory == 0) return h;
  auto arena = io::BufferArena::Create(memory);
  if (!arena.ok()) return arena.status();
  h->arena_ = *std::move(arena);
  // Every read at once (the io layer keeps the queue depth), then each waited for in turn.
  std::vector<io::ReadId> ids;
  uint64_t at = 0;
  for (const Held& held : h->held_) {
    const uint64_t need = MemoryFor(*held.packed);
    auto id = reads.Submit({.file = pack_file,
                            .offset = held.offset,
                            .length = held.length,
                            .buffer = h->arena_->Slice(at, need),
                            .priority = io::Priority::kDemand});
    if (!id.ok()) return id.status();
    ids.push_back(*id);
    at += need;
  }
  absl::Status status;
  uint64_t done = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    io::ReadResult r = reads.Wait(ids[i]);
    if (!r.status.ok()) {
      if (status.ok()) status = r.status;
      continue;
    }
    h->held_[i].stored = r.data;
    if (progress) progress(done += r.data.size(), total);
  }
  if (!status.ok()) return status;
  return h;
}

Matrix HeldTrunk::Handle(const TensorInfo& t) {
  auto it = index_.find(&t);
  if (it == index_.end()) return {};
  return {DType::kBF16,
          nullptr,
          static_cast<size_t>(t.shape[0]),
          static_cast<size_t>(t.elements() / t.shape[0]),
          this,
          it->second,
          1};
}

absl::StatusOr<RowPiece> HeldTrunk::AcquirePiece(int64_t index, PieceForm form) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status;
  if (index < 0 || index >= static_cast<int64_t>(held_.size())) {
    status = absl::InternalError(absl::StrCat("held trunk: no matrix ", index));
  } else if (form != PieceForm::kStoredIfCompressed) {
    status = absl::InternalError(absl::StrCat("held trunk: ", held_[index].tensor->name,
                                              " is held compressed and cannot be used whole"));
  }
  if (!status.ok()) {
    if (error_.ok()) error_ = status;
    return status;
  }
  ++multiplied_;
  const Held& h = held_[index];
  return RowPiece{{DType::kBF16, nullptr, static_cast<size_t>(h.tensor->shape[0]),
                   static_cast<size_t>(h.tensor->elements() / h.tensor->shape[0])},
                  0,
                  h.block_row_begin};
}

absl::Status HeldTrunk::DecodeBlock(int64_t index, size_t block, std::span<uint8_t> out) {
  if (index < 0 || index >= static_cast<int64_t>(held_.size()) ||
      block >= held_[index].packed->blocks.size()) {
    const absl::Status s = absl::InternalError(
        absl::StrCat("held trunk: block ", block, " of matrix ", index, " does not exist"));
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = s;
    return s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Held& h = held_[index];
  const PackedBlock& b = h.packed->blocks[block];
  const uint64_t cols = static_cast<uint64_t>(h.tensor->elements() / h.tensor->shape[0]);
  absl::Status s = k3::DecodeBlock(*h.packed, b, h.stored.subspan(b.offset - h.offset, b.length),
                                   out.first(b.rows * cols * 2), pack_path_);
  std::lock_guard<std::mutex> lock(mu_);
  decode_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok() && error_.ok()) error_ = s;
  return s;
}

absl::Status HeldTrunk::TakeError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, absl::OkStatus());
}

void HeldTrunk::TakeMetrics(StepMetrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  m.trunk_decode_seconds += decode_seconds_;
  m.trunk_pieces_decoded_fused += multiplied_;
  decode_seconds_ = 0;
  multiplied_ = 0;
}

}  // namespace k3
