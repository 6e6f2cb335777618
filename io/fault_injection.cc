#include "io/fault_injection.h"

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "io/tsan_mutex.h"

namespace k3::io {

FaultPlan& FaultPlan::FailAttempts(int64_t first, int count, int err) {
  AnnotatedMutexLock lock(&mu_);
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
  AnnotatedMutexLock lock(&mu_);
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
  AnnotatedMutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kShortReads;
  rule.first = first;
  rule.count = count;
  rule.max_bytes = max_bytes;
  rules_.push_back(rule);
  return *this;
}

FaultPlan& FaultPlan::Slow(absl::Duration delay) {
  AnnotatedMutexLock lock(&mu_);
  delay_ = delay;
  return *this;
}

FaultPlan& FaultPlan::RefuseDirect() {
  AnnotatedMutexLock lock(&mu_);
  refuse_direct_ = true;
  return *this;
}

FaultPlan& FaultPlan::Hold(int64_t first, int count) {
  AnnotatedMutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kHold;
  rule.first = first;
  rule.count = count;
  rules_.push_back(rule);
  return *this;
}

bool FaultPlan::AwaitHeld(int n, absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ >= n; };
  return AwaitWithTimeout(mu_, absl::Condition(&enough), timeout);
}

void FaultPlan::Release() {
  AnnotatedMutexLock lock(&mu_);
  released_ = true;
  held_ = 0;
  for (auto& [id, on_release] : listeners_) on_release();
}

int FaultPlan::AddReleaseListener(std::function<void()> on_release) {
  AnnotatedMutexLock lock(&mu_);
  listeners_.emplace(next_listener_, std::move(on_release));
  return next_listener_++;
}

void FaultPlan::RemoveReleaseListener(int id) {
  AnnotatedMutexLock lock(&mu_);
  listeners_.erase(id);
}

bool FaultPlan::Covers(const Rule& rule, int64_t attempt) const {
  return attempt >= rule.first && (rule.count < 0 || attempt < rule.first + rule.count);
}

FaultPlan& FaultPlan::FailFile(const std::string& path_suffix, int err, int64_t first) {
  AnnotatedMutexLock lock(&mu_);
  Rule rule;
  rule.kind = Kind::kFailFile;
  rule.first = first;
  rule.err = err;
  rule.path_suffix = path_suffix;
  rules_.push_back(rule);
  return *this;
}

bool FaultPlan::Matches(Rule& rule, int64_t attempt, const std::string& path, uint64_t offset,
                        uint64_t length) {
  const auto ends_with = [&path](const std::string& suffix) {
    return suffix.size() <= path.size() &&
           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (rule.kind == Kind::kFailFile) return attempt >= rule.first && ends_with(rule.path_suffix);
  if (rule.kind == Kind::kRandom) {
    // splitmix64 of (seed, attempt): uniform, reproducible, no shared generator state.
    uint64_t z = rule.seed + static_cast<uint64_t>(attempt) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53 < rule.probability;
  }
  if (rule.kind != Kind::kFailAtOffset) return Covers(rule, attempt);
  if (rule.count == 0 || rule.offset < offset || rule.offset >= offset + length) return false;
  if (!ends_with(rule.path_suffix)) return false;
  if (rule.count > 0) --rule.count;
  return true;
}

FaultPlan& FaultPlan::FailRandomly(double probability, int err, uint64_t seed) {
  AnnotatedMutexLock lock(&mu_);
  Rule r;
  r.kind = Kind::kRandom;
  r.err = err;
  r.probability = probability;
  r.seed = seed;
  rules_.push_back(r);
  return *this;
}

absl::StatusOr<std::shared_ptr<FaultPlan>> FaultPlan::Parse(const std::string& spec) {
  auto plan = std::make_shared<FaultPlan>();
  double probability = -1;
  uint64_t seed = 1;
  int64_t from = 1;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string& key = kv.first;
    if (key == "eio-file" || key == "gone-file") {
      if (kv.second.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("fault spec '", spec, "': '", std::string(item), "' needs a file"));
      }
      plan->FailFile(kv.second, key == "eio-file" ? EIO : ENOENT, from);
      continue;
    }
    double number = 0;
    if (!absl::SimpleAtod(kv.second, &number) || number < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault spec '", spec, "': '", std::string(item), "' needs a number"));
    }
    if (key == "random") {
      probability = number;
    } else if (key == "from") {
      from = static_cast<int64_t>(number);
    } else if (key == "seed") {
      seed = static_cast<uint64_t>(number);
    } else if (key == "eio-attempt") {
      plan->FailAttempts(static_cast<int64_t>(number), 1, EIO);
    } else if (key == "eio-offset") {
      plan->FailAtOffset(static_cast<uint64_t>(number), EIO);
    } else if (key == "short") {
      plan->ShortReads(static_cast<uint64_t>(number));
    } else if (key == "slow") {
      plan->Slow(absl::Milliseconds(number));
    } else if (key == "no-direct") {
      if (number > 0) plan->RefuseDirect();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("fault spec '", spec, "': unknown key '", key, "'"));
    }
  }
  if (probability >= 0) plan->FailRandomly(probability, EIO, seed);
  return plan;
}

FaultPlan::Outcome FaultPlan::Apply(const std::string& path, uint64_t offset, uint64_t length,
                                    int64_t result) {
  AnnotatedMutexLock lock(&mu_);
  const int64_t attempt = ++attempts_;
  Outcome out{result, delay_};
  for (const Rule& rule : rules_) {
    if (rule.kind == Kind::kHold && !released_ && Covers(rule, attempt)) out.held = true;
  }
  held_ += out.held;
  if (result < 0) return out;  // a real error stays what it is
  for (Rule& rule : rules_) {
    if (rule.kind == Kind::kHold || !Matches(rule, attempt, path, offset, length)) continue;
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
  AnnotatedMutexLock lock(&mu_);
  return refuse_direct_;
}

int64_t FaultPlan::attempts() const {
  AnnotatedMutexLock lock(&mu_);
  return attempts_;
}

int64_t FaultPlan::injected() const {
  AnnotatedMutexLock lock(&mu_);
  return injected_;
}

}  // namespace k3::io
