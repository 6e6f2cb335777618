#include "pipeline/trunk_stream.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/tensor_names.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/model/model.h"
#include "core/util/numeric.h"
#include "oneapi/tbb/parallel_for.h"

namespace k3 {
namespace {

// One stored row (BF16, F16 or F32) widened to fp32.
void WidenRow(DType dtype, const uint8_t* row, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], row + 4 * i, 4);
    } else {
      const uint16_t bits = static_cast<uint16_t>(row[2 * i] | (row[2 * i + 1] << 8));
      out[i] = dtype == DType::kBF16 ? BF16ToFloat(bits) : HalfToFloat(bits);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrunkStreamer>> TrunkStreamer::Create(
    const Checkpoint& ckpt, const MemoryPlan& plan, const TrunkPack* pack, io::Reads& reads,
    std::vector<io::FileId> shard_files, io::FileId pack_file, BusyClock& disk) {
  std::unique_ptr<TrunkStreamer> s(new TrunkStreamer(ckpt, reads, std::move(shard_files), disk));
  const ModelConfig& c = ckpt.config();
  const TrunkResidency residency = plan.residency();
  absl::flat_hash_map<std::string, TensorSpec> specs;
  for (TensorSpec& spec : TrunkTensorSpecs(c, ckpt.names())) specs.emplace(spec.name, spec);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const OrderedMatrix& m : LayerMatrixOrder(c, ckpt.names(), l)) {
      auto it = specs.find(m.name);
      const TensorInfo* t = ckpt.Find(m.name);
      if (it == specs.end() || t == nullptr || IsResident(residency, it->second)) continue;
      s->AddPieces(*t, m.whole, plan.piece_bytes, pack, pack_file);
    }
  }
  if (!plan.lm_head_resident) {
    s->AddPieces(*ckpt.Find(ckpt.names().Global(tensor_name::kLmHead)), false, plan.piece_bytes,
                 pack, pack_file);
  }
  // Every streamed matrix must have its pieces, or the model would ask for a handle in vain.
  for (const auto& [name, spec] : specs) {
    if (spec.role == TensorRole::kVector || spec.group == TensorGroup::kEmbedding) continue;
    const TensorInfo* t = ckpt.Find(name);
    if (!IsResident(residency, spec) && !s->by_tensor_.contains(t)) {
      return absl::InternalError(absl::StrCat("trunk streamer: ", name, " is streamed but not in ",
                                              "the order of the forward pass"));
    }
  }
  for (const Piece& p : s->pieces_) {
    s->slot_bytes_ = std::max(s->slot_bytes_, io::BufferBytesFor(p.offset, p.length));
    if (p.packed != nullptr && p.whole_matrix) {
      s->decoded_bytes_ = std::max<uint64_t>(s->decoded_bytes_, io::AlignUp(p.rows * p.cols * 2));
    }
  }
  if (pack != nullptr) s->pack_path_ = pack->pack_path();
  if (!s->pieces_.empty()) {
    const uint64_t decode = kDecodeBuffers * s->decoded_bytes_;
    if (plan.ring_slots < 2 || s->slot_bytes_ > plan.ring_slot_bytes ||
        decode > plan.ring_decode_bytes) {
      return absl::InternalError(
          absl::StrCat("trunk ring: ", plan.ring_slots, " slots of ", plan.ring_slot_bytes,
                       " bytes and ", plan.ring_decode_bytes,
                       " to decode into planned for pieces of ", s->slot_bytes_, " and ", decode));
    }
    auto arena = io::BufferArena::Create(s->slot_bytes_ * plan.ring_slots);
    if (!arena.ok()) return arena.status();
    s->arena_ = *std::move(arena);
    for (int i = 0; i < plan.ring_slots; ++i) {
      auto slot = std::make_unique<Slot>();
      slot->memory = s->arena_->Slice(i * s->slot_bytes_, s->slot_bytes_);
      s->slots_.push_back(std::move(slot));
    }
    if (decode > 0) {
      auto buffers = io::BufferArena::Create(decode);
      if (!buffers.ok()) return buffers.status();
      s->decode_arena_ = *std::move(buffers);
      for (int i = 0; i < kDecodeBuffers; ++i) {
        s->free_decode_buffers_.push_back(
            s->decode_arena_->Slice(i * s->decoded_bytes_, s->decoded_bytes_));
      }
    }
  }
  if (!plan.embedding_resident) {
    const TensorInfo* embed = ckpt.Find(ckpt.names().Global(tensor_name::kEmbedding));
    const uint64_t row = embed->byte_size / embed->shape[0];
    auto rows =
        io::BufferArena::Create(kEmbeddingRowsPerRead * (io::AlignUp(row) + io::kDirectAlignment));
    if (!rows.ok()) return rows.status();
    s->embedding_rows_ = *std::move(rows);
  }
  std::lock_guard<std::mutex> lock(s->mu_);
  s->ScheduleAheadLocked();
  return s;
}

TrunkStreamer::~TrunkStreamer() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return reads_in_flight_ == 0; });
}

void TrunkStreamer::AddPieces(const TensorInfo& t, bool whole, uint64_t piece_bytes,
                              const TrunkPack* pack, io::FileId pack_file) {
  const size_t rows = static_cast<size_t>(t.shape[0]);
  const uint64_t row_bytes = t.byte_size / rows;
  size_t per_piece = whole ? rows : std::max<size_t>(1, piece_bytes / row_bytes);
  if (per_piece >= kMatMulRowsPerTask && per_piece < rows)
    per_piece -= per_piece % kMatMulRowsPerTask;
  io::FileId file = shard_files_[t.shard];
  uint64_t base = t.file_offset;
  const PackedTensor* packed = pack != nullptr ? pack->Find(t.name) : nullptr;
  if (packed != nullptr) {
    file = pack_file;
    base = packed->offset;
  }
  by_tensor_[&t] = {static_cast<int64_t>(pieces_.size()), 0};
  const size_t cols = static_cast<size_t>(t.elements() / t.shape[0]);
  if (packed != nullptr && packed->compressed()) {
    size_t row = 0;
    for (const auto& [first, last] : BlockPieces(*packed, piece_bytes, whole)) {
      std::vector<size_t> block_row_begin = BlockRowBegin(*packed, {first, last});
      const size_t n = block_row_begin.back();
      pieces_.push_back({&t, file, packed->blocks[first].offset,
                         PieceStoredBytes(*packed, {first, last}), row, n, cols, packed, first,
                         last, std::move(block_row_begin)});
      row += n;
      ++by_tensor_[&t].second;
    }
  } else {
    for (size_t r = 0; r < rows; r += per_piece) {
      const size_t n = std::min(per_piece, rows - r);
      pieces_.push_back({&t, file, base + r * row_bytes, n * row_bytes, r, n, cols});
      ++by_tensor_[&t].second;
    }
  }
  if (by_tensor_[&t].second == 1) pieces_.back().whole_matrix = true;
}

Matrix TrunkStreamer::Handle(const TensorInfo& t) {
  auto it = by_tensor_.find(&t);
  if (it == by_tensor_.end()) return {};
  return {t.dtype == DType::kF16 ? DType::kF32 : t.dtype,
          nullptr,
          static_cast<size_t>(t.shape[0]),
          static_cast<size_t>(t.elements() / t.shape[0]),
          this,
          it->second.first,
          it->second.second};
}

TrunkStreamer::Slot* TrunkStreamer::SlotOf(int64_t piece) {
  for (auto& s : slots_) {
    if (s->piece == piece) return s.get();
  }
  return nullptr;
}

TrunkStreamer::Slot* TrunkStreamer::FreeSlot() {
  for (auto& s : slots_) {
    if (s->state == SlotState::kFree) return s.get();
  }
  return nullptr;
}

void TrunkStreamer::StartRead(Slot& slot, int64_t piece) {
  const Piece& p = pieces_[piece];
  slot.piece = piece;
  slot.state = SlotState::kLoading;
  slot.status = absl::OkStatus();
  slot.data = {};
  io::ReadRequest req{
      .file = p.file,
      .offset = p.offset,
      .length = p.length,
      .buffer = slot.memory.first(io::BufferBytesFor(p.offset, p.length)),
      .priority = io::Priority::kTrunk,
      .user_data = 0,
      .on_complete = [this, &slot](io::ReadResult r) { OnRead(slot, std::move(r)); }};
  ++reads_in_flight_;
  disk_.Start();
  if (auto id = reads_.Submit(std::move(req)); !id.ok()) {
    --reads_in_flight_;
    disk_.Stop();
    slot.status = id.status();
    slot.state = SlotState::kFailed;
  }
}

// Fills free slots with the pieces that follow in the order of use, wrapping around to the next
// pass; a piece already in a slot is not read twice.
void TrunkStreamer::ScheduleAheadLocked() {
  const int64_t n = static_cast<int64_t>(pieces_.size());
  for (int64_t tries = 0; tries < n; ++tries) {
    Slot* free = FreeSlot();
    if (free == nullptr) return;
    if (SlotOf(next_) == nullptr) StartRead(*free, next_);
    next_ = (next_ + 1) % n;
  }
}

void TrunkStreamer::OnRead(Slot& slot, io::ReadResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (result.status.ok()) {
    slot.data = result.data;
    slot.state = SlotState::kReady;
    bytes_read_ += result.data.size();
  } else {
    slot.status = result.status;
    slot.state = SlotState::kFailed;
  }
  --reads_in_flight_;
  disk_.Stop();
  // Under the lock: once reads_in_flight_ is 0 the destructor may run as soon as we let go.
  changed_.notify_all();
}

absl::StatusOr<RowPiece> TrunkStreamer::AcquirePiece(int64_t index, PieceForm form) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  Slot* slot = nullptr;
  while (slot == nullptr) {
    if (Slot* s = SlotOf(index); s != nullptr) {
      changed_.wait(lock, [&] { return s->piece != index || s->state != SlotState::kLoading; });
      if (s->piece == index) slot = s;
      continue;
    }
    // Not read ahead: read it now, into a free slot or over a piece read ahead but not in use,
    // and go on reading ahead from here.
    Slot* target = FreeSlot();
    for (auto& s : slots_) {
      if (target == nullptr && (s->state == SlotState::kReady || s->state == SlotState::kFailed)) {
        target = s.get();
      }
    }
    if (target == nullptr) {
      changed_.wait(lock);
      continue;
    }
    ++out_of_order_;
    StartRead(*target, index);
    next_ = (index + 1) % static_cast<int64_t>(pieces_.size());
  }
  wait_seconds_ += SecondsSince(t0);
  if (slot->state == SlotState::kFailed) {
    const absl::Status status = slot->status;
    if (error_.ok()) error_ = status;
    FreeSlotLocked(*slot);
    return status;
  }
  slot->state = SlotState::kInUse;
  ScheduleAheadLocked();
  const Piece& p = pieces_[index];
  if (p.packed != nullptr && form == PieceForm::kStoredIfCompressed) {
    ++decoded_fused_;
    return RowPiece{{DType::kBF16, nullptr, p.rows, p.cols}, p.row_begin, p.block_row_begin};
  }
  if (p.packed != nullptr && !p.whole_matrix) {
    const absl::Status status = absl::InternalError(
        absl::StrCat("trunk streamer: piece ", index, " of ", p.tensor->name,
                     " asked for whole, but only a matrix of one piece is used row by row"));
    if (error_.ok()) error_ = status;
    FreeSlotLocked(*slot);
    return status;
  }
  if (p.packed != nullptr) {
    // Never more than kDecodeBuffers pieces are used whole at once, so one comes free.
    changed_.wait(lock, [&] { return !free_decode_buffers_.empty(); });
    slot->decoded = free_decode_buffers_.back();
    free_decode_buffers_.pop_back();
  }
  lock.unlock();
  auto view = View(*slot);
  if (!view.ok()) {
    lock.lock();
    if (error_.ok()) error_ = view.status();
    FreeSlotLocked(*slot);
  }
  return view;
}

// A slot in use goes back to the ring, and its decode buffer to the pool.
void TrunkStreamer::FreeSlotLocked(Slot& slot) {
  slot.state = SlotState::kFree;
  slot.piece = -1;
  slot.data = {};
  if (!slot.decoded.empty()) free_decode_buffers_.push_back(std::exchange(slot.decoded, {}));
  ScheduleAheadLocked();
  changed_.notify_all();
}

// The piece's blocks, each checked and decoded on its own, in parallel by the acquiring thread
// and any idle worker.
absl::Status TrunkStreamer::DecodeWhole(const Piece& p, std::span<const uint8_t> stored,
                                        std::span<uint8_t> out) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t row_bytes = p.cols * 2;
  std::vector<absl::Status> status(p.block_end - p.block_begin);
  tbb::parallel_for(size_t{0}, status.size(), [&](size_t i) {
    status[i] = DecodeOneBlock(p, i, stored, out.subspan(p.block_row_begin[i] * row_bytes));
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    decode_seconds_ += SecondsSince(t0);
    ++decoded_whole_;
  }
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The piece as a resident matrix of its rows (F16 widened to fp32 here, on the thread that
// multiplies it, not on the read engine's).
absl::StatusOr<RowPiece> TrunkStreamer::View(Slot& slot) {
  const Piece& p = pieces_[slot.piece];
  Matrix m{p.tensor->dtype, slot.data.data(), p.rows, p.cols};
  if (p.packed != nullptr) {
    const std::span<uint8_t> out = slot.decoded.first(p.rows * p.cols * 2);
    if (absl::Status s = DecodeWhole(p, slot.data, out); !s.ok()) return s;
    m.data = out.data();
  }
  if (p.tensor->dtype == DType::kF16) {
    slot.widened.resize(p.rows * p.cols);
    const uint64_t row_bytes = p.cols * 2;
    for (size_t r = 0; r < p.rows; ++r) {
      WidenRow(DType::kF16, slot.data.data() + r * row_bytes,
               {slot.widened.data() + r * p.cols, p.cols});
    }
    m = {DType::kF32, slot.widened.data(), p.rows, p.cols};
  }
  return RowPiece{m, p.row_begin};
}

absl::Status TrunkStreamer::DecodeOneBlock(const Piece& p, size_t block,
                                           std::span<const uint8_t> stored,
                                           std::span<uint8_t> out) const {
  const PackedBlock& b = p.packed->blocks[p.block_begin + block];
  return k3::DecodeBlock(*p.packed, b, stored.subspan(b.offset - p.offset, b.length),
                         out.first(b.rows * p.cols * 2), pack_path_);
}

absl::Status TrunkStreamer::DecodeBlock(int64_t index, size_t block, std::span<uint8_t> out) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool known = index >= 0 && index < static_cast<int64_t>(pieces_.size());
  const Slot* slot = known ? SlotOf(index) : nullptr;
  if (slot == nullptr || slot->state != SlotState::kInUse || pieces_[index].packed == nullptr ||
      block + 1 >= pieces_[index].block_row_begin.size()) {
    const absl::Status s = absl::InternalError(absl::StrCat(
        "trunk streamer: block ", block, " of piece ", index, ", not a compressed piece in use"));
    if (error_.ok()) error_ = s;  // the product skips the rows; the layer must fail
    return s;
  }
  const Piece& p = pieces_[index];
  const std::span<const uint8_t> stored = slot->data;  // stays while the piece is in use
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = DecodeOneBlock(p, block, stored, out);
  lock.lock();
  decode_seconds_ += SecondsSince(t0);
  if (!s.ok() && error_.ok()) error_ = s;
  return s;
}

void TrunkStreamer::ReleasePiece(int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot* s = SlotOf(index);
  if (s == nullptr || s->state != SlotState::kInUse) return;
  FreeSlotLocked(*s);
}

absl::Status TrunkStreamer::TakeError() {
  absl::Status other = other_ != nullptr ? other_->TakeError() : absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = error_.ok() ? other : error_;
  error_ = absl::OkStatus();
  return s;
}

int64_t TrunkStreamer::out_of_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_of_order_;
}

absl::StatusOr<const LayerWeights*> TrunkStreamer::AcquireLayer(int64_t layer) {
  if (trunk_ == nullptr) return absl::InternalError("trunk streamer: no weights attached");
  return &trunk_->layers[layer];
}

absl::Status TrunkStreamer::Embed(std::span<const int32_t> ids, std::span<float> out) {
  if (trunk_ == nullptr) return absl::InternalError("trunk streamer: no weights attached");
  if (trunk_->embed.data != nullptr) {
    EmbedResident(trunk_->embed, ids, out);
    return absl::OkStatus();
  }
  for (size_t at = 0; at < ids.size(); at += kEmbeddingRowsPerRead) {
    const size_t n = std::min<size_t>(kEmbeddingRowsPerRead, ids.size() - at);
    if (absl::Status s =
            ReadEmbeddingRows(ids.subspan(at, n), out.subspan(at * trunk_->embed.cols));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Up to kEmbeddingRowsPerRead rows, read at demand priority (a token waits for them) at once.
absl::Status TrunkStreamer::ReadEmbeddingRows(std::span<const int32_t> ids, std::span<float> out) {
  const TensorInfo& t = *ckpt_.Find(ckpt_.names().Global(tensor_name::kEmbedding));
  const size_t cols = trunk_->embed.cols;
  const uint64_t row_bytes = t.byte_size / t.shape[0];
  const uint64_t stride = io::AlignUp(row_bytes) + io::kDirectAlignment;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<io::ReadId> read_ids;
  absl::Status status;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t offset = t.file_offset + static_cast<uint64_t>(ids[i]) * row_bytes;
    disk_.Start();
    auto id = reads_.Submit(
        {.file = shard_files_[t.shard],
         .offset = offset,
         .length = row_bytes,
         .buffer = embedding_rows_->Slice(i * stride, io::BufferBytesFor(offset, row_bytes)),
         .priority = io::Priority::kDemand});
    if (!id.ok()) {
      disk_.Stop();
      status = id.status();
      break;
    }
    read_ids.push_back(*id);
  }
  for (size_t i = 0; i < read_ids.size(); ++i) {
    io::ReadResult r = reads_.Wait(read_ids[i]);
    disk_.Stop();
    if (!r.status.ok()) {
      if (status.ok()) status = r.status;
      continue;
    }
    WidenRow(t.dtype, r.data.data(), out.subspan(i * cols, cols));
    std::lock_guard<std::mutex> lock(mu_);
    bytes_read_ += r.data.size();
  }
  std::lock_guard<std::mutex> lock(mu_);
  wait_seconds_ += SecondsSince(t0);
  return status;
}

void TrunkStreamer::TakeMetrics(StepMetrics& m) {
  std::lock_guard<std::mutex> lock(mu_);
  m.trunk_bytes += bytes_read_;
  m.io_wait_seconds += wait_seconds_;
  m.trunk_wait_seconds += wait_seconds_;
  m.trunk_decode_seconds += decode_seconds_;
  m.trunk_pieces_decoded_fused += decoded_fused_;
  m.trunk_pieces_decoded_whole += decoded_whole_;
  decode_seconds_ = 0;
  decoded_fused_ = decoded_whole_ = 0;
  m.trunk_pieces_out_of_order += out_of_order_ - out_of_order_reported_;
  bytes_read_ = 0;
  wait_seconds_ = 0;
  out_of_order_reported_ = out_of_order_;
}

}  // namespace k3
