// How long Checkpoint::Open takes on the full-size Kimi K3 layout and how much resident memory
// the opened index keeps. It synthesises `k3 synth --preset full --sparse` twice in a temporary
// directory (96 shards with the index, and the language model in one model.safetensors: ~210 MB
// of disk for 3.1 TB apparent), opens each several times, each time in a fresh process (so
// that no run inherits another's heap), prints the medians and deletes the directory.
//
//   k3_open_bench [--runs N] [--keep] [--model DIR ...]
//
// --model times existing checkpoints instead (the release, say). The headers are in the page
// cache (just written); a cold cache adds the time to read ~136 MB from the disk.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/util/median.h"
#include "core/util/proc_fields.h"
#include "core/util/progress.h"
#include "core/synth/synth.h"

namespace k3 {
namespace {

uint64_t StatusKb(std::string_view field) { return ProcField("/proc/self/status", field) / 1024; }

struct Run {
  double seconds = 0;
  double rss_mb = 0;   // resident growth while the checkpoint is open
  double peak_mb = 0;  // high-water growth during Open
  size_t tensors = 0;
};

// The child's side: one Open, one line of figures on stdout.
int OpenOnce(const std::string& dir) {
  const uint64_t rss0 = StatusKb("VmRSS"), hwm0 = StatusKb("VmHWM");
  const auto start = std::chrono::steady_clock::now();
  auto ckpt = Checkpoint::Open(dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!ckpt.ok()) {
    std::fprintf(stderr, "k3_open_bench: %s\n", std::string(ckpt.status().message()).c_str());
    return 1;
  }
  const uint64_t rss1 = StatusKb("VmRSS"), hwm1 = StatusKb("VmHWM");
  std::printf("%.6f %.3f %.3f %zu\n", seconds, (rss1 - rss0) / 1024.0,
              (std::max(hwm1, hwm0) - hwm0) / 1024.0, (*ckpt)->tensors().size());
  return 0;
}

bool RunChild(const std::string& dir, Run* out) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/proc/self/exe", "k3_open_bench", "--open-once", dir.c_str(),
            static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  char buf[256] = {};
  size_t got = 0;
  ssize_t n;
  while (got + 1 < sizeof buf && (n = ::read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) {
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  return std::sscanf(buf, "%lf %lf %lf %zu", &out->seconds, &out->rss_mb, &out->peak_mb,
                     &out->tensors) == 4;
}

bool Measure(const std::string& label, const std::string& dir, int runs) {
  std::vector<double> seconds, rss, peak;
  size_t tensors = 0;
  for (int i = 0; i < runs; ++i) {
    Run r;
    if (!RunChild(dir, &r)) {
      std::fprintf(stderr, "k3_open_bench: opening %s failed\n", dir.c_str());
      return false;
    }
    seconds.push_back(r.seconds);
    rss.push_back(r.rss_mb);
    peak.push_back(r.peak_mb);
    tensors = r.tensors;
  }
  std::printf("%-22s %9zu %10.3f %8.3f %8.3f %12.1f %12.1f\n", label.c_str(), tensors,
              Median(seconds), *std::min_element(seconds.begin(), seconds.end()),
              *std::max_element(seconds.begin(), seconds.end()), Median(rss), Median(peak));
  return true;
}

bool Synth(const std::string& dir, bool single_file) {
  SynthOptions opt;
  opt.preset = "full";
  opt.out_dir = dir;
  opt.sparse = true;
  opt.single_file = single_file;
  auto r = Synthesize(opt);
  if (!r.ok()) {
    std::fprintf(stderr, "k3_open_bench: %s\n", std::string(r.status().message()).c_str());
    return false;
  }
  std::printf("synthesised %s: %d %s, %s apparent, in %.2f s\n", dir.c_str(), r->shards,
              single_file ? "file" : "shards", FormatBytes(r->bytes_written).c_str(), r->seconds);
  return true;
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--open-once") == 0) return OpenOnce(argv[2]);
  int runs = 5;
  bool keep = false;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--keep") == 0) {
      keep = true;
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      models.push_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: k3_open_bench [--runs N] [--keep] [--model DIR ...]\n");
      return 2;
    }
  }
  std::string tmp;
  std::vector<std::pair<std::string, std::string>> targets;
  for (const std::string& m : models) targets.emplace_back(m, m);
  if (models.empty()) {
    std::string templ = (std::filesystem::temp_directory_path() / "k3-open-bench-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) return 1;
    tmp = templ;
    if (!Synth(tmp + "/sharded", false) || !Synth(tmp + "/one-file", true)) return 1;
    targets = {{"96 shards + index", tmp + "/sharded"}, {"one file", tmp + "/one-file"}};
  }
  std::printf("\nCheckpoint::Open, %d runs each, each in a fresh process\n", runs);
  std::printf("%-22s %9s %10s %8s %8s %12s %12s\n", "layout", "tensors", "median s", "min s",
              "max s", "RSS +MB", "peak +MB");
  bool ok = true;
  for (const auto& [label, dir] : targets) ok = Measure(label, dir, runs) && ok;
  if (!tmp.empty()) {
    if (keep) {
      std::printf("kept %s\n", tmp.c_str());
    } else {
      std::filesystem::remove_all(tmp);
    }
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) { return k3::Main(argc, argv); }
