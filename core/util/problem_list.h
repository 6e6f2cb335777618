// The problems a check finds, collected so that one message lists the first few and counts
// the rest: a user fixing a checkpoint or a pack sees every kind of mismatch in one run.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace k3 {

class ProblemList {
 public:
  explicit ProblemList(size_t shown) : shown_(shown) {}

  void Add(std::string what) {
    if (items_.size() < shown_) items_.push_back(std::move(what));
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  // "(3 problems): a; b; and 1 more"
  std::string Text() const {
    std::string more =
        count_ > items_.size() ? absl::StrCat("; and ", count_ - items_.size(), " more") : "";
    return absl::StrCat("(", count_, count_ == 1 ? " problem" : " problems",
                        "): ", absl::StrJoin(items_, "; "), more);
  }

 private:
  size_t shown_;
  std::vector<std::string> items_;
  size_t count_ = 0;
};

}  // namespace k3
