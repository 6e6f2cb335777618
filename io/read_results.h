// What the read engine and the read router share about requests and their results: the check
// of a request's buffer, the results waiting to be claimed (Wait, Poll, WaitAny), and a read log
// in the order the reads were asked for. Not for use outside io/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/reads.h"

namespace k3::io::internal {

// OK, or InvalidArgument for a buffer that is not 4 KiB-aligned or too small for the read.
inline absl::Status CheckReadBuffer(const ReadRequest& request) {
  const AlignedExtent extent = ExtentFor(request.offset, request.length);
  if (reinterpret_cast<uintptr_t>(request.buffer.data()) % kDirectAlignment != 0) {
    return absl::InvalidArgumentError("read buffer is not 4 KiB-aligned");
  }
  if (request.buffer.size() < extent.aligned_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read buffer of ", request.buffer.size(), " bytes is too small: ", request.length,
        " bytes at offset ", request.offset, " need ", extent.aligned_length));
  }
  return absl::OkStatus();
}

// Results of requests without a callback, until claimed: by id (Wait) or oldest first (Poll,
// WaitAny). Not thread-safe: its owner's lock guards it.
class UnclaimedResults {
 public:
  void Add(ReadResult result) {
    order_.push_back(result.id);
    results_.emplace(result.id, std::move(result));
  }
  bool contains(ReadId id) const { return results_.contains(id); }
  bool empty() const { return results_.empty(); }
  std::optional<ReadResult> Claim(ReadId id) {
    auto it = results_.find(id);
    if (it == results_.end()) return std::nullopt;
    ReadResult result = std::move(it->second);
    results_.erase(it);
    return result;
  }
  std::optional<ReadResult> ClaimOldest() {
    while (!order_.empty()) {
      const ReadId id = order_.front();
      order_.pop_front();
      if (auto result = Claim(id)) return result;  // else claimed by id already
    }
    return std::nullopt;
  }

 private:
  absl::flat_hash_map<ReadId, ReadResult> results_;
  std::deque<ReadId> order_;
};

// A read log recorded as reads completed, in the order they were asked for (ids rise): a replay
// issues them as the run asked for them.
inline std::vector<LoggedRead> InRequestOrder(std::vector<std::pair<ReadId, LoggedRead>> log) {
  std::sort(log.begin(), log.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LoggedRead> reads;
  reads.reserve(log.size());
  for (const auto& entry : log) reads.push_back(entry.second);
  return reads;
}

}  // namespace k3::io::internal
