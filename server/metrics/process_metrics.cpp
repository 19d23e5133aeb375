#include "metrics/process_metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backplane/sdk/backend.hpp"

namespace backplane::server {

namespace {

std::string ReadProcFile(const char* path) {
  std::ifstream stream(path);
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

std::optional<int64_t> ParseProcInt(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    return std::nullopt;
  return value;
}

}  // namespace

ProcessSample ParseProcStat(std::string_view pid_stat, std::string_view system_stat,
                            int64_t clock_ticks_per_second, int64_t page_size) {
  ProcessSample sample;
  // The command name (field 2) is in parentheses and may hold spaces and parentheses itself:
  // the fields are counted from the last ')'.
  const auto comm_end = pid_stat.rfind(')');
  if (comm_end != std::string_view::npos && clock_ticks_per_second > 0) {
    std::vector<std::string_view> fields;  // fields[0] is field 3 (state)
    std::string_view rest = pid_stat.substr(comm_end + 1);
    while (!rest.empty()) {
      const auto start = rest.find_first_not_of(" \n");
      if (start == std::string_view::npos)
        break;
      rest.remove_prefix(start);
      const auto end = rest.find_first_of(" \n");
      fields.push_back(rest.substr(0, end));
      rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
    }
    // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24 (1-based).
    const auto field = [&](std::size_t number) -> std::optional<int64_t> {
      return number - 3 < fields.size() ? ParseProcInt(fields[number - 3]) : std::nullopt;
    };
    const double ticks = static_cast<double>(clock_ticks_per_second);
    if (auto utime = field(14), stime = field(15); utime && stime)
      sample.cpu_seconds = static_cast<double>(*utime + *stime) / ticks;
    if (auto vsize = field(23))
      sample.virtual_memory_bytes = *vsize;
    if (auto rss = field(24))
      sample.resident_memory_bytes = *rss * page_size;
    // starttime counts ticks since boot; /proc/stat's btime is the boot in Unix seconds.
    const auto btime_at = system_stat.find("\nbtime ");
    if (auto starttime = field(22); starttime && btime_at != std::string_view::npos) {
      std::string_view line = system_stat.substr(btime_at + 7);
      line = line.substr(0, line.find('\n'));
      if (auto btime = ParseProcInt(line))
        sample.start_time_seconds = static_cast<double>(*btime) + *starttime / ticks;
    }
  }
  return sample;
}

ProcessSample ReadProcessSample() {
  ProcessSample sample = ParseProcStat(ReadProcFile("/proc/self/stat"), ReadProcFile("/proc/stat"),
                                       sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE));
  std::error_code error;
  int64_t open = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error))
    ++open;
  if (!error)
    sample.open_fds = open - 1;  // less the descriptor that lists the directory
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0)
    sample.max_fds = static_cast<int64_t>(limit.rlim_cur);
  return sample;
}

void RenderProcessMetrics(PrometheusWriter& out, const ProcessSample& sample) {
  const auto gauge = [&](std::string_view name, std::string_view type, std::string_view help,
                         const auto& value) {
    if (!value)
      return;
    out.Family(name, type, help);
    out.Sample(name, {}, FormatSampleValue(static_cast<double>(*value)));
  };
  gauge("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
        sample.cpu_seconds);
  gauge("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        sample.resident_memory_bytes);
  gauge("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
        sample.virtual_memory_bytes);
  gauge("process_open_fds", "gauge", "Number of open file descriptors.", sample.open_fds);
  gauge("process_max_fds", "gauge", "Maximum number of open file descriptors.", sample.max_fds);
  gauge("process_start_time_seconds", "gauge",
        "Start time of the process since unix epoch in seconds.", sample.start_time_seconds);
}

void RenderBuildInfo(PrometheusWriter& out) {
  out.Family("backplane_build_info", "gauge",
             "The server's release, the backend API it implements and its compiler (value 1).");
  out.Sample("backplane_build_info",
             {{"version", BACKPLANE_VERSION},
              {"backend_api", std::to_string(kBackendApiVersion.major) + "." +
                                  std::to_string(kBackendApiVersion.minor)},
              {"compiler", __VERSION__}},
             int64_t{1});
}

}  // namespace backplane::server
