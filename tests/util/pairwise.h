// Settings grids for tests that run every combination where they can afford it and a pairwise
// covering subset where they cannot (under a sanitizer a run costs ten times more): every value
// of each dimension meets every value of every other dimension in at least one setting, which
// keeps each single setting and each interaction of two in the test.
#pragma once

#include <cstdlib>
#include <set>
#include <tuple>
#include <vector>

#include "tests/util/sanitizers.h"

namespace k3::testing {

// A setting: one value index per dimension.
using GridPoint = std::vector<int>;

// Every combination of `sizes[d]` values per dimension, the first dimension slowest.
inline std::vector<GridPoint> FullGrid(const std::vector<int>& sizes) {
  std::vector<GridPoint> grid = {{}};
  for (int size : sizes) {
    std::vector<GridPoint> longer;
    for (const GridPoint& p : grid) {
      for (int v = 0; v < size; ++v) {
        longer.push_back(p);
        longer.back().push_back(v);
      }
    }
    grid = std::move(longer);
  }
  return grid;
}

// The pairs of (dimension, value) a setting covers, first dimension first.
inline std::vector<std::tuple<int, int, int, int>> PairsOf(const GridPoint& p) {
  std::vector<std::tuple<int, int, int, int>> pairs;
  for (size_t a = 0; a < p.size(); ++a) {
    for (size_t b = a + 1; b < p.size(); ++b) pairs.emplace_back(a, p[a], b, p[b]);
  }
  return pairs;
}

// A pairwise covering subset of the full grid, chosen greedily (the setting that covers most
// pairs not yet covered, the earliest on a tie): deterministic, and near the minimum (the
// product of the two largest sizes) for small grids.
inline std::vector<GridPoint> PairwiseGrid(const std::vector<int>& sizes) {
  const std::vector<GridPoint> all = FullGrid(sizes);
  std::set<std::tuple<int, int, int, int>> uncovered;
  for (const GridPoint& p : all) {
    for (const auto& pair : PairsOf(p)) uncovered.insert(pair);
  }
  std::vector<GridPoint> chosen;
  while (!uncovered.empty()) {
    size_t best = 0, best_gain = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      size_t gain = 0;
      for (const auto& pair : PairsOf(all[i])) gain += uncovered.count(pair);
      if (gain > best_gain) best = i, best_gain = gain;
    }
    for (const auto& pair : PairsOf(all[best])) uncovered.erase(pair);
    chosen.push_back(all[best]);
  }
  return chosen;
}

// The grid a test runs: all of it, but only the pairwise subset in a sanitizer build unless
// K3_FULL_GRID=1 asks for all of it there too.
inline std::vector<GridPoint> TestGrid(const std::vector<int>& sizes) {
  const char* full = std::getenv("K3_FULL_GRID");
  const bool everything = !kSanitized || (full != nullptr && full[0] == '1');
  return everything ? FullGrid(sizes) : PairwiseGrid(sizes);
}

}  // namespace k3::testing
