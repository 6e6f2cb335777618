// The median the reports, benchmarks and the tuner quote, so that they all agree on what the
// median of an even count is.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace k3 {

// The middle value of `values`; the mean of the two middle ones for an even count; 0 for none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace k3
