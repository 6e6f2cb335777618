// Policies that separate once-used keys from reused ones and remember recently evicted keys in
// ghost lists (keys only, no data): ARC (Megiddo and Modha, 2003), 2Q (Johnson and Shasha,
// 1994) and S3-FIFO (Yang et al., 2023). Each uses its paper's default proportions.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "pipeline/cache/key_list.h"
#include "pipeline/cache/policy_internal.h"

namespace k3::cache_internal {
namespace {

// T1: resident keys seen once recently, T2: seen at least twice; B1, B2: their ghosts. The
// target size p of T1 adapts: a ghost hit in B1 says T1 was too small, one in B2 the reverse.
class ArcPolicy final : public ReplacementPolicy {
 public:
  explicit ArcPolicy(const PolicyOptions& options) : c_(options.capacity) {}

  std::string_view name() const override { return "arc"; }
  void OnRequest(const ExpertKey& key, RequestKind) override {
    pending_ = key;
    const double b1 = static_cast<double>(b1_.size());
    const double b2 = static_cast<double>(b2_.size());
    if (b1_.Contains(key)) {
      p_ = std::min<double>(static_cast<double>(c_), p_ + std::max(b2 / b1, 1.0));
    } else if (b2_.Contains(key)) {
      p_ = std::max(0.0, p_ - std::max(b1 / b2, 1.0));
    }
  }
  void OnHit(const ExpertKey& key) override {
    if (t1_.Erase(key)) {
      t2_.PushBack(key);
    } else {
      t2_.MoveToBack(key);
    }
  }
  void OnInsert(const ExpertKey& key) override {
    if (b1_.Erase(key) || b2_.Erase(key)) {
      t2_.PushBack(key);
    } else {
      t1_.PushBack(key);
    }
    TrimGhosts();
  }
  void OnRemove(const ExpertKey& key, RemovalCause cause) override {
    const bool evicted = cause == RemovalCause::kEvicted;
    if (t1_.Erase(key)) {
      if (evicted) b1_.PushBack(key);
    } else if (t2_.Erase(key)) {
      if (evicted) b2_.PushBack(key);
    }
    TrimGhosts();
  }
  // ARC's REPLACE: take from T1 when it is above its target p, else from T2.
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    const double t1 = static_cast<double>(t1_.size());
    const bool from_t1 =
        !t1_.empty() && (t1 > p_ || (b2_.Contains(pending_) && t1 == std::floor(p_)));
    KeyList<>& first = from_t1 ? t1_ : t2_;
    KeyList<>& second = from_t1 ? t2_ : t1_;
    std::optional<ExpertKey> victim = first.FirstFromFront(evictable);
    return victim ? victim : second.FirstFromFront(evictable);
  }

 private:
  // |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
  void TrimGhosts() {
    while (!b1_.empty() && static_cast<int64_t>(t1_.size() + b1_.size()) > c_) b1_.PopFront();
    while (static_cast<int64_t>(t1_.size() + t2_.size() + b1_.size() + b2_.size()) > 2 * c_) {
      if (!b2_.empty()) {
        b2_.PopFront();
      } else if (!b1_.empty()) {
        b1_.PopFront();
      } else {
        break;
      }
    }
  }

  int64_t c_;
  double p_ = 0;
  ExpertKey pending_;
  KeyList<> t1_, t2_, b1_, b2_;
};

// A1in: FIFO of new keys (25 % of the slots); A1out: ghosts of keys evicted from A1in (50 %);
// Am: LRU of keys requested again after leaving A1in.
class TwoQPolicy final : public ReplacementPolicy {
 public:
  explicit TwoQPolicy(const PolicyOptions& options)
      : kin_(std::max<int64_t>(1, options.capacity / 4)),
        kout_(std::max<int64_t>(1, options.capacity / 2)) {}

  std::string_view name() const override { return "2q"; }
  void OnHit(const ExpertKey& key) override { am_.MoveToBack(key); }
  void OnInsert(const ExpertKey& key) override {
    if (a1out_.Erase(key)) {
      am_.PushBack(key);
    } else {
      a1in_.PushBack(key);
    }
  }
  void OnRemove(const ExpertKey& key, RemovalCause cause) override {
    if (a1in_.Erase(key)) {
      if (cause != RemovalCause::kEvicted) return;
      a1out_.PushBack(key);
      if (static_cast<int64_t>(a1out_.size()) > kout_) a1out_.PopFront();
    } else {
      am_.Erase(key);
    }
  }
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    const bool from_in = static_cast<int64_t>(a1in_.size()) > kin_ || am_.empty();
    std::optional<ExpertKey> victim = (from_in ? a1in_ : am_).FirstFromFront(evictable);
    return victim ? victim : (from_in ? am_ : a1in_).FirstFromFront(evictable);
  }

 private:
  int64_t kin_;
  int64_t kout_;
  KeyList<> a1in_, a1out_, am_;
};

// S: small FIFO (10 % of the slots) for new keys; M: main FIFO with a 2-bit frequency and
// reinsertion; G: ghosts of keys evicted from S (as many as M holds). A key requested while in
// S moves to M when it reaches S's head; a ghost hit goes straight to M. Quick demotion of
// one-hit keys is the point: most keys are never reused before they leave S.
class S3FifoPolicy final : public ReplacementPolicy {
 public:
  explicit S3FifoPolicy(const PolicyOptions& options)
      : small_cap_(std::max<int64_t>(1, options.capacity / 10)),
        ghost_cap_(std::max<int64_t>(1, options.capacity - small_cap_)) {}

  std::string_view name() const override { return "s3fifo"; }
  void OnHit(const ExpertKey& key) override {
    uint8_t* freq = small_.Find(key);
    if (freq == nullptr) freq = main_.Find(key);
    if (freq != nullptr) *freq = std::min<uint8_t>(*freq + 1, kMaxFreq);
  }
  void OnInsert(const ExpertKey& key) override {
    if (ghost_.Erase(key)) {
      main_.PushBack(key, 0);
    } else {
      small_.PushBack(key, 0);
    }
  }
  void OnRemove(const ExpertKey& key, RemovalCause cause) override {
    if (small_.Erase(key)) {
      if (cause != RemovalCause::kEvicted) return;
      ghost_.PushBack(key);
      if (static_cast<int64_t>(ghost_.size()) > ghost_cap_) ghost_.PopFront();
    } else {
      main_.Erase(key);
    }
  }
  // S while it holds its share (or M is empty), else M; the other queue when nothing in the
  // first may go (pinned or being filled).
  std::optional<ExpertKey> ChooseVictim(EvictablePredicate evictable) override {
    const bool small_first = static_cast<int64_t>(small_.size()) >= small_cap_ || main_.empty();
    std::optional<ExpertKey> victim = small_first ? EvictSmall(evictable) : EvictMain(evictable);
    if (!victim) victim = small_first ? EvictMain(evictable) : EvictSmall(evictable);
    return victim;
  }

 private:
  static constexpr uint8_t kMaxFreq = 3;

  // From S's head: keys requested while in S move to M; the first one-hit key that may go is
  // the victim; others (pinned) go round once.
  std::optional<ExpertKey> EvictSmall(EvictablePredicate evictable) {
    for (size_t n = small_.size(); n > 0; --n) {
      auto [key, freq] = small_.PopFront();
      if (freq > 0) {
        main_.PushBack(key, 0);
        continue;
      }
      small_.PushBack(key, freq);  // stays resident until OnRemove
      if (evictable(key)) return key;
    }
    return std::nullopt;
  }
  // From M's head: a key with frequency left is reinserted with one less; the first key at zero
  // that may go is the victim. Each key is passed at most kMaxFreq + 1 times.
  std::optional<ExpertKey> EvictMain(EvictablePredicate evictable) {
    for (size_t n = (kMaxFreq + 1) * main_.size() + 1; n > 0 && !main_.empty(); --n) {
      auto [key, freq] = main_.PopFront();
      main_.PushBack(key, freq > 0 ? freq - 1 : 0);
      if (freq == 0 && evictable(key)) return key;
    }
    return std::nullopt;
  }

  int64_t small_cap_;
  int64_t ghost_cap_;
  KeyList<uint8_t> small_, main_;  // value: frequency (0..3)
  KeyList<> ghost_;
};

}  // namespace

std::unique_ptr<ReplacementPolicy> MakeArc(const PolicyOptions& options) {
  return std::make_unique<ArcPolicy>(options);
}
std::unique_ptr<ReplacementPolicy> MakeTwoQ(const PolicyOptions& options) {
  return std::make_unique<TwoQPolicy>(options);
}
std::unique_ptr<ReplacementPolicy> MakeS3Fifo(const PolicyOptions& options) {
  return std::make_unique<S3FifoPolicy>(options);
}

}  // namespace k3::cache_internal
