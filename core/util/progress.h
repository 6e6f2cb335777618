// A one-line progress bar on stderr for long work (synth, pack, trunk loads, long prefill).
// Silent when stderr is not a terminal or when disabled (--quiet).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace k3 {

bool StderrIsTerminal();

class ProgressBar {
 public:
  // `total` in units of `unit` ("B" formats as bytes with a rate; anything else as a count).
  ProgressBar(std::string label, uint64_t total, std::string unit, bool enabled);
  ~ProgressBar();
  void Update(uint64_t done);
  void Finish() { Finish(total_); }
  // Ends the line at `done`: work stopped short (an interrupt) is not drawn as complete.
  void Finish(uint64_t done);

 private:
  void Draw(uint64_t done, bool final);

  std::string label_;
  uint64_t total_;
  std::string unit_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// "1.23 GB", "512.0 MB", "4.0 KB", "12 B" (decimal units, as disk vendors and fio use).
std::string FormatBytes(double bytes);

}  // namespace k3
