// k3 inspect: what a checkpoint holds, by kind, how its experts are laid out, and what each
// memory preset would give it.
#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/reports/disk_rate.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/stripe.h"
#include "core/util/progress.h"
#include "io/file.h"
#include "io/volume.h"
#include "pipeline/engine_options.h"
#include "pipeline/memory_plan.h"
#include "pipeline/run_plan.h"

namespace k3::cli {
namespace {

constexpr char kInspectName[] = "inspect";

void PrintConfig(const ModelConfig& c) {
  int64_t mla = 0;
  for (AttentionKind k : c.layer_kinds) mla += k == AttentionKind::kMla;
  std::printf(
      "layers      %lld (%lld KDA, %lld MLA at one-based %s), dense FFN in the first %lld\n",
      static_cast<long long>(c.num_layers), static_cast<long long>(c.num_layers - mla),
      static_cast<long long>(mla), absl::StrJoin(c.full_attn_layers, ",").c_str(),
      static_cast<long long>(c.first_k_dense_replace));
  std::printf("hidden      %lld, vocab %lld, AttnRes block %lld\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
              static_cast<long long>(c.attn_res_block_size));
  std::printf(
      "experts     %lld per MoE layer, top-%lld, %lld shared; latent %lld, width %lld; "
      "%s each (MXFP4)\n",
      static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_token),
      static_cast<long long>(c.num_shared_experts),
      static_cast<long long>(c.routed_expert_hidden_size),
      static_cast<long long>(c.moe_intermediate_size),
      FormatBytes(static_cast<double>(c.expert_bytes())).c_str());
}

// Bytes per tensor group, from the spec's classification of every expected tensor.
void PrintCensus(const Checkpoint& ckpt) {
  const ModelConfig& c = ckpt.config();
  std::map<TensorGroup, std::pair<uint64_t, int64_t>> groups;  // bytes, tensors
  for (const TensorSpec& spec : TrunkTensorSpecs(c, ckpt.names())) {
    auto& g = groups[spec.group];
    g.first += ckpt.Find(spec.name)->byte_size;
    ++g.second;
  }
  const int64_t moe_layers = c.num_layers - c.first_k_dense_replace;
  const int64_t experts = moe_layers * c.num_experts;
  uint64_t expert_bytes = 0;
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) expert_bytes += ckpt.expert(l, e).total_bytes;
  }
  groups[TensorGroup::kRoutedExpert] = {expert_bytes, experts * 6};
  std::map<DType, int64_t> dtypes;
  for (const TensorInfo& t : ckpt.tensors()) ++dtypes[t.dtype];

  std::printf("\n%-22s %12s %9s %7s\n", "kind", "bytes", "tensors", "share");
  const double total = static_cast<double>(ckpt.total_bytes());
  uint64_t trunk = 0;
  for (const auto& [group, g] : groups) {
    if (group != TensorGroup::kRoutedExpert) trunk += g.first;
    std::printf("%-22s %12s %9lld %6.1f%%\n", std::string(TensorGroupName(group)).c_str(),
                FormatBytes(static_cast<double>(g.first)).c_str(), static_cast<long long>(g.second),
                100.0 * g.first / total);
  }
  std::printf("\ntrunk (all but routed experts) %s; routed experts %s in %lld experts\n",
              FormatBytes(static_cast<double>(trunk)).c_str(),
              FormatBytes(static_cast<double>(expert_bytes)).c_str(),
              static_cast<long long>(experts));
  std::vector<std::string> dt;
  for (const auto& [d, n] : dtypes) dt.push_back(absl::StrCat(DTypeName(d), " ", n));
  std::printf("dtypes      %s\n", absl::StrJoin(dt, ", ").c_str());

  int64_t split = 0;
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) split += !ckpt.expert(l, e).contiguous();
  }
  if (split == 0) {
    std::printf("layout      every expert's six tensors are adjacent: one read per expert\n");
  } else {
    std::printf("layout      %lld of %lld experts are not contiguous: up to six reads each\n",
                static_cast<long long>(split), static_cast<long long>(experts));
  }
}

// The read rate the forecasts divide by: --disk-gbps, else measured as k3 doctor does on the
// model's largest shard. A note says where it came from (and when the files are mostly holes,
// that the rate is the memory's, not a disk's).
double DiskRate(const Checkpoint& ckpt, std::string& note) {
  if (const double given = absl::GetFlag(FLAGS_disk_gbps); given > 0) {
    note = absl::StrFormat("--disk-gbps %g", given);
    return given * 1e9;
  }
  const std::string shard = LargestShard(ckpt);
  auto rate = MeasureReads(shard);
  if (!rate.ok()) {
    note = absl::StrCat("no disk rate (", rate.status().message(), "): pass --disk-gbps");
    return 0;
  }
  note = absl::StrFormat("%.2f GB/s measured as k3 doctor does (%s reads, %d in flight, of %s)",
                         rate->bytes_per_second / 1e9, rate->direct ? "O_DIRECT" : "buffered",
                         kReadsInFlight, shard);
  if (MostlyHoles(shard)) {
    absl::StrAppend(&note,
                    "; the file is mostly holes (a sparse checkpoint), so this is the rate of "
                    "memory, not of a disk: pass --disk-gbps for a real one");
  }
  return rate->bytes_per_second;
}

// One preset's row: the plan k3 generate makes with that preset and no other flag (PlanRun over
// the engine's default options: the context and the prompt chunk auto, one sequence), so the
// table says what a run would do; and what a decode token would read and take at `rate`.
void PrintPresetRow(const Checkpoint& ckpt, const std::string& name, uint64_t available,
                    double rate) {
  EngineOptions options;
  options.memory.preset = name;
  auto run = PlanRun(ckpt, PlanRequestOf(options, /*pack=*/nullptr), available);
  if (!run.ok()) {
    std::printf("%-12s %s\n", name.c_str(), std::string(run.status().message()).c_str());
    return;
  }
  const MemoryPlan& plan = run->memory;
  const ModelFootprint fp = MeasureFootprint(ckpt, plan.context, plan.prefill_chunk);
  const int64_t experts = static_cast<int64_t>(fp.all_experts_bytes / fp.expert_slot_bytes);
  const ReadForecast reads = ForecastReads(fp, plan);
  const int64_t pinned = static_cast<int64_t>(plan.pinned.size()) - plan.streamed_layers();
  std::printf("%-12s %12s %9lld %6lld %7lld of %-4lld %8lld of %-7lld %6.1f%% %10.2f %9s\n",
              name.c_str(), FormatBytes(static_cast<double>(plan.budget_bytes)).c_str(),
              static_cast<long long>(plan.context), static_cast<long long>(plan.prefill_chunk),
              static_cast<long long>(pinned), static_cast<long long>(plan.pinned.size()),
              static_cast<long long>(plan.cache_slots), static_cast<long long>(experts),
              experts > 0 ? 100.0 * plan.cache_slots / experts : 0.0, reads.total_bytes() / 1e9,
              rate > 0 ? absl::StrFormat("%.2f", reads.total_bytes() / rate).c_str() : "-");
}

// What each memory preset would give this model ("auto" scales from the RAM available now).
void PrintPresets(const Checkpoint& ckpt) {
  const uint64_t available = AvailableRamBytes();
  std::string rate_note;
  const double rate = DiskRate(ckpt, rate_note);
  std::printf("\n%-12s %12s %9s %6s %14s %18s %7s %10s %9s\n", "preset", "budget", "context",
              "chunk", "pinned layers", "cache experts", "cached", "GB/token", "s/token");
  for (const std::string& name : MemoryPresetNames()) PrintPresetRow(ckpt, name, available, rate);
  std::printf(
      "(each row is the plan k3 generate --preset NAME makes: context and prompt chunk auto,\n"
      "one sequence, no trunk pack; auto: 70%% of the %s available now)\n"
      "GB/token: the streamed trunk and the experts the cache misses (its hit rate taken as the\n"
      "share of experts it holds); s/token: those bytes at the disk rate, a decode step's I/O "
      "floor\ndisk rate: %s\n",
      FormatBytes(static_cast<double>(available)).c_str(), rate_note.c_str());
}

// The volumes' copies of the model's files, and any stripes in them: listed, and with
// --verify-volumes compared byte for byte (stripes: every checksum). False when one differs.
bool InspectVolumes(const Checkpoint& ckpt, const std::vector<io::Volume>& volumes) {
  if (volumes.empty()) return true;
  const bool full = absl::GetFlag(FLAGS_verify_volumes);
  bool ok = true;
  std::vector<std::string> dirs;
  std::printf("\n%-40s %7s %s\n", "volume", "copies",
              full ? "every byte" : "size, header, samples");
  for (const io::Volume& volume : volumes) {
    dirs.push_back(volume.dir);
    int copies = 0, bad = 0;
    for (const std::string& path : ckpt.shard_paths()) {
      const std::string copy = volume.dir + path.substr(path.rfind('/'));
      if (!io::FileExists(copy)) continue;
      ++copies;
      std::unique_ptr<ProgressBar> bar;
      absl::Status s = io::CheckCopy(
          path, copy, full ? io::CopyCheck::kFull : io::CopyCheck::kSampled,
          [&](uint64_t done, uint64_t total) {
            if (!bar) bar = std::make_unique<ProgressBar>("verify", total, "B", ShowProgress());
            bar->Update(done);
          });
      if (bar) bar->Finish();
      if (!s.ok()) {
        ++bad;
        std::fprintf(stderr, "k3 inspect: %s\n", std::string(s.message()).c_str());
      }
    }
    std::printf("%-40s %7d %s\n", volume.dir.c_str(), copies,
                bad == 0 ? "same as the model's" : absl::StrCat(bad, " differ").c_str());
    ok &= bad == 0;
  }
  absl::Status stripes = full ? VerifyStripes(ckpt, dirs) : LoadStripes(ckpt, dirs).status();
  if (!stripes.ok()) {
    std::fprintf(stderr, "k3 inspect: %s\n", std::string(stripes.message()).c_str());
    ok = false;
  }
  return ok;
}

int RunInspect(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kInspectName, "unexpected argument " + positional[0]);
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return UsageError(kInspectName, "--model DIR is required");
  auto volumes = VolumesFromFlags();
  if (!volumes.ok()) return ReportError(kInspectName, volumes.status());
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ReportError(kInspectName, ckpt.status());
  std::printf(
      "model       %s: %zu files, %s, %zu tensors\n", dir.c_str(), (*ckpt)->shard_paths().size(),
      FormatBytes(static_cast<double>((*ckpt)->total_bytes())).c_str(), (*ckpt)->tensors().size());
  PrintConfig((*ckpt)->config());
  PrintCensus(**ckpt);
  PrintPresets(**ckpt);
  return InspectVolumes(**ckpt, *volumes) ? kExitOk : kExitFailure;
}

}  // namespace

const Subcommand& InspectCommand() {
  static const Subcommand kCommand = {
      kInspectName,
      "show what a checkpoint holds, check that it is complete, and what each preset gives",
      "inspect --model DIR [--disk-gbps X] [--volume DIR ... [--verify-volumes]]",
      "Shows what a checkpoint holds: its config, bytes by kind (embedding, attention, router,\n"
      "shared and routed experts, ...), expert size and whether each expert is one contiguous\n"
      "read. Opening the checkpoint checks every header and that every tensor the config needs\n"
      "is present with the right shape.\n\n"
      "Then, for every memory preset (ultra ... max, and auto = 70% of the RAM available now):\n"
      "the plan k3 generate --preset NAME would make (the same planner): the RAM budget, the\n"
      "context and prompt chunk it chooses (auto), the trunk layers it pins (the others stream\n"
      "through a ring every token) and the routed experts its cache holds; and what a decode\n"
      "token would read (streamed trunk plus the experts the cache misses, its hit rate taken\n"
      "as the share of experts it holds) and take at the disk's rate:\n"
      "--disk-gbps, or measured as k3 doctor does on the largest shard (2.5 s).\n\n"
      "With --volume: the copies of the model's files each volume holds, checked as a run\n"
      "checks them (size, header, samples), or byte for byte with --verify-volumes, and any\n"
      "k3 stripe layout in them (every checksum with --verify-volumes). Exit 1 when a copy or\n"
      "a stripe differs, naming it.",
      kInspect,
      RunInspect};
  return kCommand;
}

}  // namespace k3::cli
