#include "io/fault_injection.h"

namespace k3::io {

FaultPlan& FaultPlan::FailAttempts(int64_t first, int count, int err) {
  absl::MutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kFailAttempts;
  rule.first = first;
  rule.count = count;
  rule.err = err;
  rules_.push_back(rule);
  return *this;
}

FaultPlan& FaultPlan::FailAtOffset(uint64_t offset, int err, int count,
                                   const std::string& path_suffix) {
  absl::MutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kFailAtOffset;
  rule.count = count;
  rule.err = err;
  rule.offset = offset;
  rule.path_suffix = path_suffix;
  rules_.push_back(rule);
  return *this;
}

FaultPlan& FaultPlan::ShortReads(uint64_t max_bytes, int64_t first, int count) {
  absl::MutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kShortReads;
  rule.first = first;
  rule.count = count;
  rule.max_bytes = max_bytes;
  rules_.push_back(rule);
  return *this;
}

FaultPlan& FaultPlan::Slow(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  delay_ = delay;
  return *this;
}

FaultPlan& FaultPlan::RefuseDirect() {
  absl::MutexLock lock(&mu_);
  refuse_direct_ = true;
  return *this;
}

bool FaultPlan::Covers(const Rule& rule, int64_t attempt) const {
  return attempt >= rule.first && (rule.count < 0 || attempt < rule.first + rule.count);
}

bool FaultPlan::Matches(Rule& rule, int64_t attempt, const std::string& path, uint64_t offset,
                        uint64_t length) {
  if (rule.kind != Kind::kFailAtOffset) return Covers(rule, attempt);
  if (rule.count == 0 || rule.offset < offset || rule.offset >= offset + length) return false;
  const std::string& suffix = rule.path_suffix;
  if (suffix.size() > path.size() ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  if (rule.count > 0) --rule.count;
  return true;
}

FaultPlan::Outcome FaultPlan::Apply(const std::string& path, uint64_t offset, uint64_t length,
                                    int64_t result) {
  absl::MutexLock lock(&mu_);
  const int64_t attempt = ++attempts_;
  Outcome out{result, delay_};
  if (result < 0) return out;  // a real error stays what it is
  for (Rule& rule : rules_) {
    if (!Matches(rule, attempt, path, offset, length)) continue;
    if (rule.kind == Kind::kShortReads) {
      if (out.result > static_cast<int64_t>(rule.max_bytes)) {
        out.result = static_cast<int64_t>(rule.max_bytes);
        ++injected_;
      }
      continue;
    }
    out.result = -rule.err;
    ++injected_;
    break;
  }
  return out;
}

bool FaultPlan::refuses_direct() const {
  absl::MutexLock lock(&mu_);
  return refuse_direct_;
}

int64_t FaultPlan::attempts() const {
  absl::MutexLock lock(&mu_);
  return attempts_;
}

int64_t FaultPlan::injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

}  // namespace k3::io
