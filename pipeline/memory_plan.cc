#include "pipeline/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checkpoint/tensor_names.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/model/model.h"
#include "core/model/step_scratch.h"
#include "core/util/proc_fields.h"
#include "core/util/progress.h"
#include "io/aligned_buffer.h"
#include "pipeline/held_trunk.h"

namespace k3 {
namespace {

constexpr double kGB = 1e9;

struct Preset {
  const char* name;
  double fraction;  // of the whole model; < 0: special (ultra, max, auto)
};
// laptop: 8 GB of peak RSS for Kimi K3, the budget plus the fixed overhead (docs/MEMORY.md).
constexpr Preset kPresets[] = {{"ultra", -1},
                               {"laptop", 7.8 / 1560.0},
                               {"desktop", 64 / 1560.0},
                               {"workstation", 192 / 1560.0},
                               {"server", 512 / 1560.0},
                               {"max", -1},
                               {"auto", -1}};

// Bytes a trunk tensor takes once loaded (core/model/weights.h): matrices keep BF16 and F32 and
// widen F16 to F32; vectors are held as fp32.
uint64_t ResidentBytes(const TensorInfo& t, TensorRole role) {
  if (role == TensorRole::kVector) return static_cast<uint64_t>(t.elements()) * 4;
  if (t.dtype == DType::kF16) return t.byte_size * 2;
  return t.byte_size;
}

std::string Gb(uint64_t bytes) { return FormatBytes(static_cast<double>(bytes)); }

// The matrices the forward pass uses row by row (LayerMatrixOrder's `whole`).
absl::flat_hash_set<std::string> WholeMatrixNames(const Checkpoint& ckpt) {
  absl::flat_hash_set<std::string> whole;
  for (int64_t l = 0; l < ckpt.config().num_layers; ++l) {
    for (const OrderedMatrix& m : LayerMatrixOrder(ckpt.config(), ckpt.names(), l)) {
      if (m.whole) whole.insert(m.name);
    }
  }
  return whole;
}

uint64_t MinimumCache(const ModelFootprint& f) {
  return static_cast<uint64_t>(f.experts_per_token) * f.expert_slot_bytes;
}

// Always resident, whatever the budget (the expert cache's top-k minimum comes on top).
uint64_t FixedBytes(const ModelFootprint& f) {
  return f.vector_bytes + f.state_bytes + f.buffer_bytes;
}

uint64_t WholeTrunk(const ModelFootprint& f) {
  return f.all_router_bytes() + f.trunk_bytes() + f.lm_head_bytes;
}

// Places the routers, the layers' matrices and lm_head in `room`: all of them without a ring
// when they fit; otherwise the minimum's ring, the routers, a deeper ring, then each layer in
// order and lm_head where it fits. Returns the bytes used; UINT64_MAX when not even the ring
// fits.
uint64_t PlaceTrunk(const ModelFootprint& f, uint64_t room, MemoryPlan& plan) {
  const size_t layers = f.layer_bytes.size();
  plan.pinned.assign(layers, true);
  plan.pinned_compressed = false;
  plan.routers_resident = plan.lm_head_resident = true;
  plan.ring_slots = 0;
  plan.ring_slot_bytes = 0;
  plan.ring_decode_bytes = 0;
  plan.router_bytes = f.all_router_bytes();
  plan.lm_head_bytes = f.lm_head_bytes;
  plan.pinned_trunk_bytes = f.trunk_bytes();
  if (WholeTrunk(f) <= room) return WholeTrunk(f);
  if (f.ring_bytes() > room) return UINT64_MAX;
  uint64_t used = f.ring_bytes();
  plan.routers_resident = used + f.all_router_bytes() <= room;
  plan.router_bytes = plan.routers_resident ? f.all_router_bytes() : 0;
  used += plan.router_bytes;
  // A deeper ring before anything is pinned: while a layer's experts and attention compute, the
  // ring reads on, up to a typical layer ahead (the minimum's few pieces would leave the disk
  // idle through that compute).
  plan.ring_slots = f.ring_slots;
  plan.ring_slot_bytes = f.ring_slot_bytes;
  plan.ring_decode_bytes = f.ring_decode_bytes;
  while (plan.ring_slots < f.deep_ring_slots && used + f.ring_slot_bytes <= room) {
    ++plan.ring_slots;
    used += f.ring_slot_bytes;
  }
  plan.pinned_trunk_bytes = 0;
  plan.pinned_compressed = !f.layer_held_bytes.empty();
  for (size_t l = 0; l < layers; ++l) {
    // A pinned layer keeps its own router when the routers are not resident as a whole.
    const uint64_t layer = plan.pinned_compressed ? f.layer_held_bytes[l] : f.layer_bytes[l];
    const uint64_t cost = layer + (plan.routers_resident ? 0 : f.router_bytes[l]);
    plan.pinned[l] = used + cost <= room;
    if (!plan.pinned[l]) continue;
    used += cost;
    plan.pinned_trunk_bytes += cost;
  }
  plan.lm_head_resident = used + f.lm_head_bytes <= room;
  plan.lm_head_bytes = plan.lm_head_resident ? f.lm_head_bytes : 0;
  used += plan.lm_head_bytes;
  // No deeper than what is left to stream (the rest goes to the cache).
  const uint64_t streamed = ForecastReads(f, plan).trunk_bytes;
  const int enough = static_cast<int>(std::min<uint64_t>(
      kMaxRingSlots, (streamed + f.piece_bytes - 1) / std::max<uint64_t>(1, f.piece_bytes) + 1));
  while (plan.ring_slots > std::max(f.ring_slots, enough)) {
    --plan.ring_slots;
    used -= f.ring_slot_bytes;
  }
  return used;
}

// The budget; `requested` gets MemoryPlan::requested_bytes (set with the budget).
absl::StatusOr<uint64_t> BudgetFor(const MemoryRequest& r, uint64_t available, uint64_t minimum,
                                   uint64_t everything, std::string& source, uint64_t& requested) {
  requested = 0;
  if (r.ram_gb > 0) {
    source = absl::StrFormat("--ram-gb %g", r.ram_gb);
    return requested = static_cast<uint64_t>(r.ram_gb * kGB);
  }
  const std::string preset = r.preset.empty() ? "auto" : r.preset;
  source = absl::StrCat("preset ", preset);
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    if (preset == "ultra") return minimum;
    if (preset == "max") return everything;
    if (preset == "auto") {
      source = absl::StrCat("preset auto (70% of ", Gb(available), " available)");
      const auto share = static_cast<uint64_t>(0.7 * available);
      const uint64_t budget = std::clamp<uint64_t>(share, minimum, everything);
      requested = std::max(budget, share);
      return budget;
    }
    return requested = std::clamp<uint64_t>(static_cast<uint64_t>(p.fraction * everything), minimum,
                                            everything);
  }
  std::string names;
  for (const Preset& p : kPresets) absl::StrAppend(&names, names.empty() ? "" : " ", p.name);
  return absl::InvalidArgumentError(
      absl::StrCat("--preset ", preset, ": unknown memory preset (one of: ", names, ")"));
}

// The stored bytes of a matrix's widest piece: `piece_bytes` of whole rows, at least one row;
// the whole matrix when it is used row by row.
uint64_t LargestPiece(const TensorInfo& t, uint64_t piece_bytes, bool whole) {
  if (whole) return t.byte_size;
  const uint64_t row = t.byte_size / static_cast<uint64_t>(t.shape[0]);
  return std::min(t.byte_size, std::max(row, piece_bytes / row * row));
}

}  // namespace

uint64_t ModelFootprint::all_router_bytes() const {
  uint64_t n = 0;
  for (uint64_t b : router_bytes) n += b;
  return n;
}

bool HeldCompressed(const TensorSpec& spec, const PackedTensor* packed, bool whole) {
  return packed != nullptr && packed->compressed() && !whole && spec.layer >= 0 &&
         spec.role != TensorRole::kVector && spec.group != TensorGroup::kRouter &&
         spec.group != TensorGroup::kLmHead && spec.group != TensorGroup::kEmbedding;
}

std::vector<const TensorInfo*> HeldCompressedTensors(const Checkpoint& ckpt, const TrunkPack* pack,
                                                     const MemoryPlan& plan) {
  std::vector<const TensorInfo*> out;
  if (!plan.pinned_compressed || pack == nullptr) return out;
  const absl::flat_hash_set<std::string> whole = WholeMatrixNames(ckpt);
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
    const TensorInfo* t = ckpt.Find(spec.name);
    if (t == nullptr || spec.layer < 0 || !plan.pinned[spec.layer]) continue;
    if (HeldCompressed(spec, pack->Find(spec.name), whole.contains(spec.name))) out.push_back(t);
  }
  return out;
}

uint64_t ModelFootprint::trunk_bytes() const {
  uint64_t n = 0;
  for (uint64_t b : layer_bytes) n += b;
  return n;
}

ModelFootprint MeasureFootprint(const Checkpoint& ckpt, int64_t max_context, int64_t prefill_chunk,
                                const RingOptions& ring) {
  const ModelConfig& c = ckpt.config();
  ModelFootprint f;
  f.layer_bytes.assign(c.num_layers, 0);
  f.router_bytes.assign(c.num_layers, 0);
  f.layer_read_bytes.assign(c.num_layers, 0);
  f.router_read_bytes.assign(c.num_layers, 0);
  const absl::flat_hash_set<std::string> whole = WholeMatrixNames(ckpt);
  // The pieces: the default size, or less when no matrix is that large.
  std::vector<std::pair<const TensorInfo*, bool>> matrices;  // streamable, whole
  uint64_t largest_matrix = 0;
  bool widened = false, any_held = false;
  std::vector<uint64_t> held(c.num_layers, 0);
  for (const TensorSpec& spec : TrunkTensorSpecs(c, ckpt.names())) {
    const TensorInfo* t = ckpt.Find(spec.name);
    if (t == nullptr) continue;  // Checkpoint::Open has refused checkpoints missing tensors
    const uint64_t bytes = ResidentBytes(*t, spec.role);
    if (spec.role == TensorRole::kVector) {
      f.vector_bytes += bytes;
    } else if (spec.group == TensorGroup::kEmbedding) {
      f.embedding_bytes += bytes;
    } else {
      const PackedTensor* packed = ring.pack != nullptr ? ring.pack->Find(spec.name) : nullptr;
      const uint64_t read = packed != nullptr && packed->compressed() ? packed->stored : bytes;
      if (spec.group == TensorGroup::kLmHead) {
        f.lm_head_bytes += bytes;
        f.lm_head_read_bytes += read;
      } else if (spec.group == TensorGroup::kRouter) {
        f.router_bytes[spec.layer] += bytes;
        f.router_read_bytes[spec.layer] += read;
      } else {
        f.layer_bytes[spec.layer] += bytes;
        f.layer_read_bytes[spec.layer] += read;
        const bool is_held = HeldCompressed(spec, packed, whole.contains(spec.name));
        held[spec.layer] += is_held ? HeldTrunk::MemoryFor(*packed) : bytes;
        any_held |= is_held;
      }
      matrices.emplace_back(t, whole.contains(spec.name));
      largest_matrix = std::max(largest_matrix, t->byte_size);
      widened |= t->dtype == DType::kF16;
    }
  }
  if (any_held) f.layer_held_bytes = std::move(held);
  f.piece_bytes = ring.piece_bytes > 0 ? ring.piece_bytes
                                       : std::min(kDefaultPieceBytes, io::AlignUp(largest_matrix));
  uint64_t largest_piece = 0, largest_whole = 0, scratch = 0, most_piece_rows = 0;
  const std::string lm_head = ckpt.names().Global(tensor_name::kLmHead);
  for (const auto& [t, is_whole] : matrices) {
    const PackedTensor* packed = ring.pack != nullptr ? ring.pack->Find(t->name) : nullptr;
    const uint64_t row_bytes = t->byte_size / static_cast<uint64_t>(t->shape[0]);
    if (packed == nullptr || !packed->compressed()) {
      const uint64_t piece = LargestPiece(*t, f.piece_bytes, is_whole);
      largest_piece = std::max(largest_piece, piece);
      // lm_head multiplies a row a sequence, or kPositionLogitsRows (buffer_bytes_per_sequence
      // and the 8 MiB below), never a chunk.
      if (!is_whole && t->name != lm_head) {
        most_piece_rows = std::max(most_piece_rows, piece / row_bytes);
      }
      continue;
    }
    const auto pieces = BlockPieces(*packed, f.piece_bytes, is_whole);
    for (const auto& piece : pieces) {
      uint64_t rows = 0;
      for (size_t b = piece.first; b < piece.second; ++b) {
        // The scratch of CompressedPieceMatMul: a block's rows, and their products for a chunk.
        const uint64_t block_rows = packed->blocks[b].rows;
        rows += block_rows;
        scratch = std::max(scratch, block_rows * row_bytes +
                                        block_rows * 4 * static_cast<uint64_t>(prefill_chunk));
      }
      largest_piece = std::max(largest_piece, PieceStoredBytes(*packed, piece));
      if (pieces.size() == 1)
        largest_whole = std::max(largest_whole, io::AlignUp(rows * row_bytes));
    }
  }
  // An aligned read of a piece starts up to one block before it; F16 pieces are widened to fp32
  // beside the slot; compressed ones decode into ring_decode_bytes.
  f.ring_slot_bytes = io::AlignUp(largest_piece) + io::kDirectAlignment;
  if (widened) f.ring_slot_bytes += 2 * largest_piece;
  // The scratch is thread_local: the compute threads and the thread that calls the engine.
  const uint64_t threads = static_cast<uint64_t>(
      ring.threads > 0 ? ring.threads : std::max(1u, std::thread::hardware_concurrency()));
  f.ring_decode_bytes =
      kDecodeBuffers * largest_whole + (scratch > 0 ? (threads + 1) * scratch : 0);
  f.ring_slots = ring.slots > 0 ? std::max(2, ring.slots) : kDefaultRingSlots;
  f.deep_ring_slots = f.ring_slots;
  if (ring.slots == 0 && !f.layer_bytes.empty()) {
    std::vector<uint64_t> sorted = f.layer_bytes;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const uint64_t typical = sorted[sorted.size() / 2];
    f.deep_ring_slots =
        std::clamp<int>(static_cast<int>(typical / f.piece_bytes) + 2, f.ring_slots, kMaxRingSlots);
  }

  const int64_t moe_layers = c.num_layers - std::min(c.num_layers, c.first_k_dense_replace);
  f.moe_layers = moe_layers;
  f.expert_bytes = static_cast<uint64_t>(c.expert_bytes());
  f.expert_slot_bytes = io::AlignUp(static_cast<uint64_t>(c.expert_bytes())) + io::kDirectAlignment;
  f.all_experts_bytes = f.expert_slot_bytes * static_cast<uint64_t>(moe_layers * c.num_experts);
  f.experts_per_token = c.num_experts_per_token;
  // Sequence state: KDA S and conv history per KDA layer (fixed), the MLA latent cache per MLA
  // layer and the token ids (per token).
  uint64_t state = 0;
  f.state_bytes_per_token = 4;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.attention_kind(l) == AttentionKind::kKda) {
      state += 4ull * c.kda_num_heads * c.kda_head_dim * c.kda_head_dim;
      state += 4ull * 3 * (c.short_conv_kernel_size - 1) * c.kda_width();
    } else {
      f.state_bytes_per_token += 4ull * (c.kv_lora_rank + c.qk_rope_head_dim);
    }
  }
  f.context = max_context;
  f.state_bytes_per_sequence = state + f.state_bytes_per_token * max_context;
  f.state_bytes = f.state_bytes_per_sequence;
  if (const TensorInfo* e = ckpt.Find(ckpt.names().Global(tensor_name::kEmbedding))) {
    f.embedding_row_bytes = e->byte_size / std::max<int64_t>(1, e->shape[0]);
  }
  // A streamed product puts a piece's products for every token in [tokens, piece rows] before
  // copying them to their columns (StreamedMatMul in core/model/weights.cc), beside the step
  // scratch: up to 48 KB a token more at Kimi K3's shapes (KDA's f_b is one piece of 12,288 rows).
  f.prefill_bytes_per_token = StepScratch::BytesPerToken(c) + 4 * most_piece_rows;
  const uint64_t per_token = f.prefill_bytes_per_token;
  const uint64_t embedding_row = f.embedding_row_bytes;
  f.buffer_bytes_per_sequence = per_token + 4ull * c.vocab_size;
  // The chunk's activations (the forward pass's StepScratch, counted from its own layout), the
  // logits, the embedding rows read on demand, each compute thread's product scratch (one token
  // group of activations, kernels/internal/panel-inl.h) and expert pass, and 8 MiB of I/O
  // bookkeeping and small allocations.
  f.prefill_chunk = prefill_chunk;
  f.buffer_bytes = per_token * prefill_chunk + 2 * 4ull * c.vocab_size +
                   kEmbeddingRowsPerRead * (io::AlignUp(embedding_row) + io::kDirectAlignment) +
                   (threads + 1) * (kProductScratchBytes + StepScratch::ExpertPassBytes(c)) +
                   (8u << 20);
  return f;
}

ModelFootprint ModelFootprint::WithSequences(int n) const {
  ModelFootprint f = *this;
  const int more = n - sequences;
  f.sequences = n;
  f.state_bytes = state_bytes + more * static_cast<int64_t>(state_bytes_per_sequence);
  f.buffer_bytes = buffer_bytes + more * static_cast<int64_t>(buffer_bytes_per_sequence);
  return f;
}

ModelFootprint ModelFootprint::WithContext(int64_t tokens) const {
  ModelFootprint f = *this;
  f.context = tokens;
  f.state_bytes_per_sequence =
      state_bytes_per_sequence - state_bytes_per_token * context + state_bytes_per_token * tokens;
  f.state_bytes = state_bytes - state_bytes_per_sequence * sequences +
                  f.state_bytes_per_sequence * static_cast<uint64_t>(sequences);
  return f;
}

int MaxSequences(const ModelFootprint& f, const MemoryRequest& r, uint64_t available_ram_bytes,
                 int cap) {
  int fits = 0;  // the plan grows with n, so the first that fails ends the search
  for (int n = 1; n <= cap && PlanMemory(f.WithSequences(n), r, available_ram_bytes).ok(); ++n) {
    fits = n;
  }
  return fits;
}

ReadForecast ForecastReads(const ModelFootprint& f, const MemoryPlan& plan) {
  ReadForecast r;
  for (size_t l = 0; l < f.layer_bytes.size(); ++l) {
    if (!plan.pinned[l]) {
      r.trunk_bytes += f.layer_read(l) + (plan.routers_resident ? 0 : f.router_read(l));
    }
  }
  if (!plan.lm_head_resident) r.trunk_bytes += f.lm_head_read();
  if (!plan.embedding_resident) r.trunk_bytes += f.embedding_row_bytes;
  const int64_t experts = static_cast<int64_t>(f.all_experts_bytes / f.expert_slot_bytes);
  r.hit_rate = experts > 0 ? std::min(1.0, static_cast<double>(plan.cache_slots) / experts) : 0;
  r.expert_bytes = (1 - r.hit_rate) * static_cast<double>(f.experts_per_token * f.moe_layers) *
                   static_cast<double>(f.expert_bytes);
  return r;
}

const std::vector<std::string>& MemoryPresetNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> n;
    for (const Preset& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return kNames;
}

int64_t MemoryPlan::streamed_layers() const {
  return std::count(pinned.begin(), pinned.end(), false);
}

uint64_t MemoryPlan::planned_bytes() const {
  return vector_bytes + state_bytes + buffer_bytes + embedding_bytes + lm_head_bytes +
         router_bytes + pinned_trunk_bytes + ring_bytes() + cache_bytes;
}

TrunkResidency MemoryPlan::residency() const {
  TrunkResidency r;
  r.layers = pinned;
  r.routers = routers_resident;
  r.lm_head = lm_head_resident;
  r.embedding = embedding_resident;
  return r;
}

std::string MemoryPlan::Describe() const {
  std::string s =
      absl::StrFormat("memory plan (%s): budget %s, minimum %s, whole model %s\n", source,
                      Gb(budget_bytes), Gb(minimum_bytes), Gb(everything_bytes));
  auto line = [&s](const char* part, const std::string& bytes, const std::string& note) {
    absl::StrAppendFormat(&s, "  %-20s %10s%s\n", part, bytes, note.empty() ? "" : "  " + note);
  };
  line("embedding", Gb(embedding_bytes),
       embedding_resident ? "(resident)" : "(rows read on demand)");
  line("lm_head", Gb(lm_head_bytes), lm_head_resident ? "(resident)" : "(streamed)");
  line("routers", Gb(router_bytes),
       routers_resident ? "(resident: lookahead on)" : "(with their layers: no lookahead there)");
  line("trunk pinned", Gb(pinned_trunk_bytes),
       absl::StrFormat("(%d of %d layers%s)", pinned.size() - streamed_layers(), pinned.size(),
                       pinned_compressed && streamed_layers() < static_cast<int64_t>(pinned.size())
                           ? ", held compressed"
                           : ""));
  std::string ring = "(nothing streams)";
  if (ring_slots > 0 && ring_decode_bytes == 0) {
    ring = absl::StrFormat("(%d slots for pieces of %s, %d layers streamed)", ring_slots,
                           Gb(piece_bytes), streamed_layers());
  } else if (ring_slots > 0) {
    ring = absl::StrFormat(
        "(%d slots of %s for compressed pieces of up to %s decoded, %s to decode into, %d layers "
        "streamed)",
        ring_slots, Gb(ring_slot_bytes), Gb(piece_bytes), Gb(ring_decode_bytes), streamed_layers());
  }
  line("trunk ring", Gb(ring_bytes()), ring);
  line("expert cache", Gb(cache_bytes), absl::StrFormat("(%d experts)", cache_slots));
  line("norms and vectors", Gb(vector_bytes), "");
  line("sequence state", Gb(state_bytes),
       sequences > 1 ? absl::StrFormat("(%d sequences of %s)", sequences,
                                       Gb(state_bytes / static_cast<uint64_t>(sequences)))
                     : std::string());
  if (context > 0) {
    line("context", absl::StrCat(context),
         absl::StrCat("tokens a sequence (", context_source, ")"));
  }
  line("buffers", Gb(buffer_bytes),
       absl::StrFormat("(prompt chunks of %d tokens: %s)", prefill_chunk, prefill_chunk_source));
  return s;
}

absl::StatusOr<MemoryPlan> PlanMemory(const ModelFootprint& f, const MemoryRequest& r,
                                      uint64_t available_ram_bytes) {
  const bool split = r.trunk_gb > 0 || r.cache_gb > 0;
  if ((r.ram_gb > 0) + !r.preset.empty() + split > 1) {
    return absl::InvalidArgumentError(
        "--ram-gb, --preset and --trunk-gb/--cache-gb exclude each other");
  }
  if (split && (r.trunk_gb <= 0 || r.cache_gb <= 0)) {
    return absl::InvalidArgumentError("--trunk-gb and --cache-gb go together");
  }
  MemoryPlan plan;
  plan.sequences = f.sequences;
  plan.vector_bytes = f.vector_bytes;
  plan.state_bytes = f.state_bytes;
  plan.buffer_bytes = f.buffer_bytes;
  plan.prefill_chunk = f.prefill_chunk;
  plan.prefill_chunk_source = absl::StrCat("--prefill-chunk ", f.prefill_chunk);
  plan.context = f.context;
  plan.context_source = absl::StrCat("--max-context ", f.context);
  plan.piece_bytes = f.piece_bytes;
  const uint64_t fixed = FixedBytes(f);
  const uint64_t ring_or_all = std::min(f.ring_bytes(), WholeTrunk(f));
  plan.minimum_bytes = fixed + MinimumCache(f) + ring_or_all;
  plan.everything_bytes = fixed + WholeTrunk(f) + f.embedding_bytes + f.all_experts_bytes;
  uint64_t trunk_room = 0, cache_room = 0;
  if (split) {
    plan.source = absl::StrFormat("--trunk-gb %g --cache-gb %g", r.trunk_gb, r.cache_gb);
    trunk_room = static_cast<uint64_t>(r.trunk_gb * kGB);
    cache_room = static_cast<uint64_t>(r.cache_gb * kGB);
    plan.budget_bytes = fixed + trunk_room + cache_room;
    if (trunk_room < ring_or_all) {
      return absl::InvalidArgumentError(absl::StrCat("--trunk-gb ", r.trunk_gb,
                                                     ": the trunk needs at least ", Gb(ring_or_all),
                                                     " (its streaming ring)"));
    }
    if (cache_room < MinimumCache(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-gb ", r.cache_gb, ": the expert cache needs at least ",
                       Gb(MinimumCache(f)), " (one layer's ", f.experts_per_token, " experts)"));
    }
  } else {
    auto budget = BudgetFor(r, available_ram_bytes, plan.minimum_bytes, plan.everything_bytes,
                            plan.source, plan.requested_bytes);
    if (!budget.ok()) return budget.status();
    plan.budget_bytes = *budget;
    if (plan.budget_bytes < plan.minimum_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          plan.source, ": a budget of ", Gb(plan.budget_bytes),
          " is below this model's minimum of ", Gb(plan.minimum_bytes), " (use --ram-gb ",
          absl::StrFormat("%.3f", std::ceil(plan.minimum_bytes / 1e6) / 1e3),
          " or more, or --preset ultra)"));
    }
    trunk_room = plan.budget_bytes - fixed - MinimumCache(f);
  }
  const uint64_t trunk_used = PlaceTrunk(f, trunk_room, plan);
  if (trunk_used == UINT64_MAX) return absl::InternalError("memory plan: the trunk does not fit");
  if (!split) cache_room = plan.budget_bytes - fixed - trunk_used;
  // The embedding only once every expert is cached: a token reads one row of it.
  plan.embedding_resident = !split && cache_room >= f.all_experts_bytes + f.embedding_bytes;
  plan.embedding_bytes = plan.embedding_resident ? f.embedding_bytes : 0;
  cache_room = std::min(cache_room - plan.embedding_bytes, f.all_experts_bytes);
  plan.cache_slots = static_cast<int64_t>(cache_room / f.expert_slot_bytes);
  plan.cache_bytes = plan.cache_slots * f.expert_slot_bytes;
  return plan;
}

uint64_t AvailableRamBytes() { return MeminfoBytes("MemAvailable"); }

}  // namespace k3
