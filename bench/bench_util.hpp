// Helpers shared by the scripted benchmarks: durations and percentiles as they are printed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace backplane::bench {

using Clock = std::chrono::steady_clock;

inline double Milliseconds(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The nearest-rank percentile (p in [0, 1]) of `values`; 0 for none.
inline double Percentile(std::vector<double> values, double p) {
  if (values.empty())
    return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(p * static_cast<double>(values.size() - 1))];
}

}  // namespace backplane::bench
