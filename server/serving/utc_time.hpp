// Times as the server writes them: UTC, to the millisecond.
#pragma once

#include <chrono>
#include <string>

namespace backplane::server {

// `time` in UTC as `strftime_format` (seconds at most) says, then ".mmmZ":
// "%Y-%m-%dT%H:%M:%S" gives RFC 3339 ("2026-11-29T23:55:01.123Z"), "%Y%m%dT%H%M%S" a name that
// sorts as it happened ("20261129T235501.123Z").
std::string UtcWithMillis(std::chrono::system_clock::time_point time, const char* strftime_format);

}  // namespace backplane::server
