// Wall time during which at least one of several overlapping activities was going on: the
// disk (some read in flight) or the compute (some expert multiplying). Thread-safe.
#pragma once

#include <chrono>
#include <mutex>

namespace k3 {

// Seconds from `t0` until now.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class BusyClock {
 public:
  void Start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_++ == 0) since_ = Clock::now();
    if (first_ == Clock::time_point{}) first_ = since_;
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) {
      last_ = Clock::now();
      busy_ += last_ - since_;
    }
  }
  // Busy seconds so far, the current busy stretch included.
  double seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::duration total = busy_;
    if (active_ > 0) total += Clock::now() - since_;
    return std::chrono::duration<double>(total).count();
  }
  using Clock = std::chrono::steady_clock;
  // When the first busy stretch began and the last one ended (the epoch: none yet).
  Clock::time_point first_start() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }
  Clock::time_point last_stop() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  mutable std::mutex mu_;
  int active_ = 0;
  Clock::time_point since_, first_, last_;
  Clock::duration busy_{};
};

}  // namespace k3
