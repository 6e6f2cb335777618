// absl::Mutex made visible to ThreadSanitizer. Debian's Abseil is not built with TSan, so TSan
// cannot see the ordering absl::Mutex provides and would call every access under the lock a
// race. Under TSan, taking the lock acquires and letting it go (also to wait) releases, by hand;
// elsewhere these compile to plain absl::Mutex calls. (tests/tsan.supp covers the one thing an
// annotation cannot reach: absl evaluating a waiter's Condition object inside Unlock.)
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace k3::io {

inline void TsanAcquired(absl::Mutex* mu) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(mu);
#else
  (void)mu;
#endif
}

inline void TsanReleasing(absl::Mutex* mu) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(mu);
#else
  (void)mu;
#endif
}

class ABSL_SCOPED_LOCKABLE AnnotatedMutexLock {
 public:
  explicit AnnotatedMutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
    TsanAcquired(mu_);
  }
  ~AnnotatedMutexLock() ABSL_UNLOCK_FUNCTION() {
    TsanReleasing(mu_);
    mu_->Unlock();
  }
  AnnotatedMutexLock(const AnnotatedMutexLock&) = delete;
  AnnotatedMutexLock& operator=(const AnnotatedMutexLock&) = delete;

 private:
  absl::Mutex* mu_;
};

// mu.Await and friends, with the lock's release and re-acquisition made visible.
inline void Await(absl::Mutex& mu, const absl::Condition& cond) {
  TsanReleasing(&mu);
  mu.Await(cond);
  TsanAcquired(&mu);
}
inline bool AwaitWithTimeout(absl::Mutex& mu, const absl::Condition& cond, absl::Duration timeout) {
  TsanReleasing(&mu);
  const bool met = mu.AwaitWithTimeout(cond, timeout);
  TsanAcquired(&mu);
  return met;
}
inline bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) {
  TsanReleasing(&mu);
  const bool met = mu.AwaitWithDeadline(cond, deadline);
  TsanAcquired(&mu);
  return met;
}

}  // namespace k3::io
