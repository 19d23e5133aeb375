// Backplane's side of bench/ort_compare.sh: Runtime::Execute latency of one model on a backend
// preference list, request throughput with several clients, and the runtime's own cost per layer.
// A scripted run, not Google Benchmark: the script runs ONNX Runtime in the same sitting and puts
// both in one table.
//
//   backplane_bench_compare --model M.onnx --backends DIR [--backends DIR]... [--prefer ID,ID]
//                           [--option ID.key=value]... [--seconds S] [--clients K]
//   backplane_bench_compare --host-overhead --backends DIR [--prefer ID] [--layers N]
//
// Latency (default): one runtime (arena of one thread per core, limit 1024 requests), the model
// loaded with `--prefer` as its preference list (default CpuRef; every id must be available, or
// the run fails with exit status 3), an input of the model's shape (a negative dimension counts as
// 1) filled with the same pseudo-random values in [0, 1) as bench/ort_compare.mjs, 20 warm-up
// requests, then Execute on this thread until S seconds (default 2) have passed, at least 20
// and at most 20000 calls. Prints
//
//   backplane model=M prefer=P options=O placement=ID:layers[,ID:layers] calls=N median_us=X
//   p90_us=Y
//
// `--option CpuAcc.intra_op_threads=2` sets a backend option at Create (an integer is int64,
// true/false a bool, a number with a point a double, anything else a string).
//
// Throughput (`--clients K`): requests/s of one client thread executing back to back, then of K
// client threads at once, alternately three times for S/3 seconds each; prints the best of the
// three for 1 and for K clients, and their ratio.
//
// Host overhead (`--host-overhead`): what the runtime itself costs per request and per layer,
// measured on chains of Identity layers over a 1-element FP32 tensor (the kernel copies 4
// bytes): median Execute of a 1-layer chain (the per-request cost: admission, arena, input
// checks, output copy) and of an N+1-layer chain (default N = 64); (t[N+1] - t[1]) / N is the
// cost of one more layer: dispatch, the intermediate tensor's allocation, the kernel call.
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

struct Args {
  fs::path model;
  std::vector<fs::path> backends;
  std::vector<std::string> prefer{"CpuRef"};
  std::map<std::string, BackendOptions, std::less<>> options;
  std::string options_text = "-";
  double seconds = 2;
  int clients = 0;
  bool host_overhead = false;
  int layers = 64;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "backplane_bench_compare: %s\n"
               "usage: backplane_bench_compare --model M.onnx --backends DIR... [--prefer ID,ID]\n"
               "         [--option ID.key=value]... [--seconds S] [--clients K]\n"
               "       backplane_bench_compare --host-overhead --backends DIR [--prefer ID] "
               "[--layers N]\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> SplitCommas(const std::string& text) {
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

OptionValue ParseValue(const std::string& text) {
  if (text == "true" || text == "false")
    return text == "true";
  char* end = nullptr;
  const long long integer = std::strtoll(text.c_str(), &end, 10);
  if (!text.empty() && *end == '\0')
    return int64_t{integer};
  const double real = std::strtod(text.c_str(), &end);
  if (!text.empty() && *end == '\0')
    return real;
  return text;
}

Args Parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--host-overhead") {
      args.host_overhead = true;
      continue;
    }
    if (i + 1 >= argc)
      Usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model") {
      args.model = value;
    } else if (flag == "--backends") {
      args.backends.push_back(value);
    } else if (flag == "--prefer") {
      args.prefer = SplitCommas(value);
    } else if (flag == "--option") {
      const auto dot = value.find('.');
      const auto equals = value.find('=');
      if (dot == std::string::npos || equals == std::string::npos || equals < dot)
        Usage("--option wants ID.key=value, got " + value);
      args.options[value.substr(0, dot)][value.substr(dot + 1, equals - dot - 1)] =
          ParseValue(value.substr(equals + 1));
      args.options_text = args.options_text == "-" ? value : args.options_text + "," + value;
    } else if (flag == "--seconds") {
      args.seconds = std::atof(value.c_str());
    } else if (flag == "--clients") {
      args.clients = std::atoi(value.c_str());
    } else if (flag == "--layers") {
      args.layers = std::atoi(value.c_str());
    } else {
      Usage("unknown flag " + flag);
    }
  }
  if (args.backends.empty())
    Usage("--backends is required");
  if (!args.host_overhead && args.model.empty())
    Usage("--model is required");
  if (args.prefer.empty() || args.seconds <= 0 || args.clients < 0 || args.layers < 1)
    Usage("bad --prefer, --seconds, --clients or --layers");
  return args;
}

// The same values as bench/ort_compare.mjs: an LCG in [0, 1).
Tensor FilledInput(const TensorInfo& declared) {
  TensorInfo info = declared;
  for (auto& dim : info.shape)
    dim = dim < 0 ? 1 : dim;
  Tensor tensor(info);
  uint64_t state = 12345;
  for (float& value : tensor.Elements<float>()) {
    state = (state * 1103515245 + 12345) % 2147483648;
    value = static_cast<float>(static_cast<double>(state) / 2147483648.0);
  }
  return tensor;
}

std::unique_ptr<Runtime> MakeRuntime(const Args& args) {
  auto runtime = Runtime::Create({.backend_paths = args.backends,
                                  .backend_options = args.options,
                                  .default_preferences = args.prefer,
                                  .scheduler = {.max_in_flight = 1024}});
  if (!runtime.ok()) {
    std::fprintf(stderr, "runtime: %s\n", runtime.error().ToString().c_str());
    std::exit(3);
  }
  return std::move(runtime).value();
}

// LoadNetwork skips a preferred id the runtime lacks (with a warning); a comparison must not.
void RequireBackends(const Runtime& runtime, const Args& args) {
  const auto have = runtime.BackendIds();
  for (const auto& id : args.prefer) {
    if (std::find(have.begin(), have.end(), id) == have.end()) {
      std::string list;
      for (const auto& backend : have)
        list += (list.empty() ? "" : ",") + backend;
      std::fprintf(stderr, "backend %s is not available to this runtime (have: %s)\n", id.c_str(),
                   list.c_str());
      std::exit(3);
    }
  }
}

NetworkId Load(Runtime& runtime, Network network, const Args& args) {
  auto id = runtime.LoadNetwork(std::move(network), {.backend_preferences = args.prefer});
  if (!id.ok()) {
    std::string have;
    for (const auto& backend : runtime.BackendIds())
      have += (have.empty() ? "" : ",") + backend;
    std::fprintf(stderr, "load: %s (backends here: %s)\n", id.error().ToString().c_str(),
                 have.c_str());
    std::exit(3);
  }
  return id.value();
}

std::string PlacementSummary(const Runtime& runtime, NetworkId id) {
  const auto placement = runtime.GetPlacement(id);
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& layer : placement.value()) {
    auto found = std::find_if(counts.begin(), counts.end(),
                              [&](const auto& entry) { return entry.first == layer.backend_id; });
    if (found == counts.end())
      counts.emplace_back(layer.backend_id, 1);
    else
      ++found->second;
  }
  std::string text;
  for (const auto& [backend, layers] : counts)
    text += (text.empty() ? "" : ",") + backend + ":" + std::to_string(layers);
  return text;
}

void ExecuteOrDie(Runtime& runtime, NetworkId id, const std::vector<ConstTensorView>& views) {
  auto outputs = runtime.Execute(id, views);
  if (!outputs.ok()) {
    std::fprintf(stderr, "execute: %s\n", outputs.error().ToString().c_str());
    std::exit(1);
  }
}

// Microseconds per call, over at least 20 and at most 20000 calls and `seconds`.
std::vector<double> TimeCalls(Runtime& runtime, NetworkId id,
                              const std::vector<ConstTensorView>& views, double seconds) {
  for (int i = 0; i < 20; ++i)
    ExecuteOrDie(runtime, id, views);
  std::vector<double> micros;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (micros.size() < 20 || (Clock::now() < deadline && micros.size() < 20000)) {
    const auto start = Clock::now();
    ExecuteOrDie(runtime, id, views);
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return micros;
}

double RequestsPerSecond(Runtime& runtime, NetworkId id, const std::vector<ConstTensorView>& views,
                         int clients, double seconds) {
  std::atomic<bool> start{false}, stop{false};
  std::atomic<long> done{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      while (!start)
        std::this_thread::yield();
      long mine = 0;
      while (!stop) {
        ExecuteOrDie(runtime, id, views);
        ++mine;
      }
      done += mine;
    });
  }
  const auto begin = Clock::now();
  start = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& thread : threads)
    thread.join();
  return static_cast<double>(done) / std::chrono::duration<double>(Clock::now() - begin).count();
}

// x -> Identity -> ... -> Identity -> y, `layers` layers on FP32[1].
Network IdentityChain(int layers) {
  const TensorInfo info{DataType::kFloat32, {1}};
  Network network{.name = "identity_chain_" + std::to_string(layers)};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}};
  std::string previous = "x";
  network.values.emplace("x", info);
  for (int layer = 0; layer < layers; ++layer) {
    // (Appending, not "h" + to_string: g++ 12 warns -Wrestrict on that, wrongly.)
    std::string output = layer + 1 == layers ? "y" : "h";
    if (layer + 1 < layers)
      output += std::to_string(layer);
    network.nodes.push_back({.name = "identity_" + std::to_string(layer),
                             .op_type = "Identity",
                             .inputs = {previous},
                             .outputs = {output}});
    network.values.emplace(output, info);
    previous = output;
  }
  return network;
}

int HostOverhead(const Args& args) {
  auto runtime = MakeRuntime(args);
  RequireBackends(*runtime, args);
  const Tensor input = FilledInput({DataType::kFloat32, {1}});
  const std::vector<ConstTensorView> views{input.View()};
  const NetworkId one = Load(*runtime, IdentityChain(1), args);
  const NetworkId many = Load(*runtime, IdentityChain(args.layers + 1), args);
  // Alternate the two so that both see the same machine, three rounds; keep each one's best.
  double t_one = 1e30, t_many = 1e30;
  for (int round = 0; round < 3; ++round) {
    t_one = std::min(t_one, Percentile(TimeCalls(*runtime, one, views, args.seconds / 3), 0.5));
    t_many = std::min(t_many, Percentile(TimeCalls(*runtime, many, views, args.seconds / 3), 0.5));
  }
  std::printf(
      "host overhead on %s: 1 Identity layer %.2f us per request; %d layers %.2f us; "
      "per extra layer %.3f us (placement %s)\n",
      args.prefer.front().c_str(), t_one, args.layers + 1, t_many, (t_many - t_one) / args.layers,
      PlacementSummary(*runtime, many).c_str());
  return 0;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string text;
  for (const auto& part : parts)
    text += (text.empty() ? "" : ",") + part;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  if (args.host_overhead)
    return HostOverhead(args);

  auto network = ImportOnnxFile(args.model);
  if (!network.ok()) {
    std::fprintf(stderr, "import: %s\n", network.error().ToString().c_str());
    return 1;
  }
  std::vector<Tensor> inputs;
  for (const auto& input : network->inputs)
    inputs.push_back(FilledInput(input.info));
  std::vector<ConstTensorView> views;
  for (const auto& input : inputs)
    views.push_back(input.View());
  auto runtime = MakeRuntime(args);
  RequireBackends(*runtime, args);
  const NetworkId id = Load(*runtime, std::move(network).value(), args);
  const std::string placement = PlacementSummary(*runtime, id);

  if (args.clients > 0) {
    ExecuteOrDie(*runtime, id, views);  // TBB's threads start on the first request
    // Three alternating rounds, the best of each: the neighbours' load comes and goes, and
    // alternating gives both the same chances.
    double one = 0, many = 0;
    for (int round = 0; round < 3; ++round) {
      one = std::max(one, RequestsPerSecond(*runtime, id, views, 1, args.seconds / 3));
      many = std::max(many, RequestsPerSecond(*runtime, id, views, args.clients, args.seconds / 3));
    }
    std::printf(
        "backplane model=%s prefer=%s options=%s placement=%s clients=1 rps=%.1f clients=%d "
        "rps=%.1f ratio=%.2f\n",
        args.model.c_str(), Join(args.prefer).c_str(), args.options_text.c_str(), placement.c_str(),
        one, args.clients, many, many / one);
    return 0;
  }
  const auto micros = TimeCalls(*runtime, id, views, args.seconds);
  std::printf(
      "backplane model=%s prefer=%s options=%s placement=%s calls=%zu median_us=%.2f "
      "p90_us=%.2f\n",
      args.model.c_str(), Join(args.prefer).c_str(), args.options_text.c_str(), placement.c_str(),
      micros.size(), Percentile(micros, 0.5), Percentile(micros, 0.9));
  return 0;
}
