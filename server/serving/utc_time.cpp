#include "serving/utc_time.hpp"

#include <cstdio>
#include <ctime>

namespace backplane::server {

std::string UtcWithMillis(std::chrono::system_clock::time_point time, const char* strftime_format) {
  const auto since_epoch = time.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  const std::size_t length = std::strftime(text, sizeof text, strftime_format, &utc);
  char fraction[8];
  std::snprintf(fraction, sizeof fraction, ".%03dZ", static_cast<int>(millis));
  return std::string(text, length) + fraction;
}

}  // namespace backplane::server
