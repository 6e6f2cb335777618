// k3 stripe: copy the routed experts striped over several directories, one per drive
// (core/checkpoint/stripe.h).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "apps/commands/commands.h"
#include "apps/options/flags.h"
#include "apps/reports/disk_rate.h"
#include "apps/reports/tables.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/stripe.h"
#include "core/util/progress.h"
#include "io/file.h"

namespace k3::cli {
namespace {

constexpr char kStripeName[] = "stripe";
double StripeSecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string StripeRate(double bytes_per_second) {
  return absl::StrCat(FormatBytes(bytes_per_second), "/s");
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f %%", 100 * fraction); }

// Progress bars that follow the phases WriteStripes and VerifyStripes report.
class PhaseBars {
 public:
  void Update(std::string_view phase, uint64_t done, uint64_t total) {
    if (bar_ == nullptr || phase != phase_) {
      if (bar_ != nullptr) bar_->Finish();
      phase_ = std::string(phase);
      bar_ = std::make_unique<ProgressBar>(phase_, total, "B", ShowProgress());
    }
    bar_->Update(done);
  }
  void Finish() {
    if (bar_ != nullptr) bar_->Finish();
  }

 private:
  std::string phase_;
  std::unique_ptr<ProgressBar> bar_;
};

// Measures the directory's read rate as k3 doctor does where it has no model: random 16 MiB
// reads of a scratch file written there, which is deleted after.
absl::StatusOr<ReadRate> MeasureDirectory(const std::string& dir) {
  auto path = WriteScratchFile(dir, "k3-stripe-measure");
  if (!path.ok()) return path.status();
  auto rate = MeasureReads(*path);
  ::unlink(path->c_str());
  return rate;
}

absl::StatusOr<std::vector<double>> MeasureWeights(const std::vector<std::string>& dirs) {
  std::vector<double> weights;
  MarkdownTable table({"directory", "read rate", "reads"}, {false, true, false});
  for (const std::string& dir : dirs) {
    if (!absl::GetFlag(FLAGS_quiet)) {
      std::fprintf(stderr, "k3 stripe: measuring %s (%s scratch file, %.1f s of reads)\n",
                   dir.c_str(), FormatBytes(static_cast<double>(kScratchBytes)).c_str(),
                   kMeasureSeconds);
    }
    auto rate = MeasureDirectory(dir);
    if (!rate.ok()) return rate.status();
    if (rate->bytes_per_second <= 0) {
      return absl::InternalError(absl::StrCat("measuring ", dir, ": no reads completed"));
    }
    weights.push_back(rate->bytes_per_second / 1e9);  // GB/s, as the manifest records them
    table.AddRow(
        {dir, StripeRate(rate->bytes_per_second),
         rate->direct ? "O_DIRECT" : "buffered (O_DIRECT refused: the page cache's rate)"});
  }
  if (!absl::GetFlag(FLAGS_quiet)) std::printf("%s\n", table.text().c_str());
  return weights;
}

absl::StatusOr<std::vector<double>> ParseWeights(const std::string& text, size_t dirs) {
  std::vector<double> weights;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    double w = 0;
    if (!absl::SimpleAtod(piece, &w) || !std::isfinite(w) || w <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--weights ", text, ": '", piece, "' is not a positive number"));
    }
    weights.push_back(w);
  }
  if (weights.size() != dirs) {
    return absl::InvalidArgumentError(absl::StrCat("--weights ", text, ": ", weights.size(),
                                                   " weights for ", dirs, " --out directories"));
  }
  return weights;
}

void PrintPlan(const StripePlan& plan, const std::vector<std::string>& dirs) {
  // With copies the shares are of the striped experts (one copy each), so they add up to K.
  const bool copies = plan.copies > 1;
  std::vector<std::string> head = {"directory", "weight", "of the weights"};
  if (copies) head.push_back("target");
  for (const char* h : {"bytes", "share", "layer share min", "layer share max"}) head.push_back(h);
  std::vector<bool> right(head.size(), true);
  right[0] = false;
  MarkdownTable table(head, right);
  const std::vector<StripeShare> shares = StripeShares(plan);
  for (size_t d = 0; d < dirs.size(); ++d) {
    const StripeShare& s = shares[d];
    std::vector<std::string> row = {dirs[d], absl::StrFormat("%.4g", plan.weights[d]),
                                    Percent(s.weight_share)};
    if (copies) row.push_back(Percent(s.target));
    row.push_back(FormatBytes(static_cast<double>(s.bytes)));
    row.push_back(Percent(s.share));
    row.push_back(absl::StrCat(Percent(s.min_layer_share), " (layer ", s.min_layer, ")"));
    row.push_back(absl::StrCat(Percent(s.max_layer_share), " (layer ", s.max_layer, ")"));
    table.AddRow(row);
  }
  std::printf("%s", table.text().c_str());
  if (copies) {
    std::printf(
        "each expert in %d directories; target and shares are of the striped experts' bytes\n",
        plan.copies);
  }
  if (plan.layout == StripeLayout::kSlices) {
    std::printf("each expert cut into one piece per directory, sized by the weights\n");
  }
  if (plan.unstriped > 0) {
    std::printf("%lld routed experts are not one contiguous span and stay in the shards only\n",
                static_cast<long long>(plan.unstriped));
  }
  std::printf("\n");
}

// Directories on one file system share its drive's bandwidth: striping over them gains nothing.
void NoteSharedDevices(const std::vector<std::string>& dirs) {
  std::map<dev_t, std::vector<std::string>> by_device;
  for (const std::string& dir : dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) by_device[st.st_dev].push_back(dir);
  }
  for (const auto& [device, group] : by_device) {
    if (group.size() < 2) continue;
    std::fprintf(stderr,
                 "k3 stripe: note: %s are on one file system: their stripes share its drive's "
                 "bandwidth\n",
                 absl::StrJoin(group, ", ").c_str());
  }
}

int RunStripeVerify(const Checkpoint& ckpt, const std::vector<std::string>& dirs) {
  const auto start = std::chrono::steady_clock::now();
  auto extents = LoadStripes(ckpt, dirs);
  if (!extents.ok()) return ReportError(kStripeName, extents.status());
  if (extents->empty()) {
    return ReportError(kStripeName, absl::NotFoundError(absl::StrCat(
                                        "none of ", absl::GetFlag(FLAGS_out), " holds stripes (",
                                        kStripeManifestFile, " not found)")));
  }
  PhaseBars bars;
  absl::Status s = VerifyStripes(
      ckpt, dirs, [&](uint64_t done, uint64_t total) { bars.Update("verify", done, total); });
  bars.Finish();
  if (!s.ok()) return ReportError(kStripeName, s);
  uint64_t bytes = 0;
  for (const StripeExtent& e : *extents) bytes += e.length;
  const double seconds = StripeSecondsSince(start);
  if (!absl::GetFlag(FLAGS_quiet)) {
    std::fprintf(stderr, "k3 stripe: %zu extents, %s, CRC-32C verified in %.2f s (%s)\n",
                 extents->size(), FormatBytes(static_cast<double>(bytes)).c_str(), seconds,
                 StripeRate(bytes / std::max(seconds, 1e-9)).c_str());
  }
  return kExitOk;
}

int RunStripeWrite(const Checkpoint& ckpt, const std::vector<std::string>& dirs,
                   StripeLayout layout) {
  if (!absl::GetFlag(FLAGS_force)) {
    for (const std::string& dir : dirs) {
      if (io::FileExists(io::JoinPath(dir, kStripeManifestFile)) ||
          io::FileExists(io::JoinPath(dir, kStripeDataFile))) {
        return UsageError(kStripeName,
                          absl::StrCat(dir, " already holds stripes (", kStripeDataFile, " or ",
                                       kStripeManifestFile, "); pass --force to overwrite them"));
      }
    }
  }
  for (const std::string& dir : dirs) {
    if (absl::Status s = io::MakeDirectories(dir); !s.ok()) return ReportError(kStripeName, s);
  }
  if (!absl::GetFlag(FLAGS_quiet)) NoteSharedDevices(dirs);
  const std::string weights_text = absl::GetFlag(FLAGS_weights);
  auto weights =
      weights_text.empty() ? MeasureWeights(dirs) : ParseWeights(weights_text, dirs.size());
  if (!weights.ok()) return ReportError(kStripeName, weights.status());
  auto plan = PlanStripes(ckpt, *weights, absl::GetFlag(FLAGS_copies), layout);
  if (!plan.ok()) return ReportError(kStripeName, plan.status());
  if (!absl::GetFlag(FLAGS_quiet)) PrintPlan(*plan, dirs);

  const auto start = std::chrono::steady_clock::now();
  PhaseBars bars;
  StripeOptions options;
  options.progress = [&](std::string_view phase, uint64_t done, uint64_t total) {
    bars.Update(phase, done, total);
  };
  absl::Status s = WriteStripes(ckpt, *plan, dirs, options);
  bars.Finish();
  if (!s.ok()) return ReportError(kStripeName, s);
  if (!absl::GetFlag(FLAGS_quiet)) {
    const double seconds = StripeSecondsSince(start);
    const uint64_t bytes = plan->TotalBytes();
    std::fprintf(stderr,
                 "k3 stripe: wrote %lld experts x %d, %s over %zu directories in %.2f s (%s), "
                 "verified (CRC-32C)\n",
                 static_cast<long long>(plan->StripedExperts()), plan->copies,
                 FormatBytes(static_cast<double>(bytes)).c_str(), dirs.size(), seconds,
                 StripeRate(bytes / std::max(seconds, 1e-9)).c_str());
  }
  return kExitOk;
}

int RunStripe(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kStripeName, "unexpected argument " + positional[0]);
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty()) return UsageError(kStripeName, "--model DIR is required");
  if (out.empty()) return UsageError(kStripeName, "--out DIR1,DIR2,... is required");
  std::vector<std::string> dirs = absl::StrSplit(out, ',');
  if (std::any_of(dirs.begin(), dirs.end(), [](const std::string& d) { return d.empty(); })) {
    return UsageError(kStripeName, absl::StrCat("--out ", out, ": an empty directory name"));
  }
  if (dirs.size() > static_cast<size_t>(kMaxStripeDirectories)) {
    return UsageError(kStripeName, absl::StrCat("--out: at most ", kMaxStripeDirectories,
                                                " directories, not ", dirs.size()));
  }
  const bool verify_only = absl::GetFlag(FLAGS_verify_only);
  const int copies = absl::GetFlag(FLAGS_copies);
  if (copies < 1 || copies > static_cast<int>(dirs.size())) {
    return UsageError(kStripeName, absl::StrCat("--copies ", copies,
                                                ": each expert's copies go "
                                                "to distinct --out directories, so 1 to ",
                                                dirs.size()));
  }
  if (absl::GetFlag(FLAGS_measure) && !absl::GetFlag(FLAGS_weights).empty()) {
    return UsageError(kStripeName, "--measure and --weights exclude each other");
  }
  if (verify_only && (absl::GetFlag(FLAGS_measure) || !absl::GetFlag(FLAGS_weights).empty())) {
    return UsageError(kStripeName,
                      "--verify-only writes nothing: --weights and --measure do "
                      "not apply");
  }
  // Slices balance every read over the drives; whole experts only with copies to balance.
  const std::string layout_text = absl::GetFlag(FLAGS_layout);
  auto layout = layout_text.empty()
                    ? absl::StatusOr<StripeLayout>(copies > 1 ? StripeLayout::kExperts
                                                              : StripeLayout::kSlices)
                    : ParseStripeLayout(layout_text);
  if (!layout.ok())
    return UsageError(kStripeName, absl::StrCat("--layout: ", layout.status().message()));
  if (*layout == StripeLayout::kSlices && copies > 1) {
    return UsageError(kStripeName, absl::StrCat("--copies ", copies,
                                                " needs --layout experts: a sliced layout has "
                                                "one piece of each expert on every directory"));
  }
  auto ckpt = Checkpoint::Open(model);
  if (!ckpt.ok()) return ReportError(kStripeName, ckpt.status());
  return verify_only ? RunStripeVerify(**ckpt, dirs) : RunStripeWrite(**ckpt, dirs, *layout);
}

}  // namespace

const Subcommand& StripeCommand() {
  static const Subcommand kCommand = {
      kStripeName,
      "copy the routed experts striped over several drives, every layer on every drive",
      "stripe --model DIR --out DIR1,DIR2,... [--weights W1,W2,... | --measure] "
      "[--layout slices|experts] [--copies K] [--force] [--quiet] [--verify-only]",
      "Copies the routed experts of the checkpoint over the --out directories (one per drive),\n"
      "so that each MoE layer's experts are on every drive in proportion to its weight. The\n"
      "default layout, slices, cuts every expert into one piece per directory, each piece its\n"
      "weight's share of the expert (cuts at 4 KiB boundaries): reading any expert keeps every\n"
      "drive busy for the same time, whichever experts a token routes to. --layout experts\n"
      "deals whole experts instead (a directory's share of each layer is its weight's share\n"
      "within one expert, consecutive ids alternating directories); a token's 16 experts of a\n"
      "layer then fall on the drives unevenly, which --copies balances. Each directory gets\n"
      "k3-experts.stripe (its pieces or experts, each at the same offset modulo 4096 as in its\n"
      "shard, so an O_DIRECT read needs the same blocks) and k3-stripe.json (the config\n"
      "fingerprint, the weights, the layout and, per shard, each extent's offset, length, place\n"
      "in the data file and CRC-32C). The directories are\n"
      "written in parallel, read back and checked before any manifest is written; an\n"
      "interrupted or failed run leaves no stripes that k3 accepts. The shards are not changed:\n"
      "the stripes are copies. Experts whose parts are not one contiguous span stay in the\n"
      "shards only. Give the directories to a run with --volume: the engine reads each striped\n"
      "expert from the drives that hold it. --copies K (default 1; layout experts) writes each\n"
      "expert to K distinct directories, each holding about K x its weight's share of every layer "
      "(capped\n"
      "at every expert): the engine then reads each expert from whichever holder finishes\n"
      "first, so a layer's 16 routed experts no longer pile up on one drive. It costs space: K/N\n"
      "of the experts per drive for N equal weights. Without --weights each directory's read\n"
      "rate is measured on a 128 MiB scratch file (written, read with O_DIRECT for a few\n"
      "seconds, deleted) and used as its weight. Existing stripes are kept unless --force is\n"
      "given. --verify-only writes nothing and checks every extent of the stripes in --out\n"
      "against its CRC-32C (exit 1 on a mismatch, naming the data file and the offset).\n"
      "Format: docs/STORAGE.md, \"Striped layout\".",
      kStripe,
      RunStripe};
  return kCommand;
}

}  // namespace k3::cli
