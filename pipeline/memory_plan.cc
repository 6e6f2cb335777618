#include "pipeline/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/progress.h"
#include "core/tensor_names.h"
#include "io/aligned_buffer.h"

namespace k3 {
namespace {

constexpr double kGB = 1e9;

struct Preset {
  const char* name;
  double fraction;  // of the whole model; < 0: special (ultra, max, auto)
};
constexpr Preset kPresets[] = {{"ultra", -1},
                               {"laptop", 16 / 1560.0},
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

// Pins layers 0..k-1 for the largest k whose pinned bytes plus a ring for the rest fit `room`.
// Returns the bytes used.
uint64_t PinLayers(const ModelFootprint& f, uint64_t room, MemoryPlan& plan) {
  const size_t layers = f.layer_bytes.size();
  for (size_t k = layers + 1; k-- > 0;) {
    uint64_t pinned = 0, largest_streamed = 0;
    for (size_t l = 0; l < layers; ++l) {
      if (l < k) {
        pinned += f.layer_bytes[l];
      } else {
        largest_streamed = std::max(largest_streamed, f.layer_bytes[l]);
      }
    }
    const int ring = k < layers ? 2 : 0;
    const uint64_t slot = io::AlignUp(largest_streamed);
    if (pinned + ring * slot > room) continue;
    plan.pinned.assign(layers, false);
    for (size_t l = 0; l < k; ++l) plan.pinned[l] = true;
    plan.pinned_trunk_bytes = pinned;
    plan.ring_slots = ring;
    plan.ring_slot_bytes = ring > 0 ? slot : 0;
    return pinned + ring * slot;
  }
  return UINT64_MAX;  // not even a ring fits (the caller checked the minimum)
}

uint64_t FixedBytes(const ModelFootprint& f) {
  return f.globals_bytes + f.router_bytes + f.state_bytes + f.buffer_bytes;
}

uint64_t MinimumCache(const ModelFootprint& f) {
  return static_cast<uint64_t>(f.experts_per_token) * f.expert_slot_bytes;
}

uint64_t RingFor(const ModelFootprint& f) {
  uint64_t largest = 0;
  for (uint64_t b : f.layer_bytes) largest = std::max(largest, b);
  return 2 * io::AlignUp(largest);
}

uint64_t TrunkBytes(const ModelFootprint& f) {
  uint64_t total = 0;
  for (uint64_t b : f.layer_bytes) total += b;
  return total;
}

absl::StatusOr<uint64_t> BudgetFor(const ModelFootprint& f, const MemoryRequest& r,
                                   uint64_t available, uint64_t minimum, uint64_t everything,
                                   std::string& source) {
  if (r.ram_gb > 0) {
    source = absl::StrFormat("--ram-gb %g", r.ram_gb);
    return static_cast<uint64_t>(r.ram_gb * kGB);
  }
  const std::string preset = r.preset.empty() ? "auto" : r.preset;
  source = absl::StrCat("preset ", preset);
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    if (preset == "ultra") return minimum;
    if (preset == "max") return everything;
    if (preset == "auto") {
      source = absl::StrCat("preset auto (70% of ", Gb(available), " available)");
      return std::clamp<uint64_t>(static_cast<uint64_t>(0.7 * available), minimum, everything);
    }
    return std::clamp<uint64_t>(static_cast<uint64_t>(p.fraction * everything), minimum,
                                everything);
  }
  std::string names;
  for (const Preset& p : kPresets) absl::StrAppend(&names, names.empty() ? "" : " ", p.name);
  (void)f;
  return absl::InvalidArgumentError(
      absl::StrCat("--preset ", preset, ": unknown memory preset (one of: ", names, ")"));
}

}  // namespace

ModelFootprint MeasureFootprint(const Checkpoint& ckpt, int64_t max_context,
                                int64_t prefill_chunk) {
  const ModelConfig& c = ckpt.config();
  ModelFootprint f;
  f.layer_bytes.assign(c.num_layers, 0);
  for (const TensorSpec& spec : TrunkTensorSpecs(c, ckpt.names())) {
    const TensorInfo* t = ckpt.Find(spec.name);
    if (t == nullptr) continue;  // Checkpoint::Open has refused checkpoints missing tensors
    const uint64_t bytes = ResidentBytes(*t, spec.role);
    if (spec.layer < 0) {
      f.globals_bytes += bytes;
    } else if (spec.group == TensorGroup::kRouter) {
      f.router_bytes += bytes;
    } else {
      f.layer_bytes[spec.layer] += bytes;
    }
  }
  const int64_t moe_layers = c.num_layers - std::min(c.num_layers, c.first_k_dense_replace);
  f.expert_slot_bytes = io::AlignUp(static_cast<uint64_t>(c.expert_bytes())) + io::kDirectAlignment;
  f.all_experts_bytes = f.expert_slot_bytes * static_cast<uint64_t>(moe_layers * c.num_experts);
  f.experts_per_token = c.num_experts_per_token;
  // Sequence state: KDA S and conv history per KDA layer, the MLA latent cache per MLA layer.
  uint64_t state = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.attention_kind(l) == AttentionKind::kKda) {
      state += 4ull * c.kda_num_heads * c.kda_head_dim * c.kda_head_dim;
      state += 4ull * 3 * (c.short_conv_kernel_size - 1) * c.kda_width();
    } else {
      state += 4ull * max_context * (c.kv_lora_rank + c.qk_rope_head_dim);
    }
  }
  f.state_bytes = state;
  // Activations of one chunk (the widest per-token intermediates, a few of each alive at once),
  // the logits, and 8 MiB of I/O bookkeeping and small allocations.
  const uint64_t widest = std::max<uint64_t>(
      {static_cast<uint64_t>(c.hidden_size), static_cast<uint64_t>(c.kda_width()),
       static_cast<uint64_t>(c.intermediate_size), static_cast<uint64_t>(c.shared_width()),
       static_cast<uint64_t>(c.num_attention_heads * c.mla_q_head_dim())});
  const uint64_t per_token = 4 * (12 * widest +
                                  static_cast<uint64_t>(c.num_experts_per_token) *
                                      (c.routed_expert_hidden_size + 2 * c.moe_intermediate_size) +
                                  static_cast<uint64_t>(c.num_experts));
  f.buffer_bytes = per_token * prefill_chunk + 2 * 4ull * c.vocab_size + (8u << 20);
  return f;
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
  return globals_bytes + router_bytes + state_bytes + buffer_bytes + pinned_trunk_bytes +
         ring_slots * ring_slot_bytes + cache_bytes;
}

std::string MemoryPlan::Describe() const {
  std::string s =
      absl::StrFormat("memory plan (%s): budget %s, minimum %s, whole model %s\n", source,
                      Gb(budget_bytes), Gb(minimum_bytes), Gb(everything_bytes));
  absl::StrAppendFormat(&s, "  embedding + lm_head  %10s\n", Gb(globals_bytes));
  absl::StrAppendFormat(&s, "  routers              %10s\n", Gb(router_bytes));
  absl::StrAppendFormat(&s, "  trunk pinned         %10s  (%d of %d layers)\n",
                        Gb(pinned_trunk_bytes), pinned.size() - streamed_layers(), pinned.size());
  absl::StrAppendFormat(&s, "  trunk ring           %10s  (%d slots, %d layers streamed)\n",
                        Gb(ring_slots * ring_slot_bytes), ring_slots, streamed_layers());
  absl::StrAppendFormat(&s, "  expert cache         %10s  (%d experts)\n", Gb(cache_bytes),
                        cache_slots);
  absl::StrAppendFormat(&s, "  sequence state       %10s\n", Gb(state_bytes));
  absl::StrAppendFormat(&s, "  buffers              %10s\n", Gb(buffer_bytes));
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
  plan.globals_bytes = f.globals_bytes;
  plan.router_bytes = f.router_bytes;
  plan.state_bytes = f.state_bytes;
  plan.buffer_bytes = f.buffer_bytes;
  const uint64_t fixed = FixedBytes(f);
  plan.minimum_bytes = fixed + MinimumCache(f) + RingFor(f);
  plan.everything_bytes = fixed + TrunkBytes(f) + f.all_experts_bytes;
  uint64_t trunk_room = 0, cache_room = 0;
  if (split) {
    plan.source = absl::StrFormat("--trunk-gb %g --cache-gb %g", r.trunk_gb, r.cache_gb);
    trunk_room = static_cast<uint64_t>(r.trunk_gb * kGB);
    cache_room = static_cast<uint64_t>(r.cache_gb * kGB);
    plan.budget_bytes = fixed + trunk_room + cache_room;
    if (trunk_room < RingFor(f) && trunk_room < TrunkBytes(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trunk-gb ", r.trunk_gb, ": the trunk needs at least ",
                       Gb(std::min(RingFor(f), TrunkBytes(f))), " (a ring of two layers)"));
    }
    if (cache_room < MinimumCache(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cache-gb ", r.cache_gb, ": the expert cache needs at least ",
                       Gb(MinimumCache(f)), " (one layer's ", f.experts_per_token, " experts)"));
    }
  } else {
    auto budget = BudgetFor(f, r, available_ram_bytes, plan.minimum_bytes, plan.everything_bytes,
                            plan.source);
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
  const uint64_t trunk_used = PinLayers(f, trunk_room, plan);
  if (trunk_used == UINT64_MAX) return absl::InternalError("memory plan: the trunk does not fit");
  if (!split) cache_room = plan.budget_bytes - fixed - trunk_used;
  cache_room = std::min(cache_room, f.all_experts_bytes);
  plan.cache_slots = static_cast<int64_t>(cache_room / f.expert_slot_bytes);
  plan.cache_bytes = plan.cache_slots * f.expert_slot_bytes;
  return plan;
}

uint64_t AvailableRamBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace k3
