// k3 synth: write a random-weight checkpoint in the release layout.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/commands/commands.h"
#include "apps/options/flags.h"
#include "core/synth/synth.h"
#include "core/util/progress.h"
#include "io/file.h"

namespace k3::cli {
namespace {

constexpr char kSynthName[] = "synth";

int RunSynth(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kSynthName, "unexpected argument " + positional[0]);
  SynthOptions opt;
  opt.preset = absl::GetFlag(FLAGS_preset).empty() ? "tiny" : absl::GetFlag(FLAGS_preset);
  opt.out_dir = absl::GetFlag(FLAGS_out);
  opt.seed = absl::GetFlag(FLAGS_seed);
  opt.router_skew = absl::GetFlag(FLAGS_router_skew);
  opt.show_progress = ShowProgress();
  opt.sparse = absl::GetFlag(FLAGS_sparse);
  opt.single_file = absl::GetFlag(FLAGS_single_file);
  if (opt.out_dir.empty()) return UsageError(kSynthName, "--out DIR is required");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f16") {
    opt.floats = SynthFloats::kF16;
  } else if (dtype == "f32") {
    opt.floats = SynthFloats::kF32;
  } else if (dtype != "release") {
    return UsageError(kSynthName, "--dtype must be release, f16 or f32, not '" + dtype + "'");
  }
  const std::string weights = absl::GetFlag(FLAGS_weights);
  if (weights == "gaussian") {
    opt.weights = SynthWeights::kGaussian;
  } else if (weights == "uniform") {
    opt.weights = SynthWeights::kUniform;
  } else if (!weights.empty()) {
    return UsageError(kSynthName, "--weights must be gaussian or uniform, not '" + weights + "'");
  }
  // --set is a list flag, which absl splits on commas: full_attn_layers=4,6 arrives as
  // "full_attn_layers=4" and "6". A piece without '=' continues the value before it.
  std::vector<std::string> sets;
  for (const std::string& piece : absl::GetFlag(FLAGS_set)) {
    if (piece.find('=') == std::string::npos && !sets.empty()) {
      absl::StrAppend(&sets.back(), ",", piece);
    } else {
      sets.push_back(piece);
    }
  }
  for (const std::string& kv : sets) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError(kSynthName, absl::StrCat("--set ", kv, ": expected key=value"));
    }
    opt.overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (io::FileExists(opt.out_dir + "/config.json") && !absl::GetFlag(FLAGS_force)) {
    return UsageError(kSynthName,
                      absl::StrCat(opt.out_dir,
                                   " already holds a model (config.json); pass --force to "
                                   "overwrite it"));
  }
  auto result = Synthesize(opt);
  if (!result.ok()) return ReportError(kSynthName, result.status());
  const ModelConfig& c = result->config;
  if (!absl::GetFlag(FLAGS_quiet)) {
    const std::string data = FormatBytes(static_cast<double>(result->bytes_written));
    std::fprintf(stderr, "k3 synth: wrote %s preset (seed %llu) to %s: %d %s, %s in %.2f s",
                 opt.preset.c_str(), static_cast<unsigned long long>(opt.seed), opt.out_dir.c_str(),
                 result->shards, result->shards == 1 ? "file" : "shards",
                 opt.sparse ? (data + " apparent (sparse)").c_str() : data.c_str(),
                 result->seconds);
    if (!opt.sparse) {
      std::fprintf(stderr, " (%s/s)",
                   FormatBytes(result->bytes_written / std::max(result->seconds, 1e-9)).c_str());
    }
    std::fprintf(stderr,
                 "\n  %lld language-model tensors%s; hidden %lld, %lld layers, vocab %lld, %lld "
                 "experts top-%lld, expert %s\n",
                 static_cast<long long>(result->language_tensors),
                 result->other_tensors > 0
                     ? absl::StrCat(" and ", result->other_tensors, " vision placeholders").c_str()
                     : "",
                 static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_layers),
                 static_cast<long long>(c.vocab_size), static_cast<long long>(c.num_experts),
                 static_cast<long long>(c.num_experts_per_token),
                 FormatBytes(static_cast<double>(c.expert_bytes())).c_str());
    if (HistogramTotal(result->bf16_exponents) > 0) {
      // Next to the ~2.6 bits published for trained LLMs: what an exact trunk codec can save.
      std::fprintf(stderr,
                   "  BF16 exponent entropy (%s weights): %.3f bits over all %s of BF16, "
                   "%.3f bits per tensor (size-weighted mean); trained LLMs: ~2.6\n",
                   result->weights == SynthWeights::kGaussian ? "gaussian" : "uniform",
                   EntropyBits(result->bf16_exponents),
                   FormatBytes(2.0 * HistogramTotal(result->bf16_exponents)).c_str(),
                   result->bf16_tensor_entropy_bits);
    }
  }
  return kExitOk;
}

}  // namespace

const Subcommand& SynthCommand() {
  static const Subcommand kCommand = {
      kSynthName,
      "write a random-weight checkpoint in the release layout",
      "synth --preset tiny|demo|bench|slice|full --out DIR [--sparse] [--single-file] [--seed N] "
      "[--weights gaussian|uniform] [--set key=value ...]",
      "Writes a random-weight checkpoint in the released Kimi K3 layout.\n"
      "Nested config.json, one safetensors shard per layer plus one for the embedding and\n"
      "lm_head, model.safetensors.index.json, MXFP4 experts with their six tensors adjacent, and\n"
      "a small tokenizer (tiktoken.model, tokenizer_config.json; with the vocabulary's top 256\n"
      "ids reserved for special tokens). The same preset, seed and overrides give the same\n"
      "bytes. Presets: tiny (tests), demo (make run, ~150 MB), bench (real 17.5 MB experts,\n"
      "~16 GB), slice, full (Kimi K3's exact text config, 1.56 TB: use --sparse).\n"
      "slice has Kimi K3's dimensions for every tensor (hidden 7168, vocab 163840, KDA and MLA\n"
      "with 96 heads, dense layer 0 at 33,792 wide) in 6 layers, MLA at one-based 4 and 6, with\n"
      "128 experts per MoE layer, top-16: 23.7 GB (12.5 GB trunk, 11.2 GB experts), written in\n"
      "~80 s on a disk taking 300 MB/s (drawing runs at ~1.5 GB/s on one core, so the disk\n"
      "sets the pace). It is the model for measurements where Kimi K3's trunk streams from\n"
      "disk: trunk packing, compression, small budgets.\n"
      "full writes the release's files: 96 shards model-000NN-of-000096.safetensors (layer L in\n"
      "shard L+1, the embedding, lm_head and final norms in 94), and in shards 95-96 168\n"
      "vision_tower.*/mm_projector.* tensors, so the index lists 497,220 tensors (497,052 of\n"
      "the language model) with the release's metadata.total_size. The vision names and shapes\n"
      "are placeholders; the engine ignores them.\n"
      "--sparse writes headers only and leaves the tensor data as file holes, which read as\n"
      "zeros (full: 1.56 TB apparent, ~140 MB on disk; a zero E8M0 scale is 2^-127, legal,\n"
      "unlike the 0xFF NaN code). A sparse checkpoint tests opening, planning, RSS and the\n"
      "compute path at real dimensions, not arithmetic and not disk speed.\n"
      "--single-file writes the language model as one model.safetensors, no index.\n"
      "--weights gaussian draws the weight matrices and the embedding from a normal\n"
      "distribution, as trained weights are, instead of uniform values of the same RMS: the BF16\n"
      "exponent field then has ~2.54 bits of entropy per tensor (~2.7 over the slice; ~2.6 is\n"
      "published for trained LLMs; uniform gives ~2.0-2.3 per tensor), so that compressing the\n"
      "bytes measures what it would on a real checkpoint. The default for slice and full;\n"
      "tiny, demo and bench stay uniform. The entropy of what was written is printed at the end.\n"
      "--set key=value overrides a config key (repeatable); a list keeps its commas:\n"
      "--set full_attn_layers=4,8 --set hidden_size=256.",
      kSynth,
      RunSynth};
  return kCommand;
}

}  // namespace k3::cli
