// Helpers shared by the scripted benchmarks: durations and percentiles as they are printed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

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

// CPU seconds (user and system) process `pid` ("self", or a number) has used so far; 0 when it
// cannot be read. /proc/PID/stat's utime and stime, fields 14 and 15, after the name in
// parentheses (which may hold spaces).
inline double ProcessCpuSeconds(const std::string& pid) {
  std::ifstream file("/proc/" + pid + "/stat");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto name_end = text.rfind(')');
  if (name_end == std::string::npos)
    return 0;
  std::istringstream fields(text.substr(name_end + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14)
      utime = std::stod(field);
    if (i == 15)
      stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace backplane::bench
