// k3 pack: copy a checkpoint's trunk into one file laid out for streaming
// (core/checkpoint/trunk_pack.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/commands/commands.h"
#include "apps/options/flags.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/util/progress.h"
#include "io/file.h"

namespace k3::cli {
namespace {

constexpr char kPackName[] = "pack";

std::string Rate(uint64_t bytes, double seconds) {
  return absl::StrCat(FormatBytes(bytes / std::max(seconds, 1e-9)), "/s");
}

int RunVerifyOnly(const Checkpoint& ckpt, const std::string& out) {
  const auto start = std::chrono::steady_clock::now();
  auto pack = TrunkPack::Open(out, ckpt);
  if (!pack.ok()) return ReportError(kPackName, pack.status());
  uint64_t total = 0;
  std::unique_ptr<ProgressBar> live;  // created at the first report, which brings the total
  absl::Status s = VerifyTrunkPack(ckpt, **pack, [&](uint64_t done, uint64_t all) {
    if (!live) live = std::make_unique<ProgressBar>("verify", all, "B", ShowProgress());
    live->Update(done);
    total = all;
  });
  if (live) live->Finish();
  if (!s.ok()) return ReportError(kPackName, s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!absl::GetFlag(FLAGS_quiet)) {
    std::fprintf(stderr, "k3 pack: %s: %lld tensors, %s in %.2f s (%s), verified byte-exact\n",
                 (*pack)->pack_path().c_str(), static_cast<long long>((*pack)->tensor_count()),
                 FormatBytes(static_cast<double>(total)).c_str(), seconds,
                 Rate(total, seconds).c_str());
  }
  return kExitOk;
}

int RunWrite(const Checkpoint& ckpt, const std::string& out) {
  const bool exists = io::FileExists(absl::StrCat(out, "/", kTrunkManifestFile)) ||
                      io::FileExists(absl::StrCat(out, "/", kTrunkPackFile));
  if (exists && !absl::GetFlag(FLAGS_force)) {
    return UsageError(kPackName,
                      absl::StrCat(out, " already holds a trunk pack (", kTrunkPackFile, " or ",
                                   kTrunkManifestFile, "); pass --force to overwrite it"));
  }
  PackOptions options;
  options.show_progress = ShowProgress();
  options.codec = absl::GetFlag(FLAGS_codec);
  const auto& codecs = PackCodecNames();
  if (!options.codec.empty() &&
      std::find(codecs.begin(), codecs.end(), options.codec) == codecs.end()) {
    return UsageError(kPackName, absl::StrCat("--codec ", options.codec,
                                              ": unknown codec (one of: ", codecs.front(), ")"));
  }
  auto result = WriteTrunkPack(ckpt, out, options);
  if (!result.ok()) return ReportError(kPackName, result.status());
  if (!absl::GetFlag(FLAGS_quiet)) {
    const std::string ratio =
        options.codec.empty()
            ? std::string()
            : absl::StrFormat(" (%s, %.3f of the tensors' %s)", options.codec,
                              static_cast<double>(result->bytes) / result->tensor_bytes,
                              FormatBytes(static_cast<double>(result->tensor_bytes)));
    std::fprintf(stderr,
                 "k3 pack: wrote %lld tensors, %s%s to %s/%s in %.2f s (%s), verified "
                 "byte-exact\n",
                 static_cast<long long>(result->tensors),
                 FormatBytes(static_cast<double>(result->bytes)).c_str(), ratio.c_str(),
                 out.c_str(), kTrunkPackFile, result->seconds,
                 Rate(result->tensor_bytes, result->seconds).c_str());
  }
  return kExitOk;
}

int RunPack(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kPackName, "unexpected argument " + positional[0]);
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty()) return UsageError(kPackName, "--model DIR is required");
  if (out.empty()) return UsageError(kPackName, "--out DIR is required");
  auto ckpt = Checkpoint::Open(model);
  if (!ckpt.ok()) return ReportError(kPackName, ckpt.status());
  return absl::GetFlag(FLAGS_verify_only) ? RunVerifyOnly(**ckpt, out) : RunWrite(**ckpt, out);
}

}  // namespace

const Subcommand& PackCommand() {
  static const Subcommand kCommand = {
      kPackName,
      "copy the trunk into one file laid out for streaming, verified byte-exact",
      "pack --model DIR --out DIR [--codec bf16-e3] [--force] [--quiet] [--verify-only]",
      "Copies every non-expert tensor of the checkpoint (attention, shared experts, router,\n"
      "latent projections, norms, embedding, lm_head) into DIR/trunk.pack: one 4 KiB-aligned\n"
      "run per layer plus one for the global tensors, bytes unchanged, so a layer's trunk is\n"
      "one large O_DIRECT read. DIR/trunk.json records each tensor's offset, length and\n"
      "CRC-32C. The pack is re-read and verified byte-exact against the checkpoint before\n"
      "trunk.json is written; an interrupted or failed run leaves no pack that k3 accepts.\n"
      "The engine never needs a pack: it runs from the checkpoint as released. An existing\n"
      "pack is kept unless --force is given. --verify-only writes nothing and re-checks an\n"
      "existing pack (exit 1 on a mismatch, naming the tensor and the offset).\n"
      "--codec bf16-e3 stores each BF16 matrix (but the embedding) in blocks of whole rows,\n"
      "about 4 MiB decoded, each 4 KiB-aligned with an XXH3-64 checksum, ~0.7 of the bytes;\n"
      "the engine decodes them exactly as they arrive (docs/PACK.md).\n"
      "Format: docs/PACK.md.",
      kPack,
      RunPack};
  return kCommand;
}

}  // namespace k3::cli
