// Synchronous Runtime::Execute from more threads than cores (issue 24): the throughput of K
// caller threads executing back to back, for several K side by side in one run. An RPC server
// calls Execute from its handler threads, usually more of them than cores; the figure that
// matters is how close K callers stay to the best (about one caller per core).
//
//   backplane_bench_sync_callers --model M.onnx --backends DIR [--prefer ID,ID]
//                                [--callers 1,2,4,8,32] [--seconds S] [--rounds R]
//                                [--max-threads N] [--option ID.key=value]...
//
// One runtime (default scheduler options unless --max-threads; limit on requests in flight 1024,
// so that no caller count here is refused), the model loaded on `--prefer` (default CpuAcc), an
// input of the model's shape (a negative dimension counts as 1) of pseudo-random values in [0, 1).
// Each round runs every caller count once, for S seconds each (default 1), in the order given;
// R rounds (default 5) interleave the counts so that the machine's noise (other builds) falls on
// all of them alike. Prints one line per caller count:
//
//   callers=K median_rps=X min_rps=Y max_rps=Z vs_2_callers=R failed=F
//
// `failed` counts Execute calls that returned an error (any: the run exits with status 1 if one
// did). vs_2_callers is the median's ratio to the median of 2 callers (when 2 is measured).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "bench_util.hpp"
#include "spdlog/spdlog.h"

namespace {

namespace fs = std::filesystem;
using namespace backplane;
using backplane::bench::Clock;
using backplane::bench::Percentile;

struct CallersArgs {
  fs::path model;
  std::vector<fs::path> backends;
  std::vector<std::string> prefer{"CpuAcc"};
  std::vector<int> callers{1, 2, 4, 8, 32};
  std::map<std::string, BackendOptions, std::less<>> options;
  double seconds = 1;
  int rounds = 5;
  int max_threads = 0;
};

[[noreturn]] void CallersUsage(const std::string& why) {
  std::fprintf(
      stderr,
      "backplane_bench_sync_callers: %s\n"
      "usage: backplane_bench_sync_callers --model M.onnx --backends DIR [--prefer ID,ID]\n"
      "         [--callers 1,2,4,8,32] [--seconds S] [--rounds R] [--max-threads N]\n"
      "         [--option ID.key=value]...\n",
      why.c_str());
  std::exit(2);
}

std::vector<std::string> SplitOnCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start)
      parts.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return parts;
}

OptionValue ParseOptionValue(const std::string& text) {
  if (text == "true" || text == "false")
    return text == "true";
  char* end = nullptr;
  const long long integer = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && *end == '\0')
    return int64_t{integer};
  const double number = std::strtod(text.c_str(), &end);
  if (!text.empty() && *end == '\0')
    return number;
  return text;
}

CallersArgs ParseCallersArgs(int argc, char** argv) {
  CallersArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        CallersUsage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--model") {
      args.model = next();
    } else if (flag == "--backends") {
      args.backends.emplace_back(next());
    } else if (flag == "--prefer") {
      args.prefer = SplitOnCommas(next());
    } else if (flag == "--callers") {
      args.callers.clear();
      for (const auto& count : SplitOnCommas(next()))
        args.callers.push_back(std::max(1, std::atoi(count.c_str())));
    } else if (flag == "--seconds") {
      args.seconds = std::atof(next().c_str());
    } else if (flag == "--rounds") {
      args.rounds = std::max(1, std::atoi(next().c_str()));
    } else if (flag == "--max-threads") {
      args.max_threads = std::atoi(next().c_str());
    } else if (flag == "--option") {
      const std::string text = next();
      const auto dot = text.find('.');
      const auto equals = text.find('=');
      if (dot == std::string::npos || equals == std::string::npos || equals < dot)
        CallersUsage("--option wants ID.key=value, got " + text);
      args.options[text.substr(0, dot)][text.substr(dot + 1, equals - dot - 1)] =
          ParseOptionValue(text.substr(equals + 1));
    } else {
      CallersUsage("unknown argument " + flag);
    }
  }
  if (args.model.empty() || args.backends.empty())
    CallersUsage("--model and --backends are required");
  return args;
}

std::vector<Tensor> RandomInputs(const Network& network) {
  std::vector<Tensor> inputs;
  uint32_t state = 12345;
  for (const auto& input : network.inputs) {
    TensorInfo info = input.info;
    for (auto& dim : info.shape)
      dim = dim < 0 ? 1 : dim;
    Tensor tensor(info);
    for (auto& value : tensor.Elements<float>()) {
      state = state * 1664525u + 1013904223u;
      value = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

struct Measured {
  double requests_per_second = 0;
  uint64_t failed = 0;
};

// K threads calling Execute back to back for `seconds`; they start together.
Measured RunCallers(Runtime& runtime, NetworkId id, const std::vector<ConstTensorView>& views,
                    int callers, double seconds) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < callers; ++i) {
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load())
        std::this_thread::yield();
      uint64_t mine = 0;
      uint64_t mine_failed = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        auto outputs = runtime.Execute(id, views);
        if (outputs.ok()) {
          ++mine;
        } else if (++mine_failed == 1) {
          std::fprintf(stderr, "Execute failed: %s\n", outputs.error().ToString().c_str());
        }
      }
      completed.fetch_add(mine);
      failed.fetch_add(mine_failed);
    });
  }
  while (ready.load() < callers)
    std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& thread : threads)
    thread.join();
  return {static_cast<double>(completed.load()) / elapsed, failed.load()};
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  const CallersArgs args = ParseCallersArgs(argc, argv);
  auto network = ImportOnnxFile(args.model);
  if (!network.ok()) {
    std::fprintf(stderr, "%s\n", network.error().ToString().c_str());
    return 2;
  }
  auto created =
      Runtime::Create({.backend_paths = args.backends,
                       .backend_options = args.options,
                       .scheduler = {.max_threads = args.max_threads, .max_in_flight = 1024}});
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.error().ToString().c_str());
    return 2;
  }
  std::unique_ptr<Runtime> runtime = std::move(created).value();
  for (const auto& id : args.prefer) {
    if (runtime->Backend(id) == nullptr) {
      std::fprintf(stderr, "backend %s is not available from the given directories\n", id.c_str());
      return 3;
    }
  }
  const auto inputs = RandomInputs(network.value());
  auto loaded =
      runtime->LoadNetwork(std::move(network).value(), {.backend_preferences = args.prefer});
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().ToString().c_str());
    return 2;
  }
  std::vector<ConstTensorView> views;
  for (const auto& tensor : inputs)
    views.push_back(tensor.View());
  (void)RunCallers(*runtime, loaded.value(), views, 1, 0.2);  // warm-up

  std::map<int, std::vector<double>> rates;
  std::map<int, uint64_t> failed;
  for (int round = 0; round < args.rounds; ++round) {
    for (int callers : args.callers) {
      const Measured measured = RunCallers(*runtime, loaded.value(), views, callers, args.seconds);
      rates[callers].push_back(measured.requests_per_second);
      failed[callers] += measured.failed;
    }
  }
  std::printf("# model=%s prefer=%s cores=%u max_threads=%d rounds=%d seconds=%.2f\n",
              args.model.filename().c_str(), args.prefer.front().c_str(),
              std::thread::hardware_concurrency(), args.max_threads, args.rounds, args.seconds);
  const double two = rates.contains(2) ? Percentile(rates[2], 0.5) : 0;
  bool any_failed = false;
  for (int callers : args.callers) {
    const auto& measured = rates[callers];
    const double median = Percentile(measured, 0.5);
    std::printf(
        "callers=%d median_rps=%.0f min_rps=%.0f max_rps=%.0f vs_2_callers=%.2f failed=%llu\n",
        callers, median, *std::min_element(measured.begin(), measured.end()),
        *std::max_element(measured.begin(), measured.end()), two > 0 ? median / two : 0.0,
        static_cast<unsigned long long>(failed[callers]));
    any_failed = any_failed || failed[callers] != 0;
  }
  return any_failed ? 1 : 0;
}
