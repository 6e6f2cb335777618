// k3 synth: write a random-weight checkpoint in the release layout.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/commands.h"
#include "apps/flags.h"
#include "core/progress.h"
#include "core/synth.h"
#include "io/file.h"

namespace k3::cli {
namespace {

constexpr char kName[] = "synth";

int RunSynth(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kName, "unexpected argument " + positional[0]);
  SynthOptions opt;
  opt.preset = absl::GetFlag(FLAGS_preset).empty() ? "tiny" : absl::GetFlag(FLAGS_preset);
  opt.out_dir = absl::GetFlag(FLAGS_out);
  opt.seed = absl::GetFlag(FLAGS_seed);
  opt.router_skew = absl::GetFlag(FLAGS_router_skew);
  opt.show_progress = ShowProgress();
  if (opt.out_dir.empty()) return UsageError(kName, "--out DIR is required");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f16") {
    opt.floats = SynthFloats::kF16;
  } else if (dtype == "f32") {
    opt.floats = SynthFloats::kF32;
  } else if (dtype != "release") {
    return UsageError(kName, "--dtype must be release, f16 or f32, not '" + dtype + "'");
  }
  for (const std::string& kv : absl::GetFlag(FLAGS_set)) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError(kName, absl::StrCat("--set ", kv, ": expected key=value"));
    }
    opt.overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (io::FileExists(opt.out_dir + "/config.json") && !absl::GetFlag(FLAGS_force)) {
    return UsageError(kName, absl::StrCat(opt.out_dir,
                                          " already holds a model (config.json); pass --force to "
                                          "overwrite it"));
  }
  auto result = Synthesize(opt);
  if (!result.ok()) return ReportError(kName, result.status());
  const ModelConfig& c = result->config;
  if (!absl::GetFlag(FLAGS_quiet)) {
    std::fprintf(stderr,
                 "k3 synth: wrote %s preset (seed %llu) to %s: %d shards, %s in %.2f s (%s/s)\n"
                 "  hidden %lld, %lld layers, vocab %lld, %lld experts top-%lld, expert %s\n",
                 opt.preset.c_str(), static_cast<unsigned long long>(opt.seed), opt.out_dir.c_str(),
                 result->shards, FormatBytes(static_cast<double>(result->bytes_written)).c_str(),
                 result->seconds,
                 FormatBytes(result->bytes_written / std::max(result->seconds, 1e-9)).c_str(),
                 static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_layers),
                 static_cast<long long>(c.vocab_size), static_cast<long long>(c.num_experts),
                 static_cast<long long>(c.num_experts_per_token),
                 FormatBytes(static_cast<double>(c.expert_bytes())).c_str());
  }
  return kExitOk;
}

}  // namespace

const Subcommand& SynthCommand() {
  static const Subcommand kCommand = {
      kName,
      "write a random-weight checkpoint in the release layout",
      "synth --preset tiny|demo|bench --out DIR [--seed N] [--set key=value ...]",
      "Writes a random-weight checkpoint in the released Kimi K3 layout.\n"
      "Nested config.json, one safetensors shard per layer plus one for the embedding and\n"
      "lm_head, model.safetensors.index.json, MXFP4 experts with their six tensors adjacent, and\n"
      "a small tokenizer (tiktoken.model, tokenizer_config.json). The same preset, seed and\n"
      "overrides give the same bytes. Presets: tiny (tests), demo (make run, ~150 MB), bench\n"
      "(real 17.5 MB experts, ~16 GB).",
      {"preset", "out", "seed", "set", "router-skew", "dtype", "force", "quiet"},
      RunSynth};
  return kCommand;
}

}  // namespace k3::cli
