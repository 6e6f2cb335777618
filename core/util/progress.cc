#include "core/util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace k3 {

bool StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.2f %s", bytes, units[u]);
}

ProgressBar::ProgressBar(std::string label, uint64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      total_(std::max<uint64_t>(total, 1)),
      unit_(std::move(unit)),
      enabled_(enabled),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::seconds(1)) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done) {
  if (!enabled_ || finished_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;  // at most 10 redraws a second
  last_draw_ = now;
  Draw(done, false);
}

void ProgressBar::Finish(uint64_t done) {
  if (!enabled_ || finished_) return;
  finished_ = true;
  Draw(done, true);
}

void ProgressBar::Draw(uint64_t done, bool final) {
  constexpr int kWidth = 30;
  done = std::min(done, total_);
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const int filled = static_cast<int>(frac * kWidth);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string amount, rate;
  if (unit_ == "B") {
    amount =
        FormatBytes(static_cast<double>(done)) + " / " + FormatBytes(static_cast<double>(total_));
    if (secs > 0) rate = FormatBytes(static_cast<double>(done) / secs) + "/s";
  } else {
    amount = absl::StrFormat("%d / %d %s", done, total_, unit_);
    if (secs > 0) rate = absl::StrFormat("%.1f %s/s", static_cast<double>(done) / secs, unit_);
  }
  std::string eta;
  if (!final && done > 0) eta = absl::StrFormat(" ETA %.0fs", secs * (1 - frac) / frac);
  std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %s %s%s%s", label_.c_str(),
               std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(),
               frac * 100, amount.c_str(), rate.c_str(), eta.c_str(), final ? "\n" : "\x1b[K");
  std::fflush(stderr);
}

}  // namespace k3
