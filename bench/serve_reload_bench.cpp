// Hot reload through `backplane serve`: the client side of bench/serve_reload_bench.sh, which
// starts the server and runs this against it. Written in C++ rather than curl in a loop so that
// the times are not those of starting processes: rename(2) is called here, and the server is
// polled over one keep-alive connection.
//
//   backplane_bench_serve_reload --port P --pid PID --backend-dir DIR --backend FILE
//                                --request JSON [--swaps N] [--clients C] [--pause-ms MS]
//
// DIR is the server's backend directory, served file DIR/Backplane_CpuRef_backend.so; FILE the
// CpuRef build copied in for every swap; JSON an MNIST request body (models/mnist/
// example_request.json). Each swap copies FILE to DIR/.Backplane_CpuRef_backend.so.new, fsyncs it,
// reads the active generation G from GET /v2/backends/CpuRef, and renames the copy over the
// served name, then polls GET /v2/backends/CpuRef until active_generation > G, then POSTs the
// MNIST request until one answers 200; then waits --pause-ms (default 20) before the next swap.
// C clients (default 1) POST the same request in a loop throughout.
//
// What each printed line means:
//
//   rename -> active_generation changed (N swaps): p50, p99, max
//     From just before rename() until the admin API first reports a newer active generation
//     (polled every 0.2 ms over a kept-alive connection, so ~0.3 ms of it is polling).
//   rename -> first successful inference after it: p50, p99, max
//     The same, until the first 200 answer to an inference sent after the change was seen:
//     the time an operator's rename takes to be serving.
//   inference requests R, non-200 F (clients and probes); admin requests A, non-200 E
//     Every inference request sent (the clients' and the probes after each swap) and those that
//     did not answer 200 (a failed connection counts); must be 0. Likewise for the admin polls.
//   after 10 swaps | after N swaps: VmRSS K kB, M mappings, S CpuRef shadow(s) mapped (L lines),
//   drained in D ms
//     The server process's /proc/PID/status VmRSS and /proc/PID/maps line count once the
//     replaced generations have drained: D is how long after the swap's first inference it took
//     until exactly one CpuRef shadow copy (the loader's private copy, <gen>-Backplane_CpuRef_
//     backend.so) was left mapped, S the distinct shadow files mapped then (1 when drained; the
//     clients keep running while this is measured), L their mapping lines.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using backplane::bench::Clock;
using backplane::bench::Milliseconds;
using backplane::bench::Percentile;

constexpr const char* kServedName = "Backplane_CpuRef_backend.so";
constexpr const char* kInferPath = "/v2/models/mnist/infer";
constexpr const char* kBackendPath = "/v2/backends/CpuRef";

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "serve_reload_bench: %s\n", message.c_str());
  std::exit(1);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    Fail("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct ServerMemory {
  long rss_kb = 0;
  int mappings = 0;
  int shadow_files = 0;  // distinct CpuRef shadow copies mapped
  int shadow_lines = 0;
};

ServerMemory SampleServer(int pid) {
  ServerMemory memory;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream status(proc + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0)
      memory.rss_kb = std::atol(line.c_str() + 6);
  }
  // Shadow copies live in <tmp>/backplane-<uid>/<pid>/<generation>-<file name>; a leaked one is
  // deleted from disk but still mapped (" (deleted)").
  const std::string shadow_suffix = std::string("-") + kServedName;
  std::ifstream maps(proc + "/maps");
  std::set<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    ++memory.mappings;
    const auto path_at = line.find('/');
    if (path_at == std::string::npos)
      continue;
    std::string path = line.substr(path_at);
    if (const auto deleted = path.rfind(" (deleted)"); deleted != std::string::npos)
      path.erase(deleted);
    if (path.find("/backplane-") == std::string::npos || path.size() < shadow_suffix.size() ||
        path.compare(path.size() - shadow_suffix.size(), shadow_suffix.size(), shadow_suffix) != 0)
      continue;
    ++memory.shadow_lines;
    files.insert(path);
  }
  memory.shadow_files = static_cast<int>(files.size());
  return memory;
}

struct Counters {
  std::atomic<long> infer{0}, infer_failed{0}, admin{0}, admin_failed{0};
};

bool Infer(httplib::Client& client, const std::string& body, Counters& counters) {
  auto result = client.Post(kInferPath, body, "application/json");
  ++counters.infer;
  const bool ok = result && result->status == 200;
  if (!ok)
    ++counters.infer_failed;
  return ok;
}

std::optional<unsigned long long> ActiveGeneration(httplib::Client& client, Counters& counters) {
  auto result = client.Get(kBackendPath);
  ++counters.admin;
  if (!result || result->status != 200) {
    ++counters.admin_failed;
    return std::nullopt;
  }
  return nlohmann::json::parse(result->body).at("active_generation").get<unsigned long long>();
}

void Publish(const fs::path& backend, const fs::path& staged) {
  fs::copy_file(backend, staged, fs::copy_options::overwrite_existing);
  fs::permissions(staged, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  const int fd = open(staged.c_str(), O_RDONLY);
  if (fd < 0 || fsync(fd) != 0)
    Fail("cannot fsync " + staged.string());
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0, pid = 0, swaps = 1000, clients = 1, pause_ms = 20;
  fs::path directory, backend, request;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--port")
      port = std::atoi(value);
    else if (flag == "--pid")
      pid = std::atoi(value);
    else if (flag == "--backend-dir")
      directory = value;
    else if (flag == "--backend")
      backend = value;
    else if (flag == "--request")
      request = value;
    else if (flag == "--swaps")
      swaps = std::atoi(value);
    else if (flag == "--clients")
      clients = std::atoi(value);
    else if (flag == "--pause-ms")
      pause_ms = std::atoi(value);
    else
      Fail("unknown flag " + flag);
  }
  if (port <= 0 || pid <= 0 || directory.empty() || backend.empty() || request.empty() ||
      swaps < 10)
    Fail("needs --port, --pid, --backend-dir, --backend, --request, and --swaps >= 10");
  const std::string body = ReadFile(request);
  const fs::path served = directory / kServedName;
  const fs::path staged = directory / (std::string(".") + kServedName + ".new");

  Counters counters;
  std::atomic<bool> stop{false};
  std::vector<std::thread> client_threads;
  for (int i = 0; i < clients; ++i) {
    client_threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);  // as curl does: headers and body go out in two writes
      while (!stop)
        Infer(client, body, counters);
    });
  }

  httplib::Client probe("127.0.0.1", port);
  probe.set_keep_alive(true);
  probe.set_tcp_nodelay(true);
  const auto deadline_after = [](Clock::time_point start) {
    return start + std::chrono::seconds(10);
  };
  // Waits until exactly one CpuRef shadow is mapped; how long that took, in ms.
  const auto drain_and_sample = [&](ServerMemory* memory) {
    const auto start = Clock::now();
    for (;;) {
      *memory = SampleServer(pid);
      if (memory->shadow_files == 1 || Clock::now() > deadline_after(start))
        return Milliseconds(Clock::now() - start);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };

  std::vector<double> to_active, to_served;
  ServerMemory at_10, at_end;
  double drain_10 = 0, drain_end = 0;
  for (int swap = 1; swap <= swaps; ++swap) {
    Publish(backend, staged);
    const auto before = ActiveGeneration(probe, counters);
    if (!before)
      Fail("GET /v2/backends/CpuRef failed before swap " + std::to_string(swap));
    const auto renamed = Clock::now();
    if (std::rename(staged.c_str(), served.c_str()) != 0)
      Fail("rename failed");
    for (;;) {
      const auto now = ActiveGeneration(probe, counters);
      if (now && *now > *before)
        break;
      if (Clock::now() > deadline_after(renamed))
        Fail("swap " + std::to_string(swap) + ": no new active generation within 10 s");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    to_active.push_back(Milliseconds(Clock::now() - renamed));
    while (!Infer(probe, body, counters)) {
      if (Clock::now() > deadline_after(renamed))
        Fail("swap " + std::to_string(swap) + ": no successful inference within 10 s");
    }
    to_served.push_back(Milliseconds(Clock::now() - renamed));
    if (swap == 10)
      drain_10 = drain_and_sample(&at_10);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  drain_end = drain_and_sample(&at_end);
  stop = true;
  for (auto& thread : client_threads)
    thread.join();

  std::printf(
      "rename -> active_generation changed (%d swaps): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
      swaps, Percentile(to_active, 0.5), Percentile(to_active, 0.99), Percentile(to_active, 1.0));
  std::printf(
      "rename -> first successful inference after it: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
      Percentile(to_served, 0.5), Percentile(to_served, 0.99), Percentile(to_served, 1.0));
  std::printf(
      "inference requests %ld, non-200 %ld (clients and probes); admin requests %ld, "
      "non-200 %ld\n",
      counters.infer.load(), counters.infer_failed.load(), counters.admin.load(),
      counters.admin_failed.load());
  const auto print_memory = [](const char* when, const ServerMemory& memory, double drained) {
    std::printf(
        "%s: VmRSS %ld kB, %d mappings, %d CpuRef shadow(s) mapped (%d lines), drained in "
        "%.1f ms\n",
        when, memory.rss_kb, memory.mappings, memory.shadow_files, memory.shadow_lines, drained);
  };
  print_memory("after 10 swaps", at_10, drain_10);
  print_memory(("after " + std::to_string(swaps) + " swaps").c_str(), at_end, drain_end);
  return counters.infer_failed == 0 && counters.admin_failed == 0 && at_end.shadow_files == 1 ? 0
                                                                                              : 1;
}
