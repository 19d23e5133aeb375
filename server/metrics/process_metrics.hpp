// The standard process_* metrics every Prometheus client library exports (client_golang's
// process collector: the same names, types and units), read from /proc at scrape time, and the
// server's build info.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "metrics/prometheus.hpp"

namespace backplane::server {

// What /proc says of a process now. Each field is nullopt when its file could not be read or
// parsed (the series is then left out: a 0 would read as a fact).
struct ProcessSample {
  std::optional<double> cpu_seconds;  // user + system
  std::optional<int64_t> resident_memory_bytes;
  std::optional<int64_t> virtual_memory_bytes;
  std::optional<int64_t> open_fds;
  std::optional<int64_t> max_fds;            // RLIMIT_NOFILE's soft limit
  std::optional<double> start_time_seconds;  // since the Unix epoch
};

// Reads /proc/self/{stat,fd}, /proc/stat's btime and the fd limit. Linux only.
ProcessSample ReadProcessSample();

// Parses the text of /proc/<pid>/stat and /proc/stat (split out so that tests can feed them).
ProcessSample ParseProcStat(std::string_view pid_stat, std::string_view system_stat,
                            int64_t clock_ticks_per_second, int64_t page_size);

// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds.
void RenderProcessMetrics(PrometheusWriter& out, const ProcessSample& sample);

// backplane_build_info{version,backend_api,compiler} 1.
void RenderBuildInfo(PrometheusWriter& out);

}  // namespace backplane::server
