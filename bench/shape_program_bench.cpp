// Shape programs (docs/performance.md, "Shape programs"): what the first request at a new input
// shape costs, what a cached program saves, what the cache lookup costs, and the memory a program
// holds. A scripted run, medians side by side in one sitting (the machine is shared: others
// compile beside it, so compare columns of one run, not runs).
//
//   backplane_bench_shape_programs --model M.onnx --backends DIR [--prefer ID,ID]
//                                  [--batches 1,4,64] [--repeat R]
//   backplane_bench_shape_programs --lookup
//
// Model mode: the model's first input dimension must be dynamic (bench/make_compare_models.py
// writes mlp_n.onnx and lenet_n.onnx so). Three bindings of it in one runtime, measured in turn per
// round, R rounds (default 30) per batch size:
//   first  capacity 1, requests alternating this batch and batch+1, each program awaited before
//          the next request: every request is the first at its shape, and queues its program's
//          build (shape inference + CompileSubgraph of each declined run) on the runtime's
//          builder thread while it runs the load-time per-layer workloads itself;
//   ready  from the start of that first request until its program is cached (polled every
//          20 us): when later requests of the shape get the compiled program;
//   cached capacity 8, warmed: a hit runs the compiled program;
//   off    capacity 0: shape inference and the load-time per-layer workloads on every request.
// Memory first, before anything else has freed memory that malloc would reuse: one binding
// (capacity 8), resident set size before the first request of each batch size and after its
// program is cached, printed per program; a request at that size on a binding
// without programs runs just before, so that the request's own buffers are not counted.
//
// Lookup mode: ShapeProgramCache::Find hits on a cache of 8 programs of one [N, 784] input, on
// one thread and on two at once (median of 15 batches of 200000 calls).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "shape_program_cache.hpp"
#include "spdlog/spdlog.h"

namespace {

namespace fs = std::filesystem;
using namespace backplane;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

long ResidentKiB() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// One input of the model's shape with its first dimension `batch`, seeded values in [0, 1).
Tensor InputFor(const Network& network, int64_t batch) {
  TensorInfo info = network.inputs.at(0).info;
  info.shape.at(0) = batch;
  for (int64_t& dim : info.shape)
    dim = dim < 0 ? 1 : dim;
  Tensor tensor(info);
  std::mt19937 random(20261202);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (float& value : tensor.Elements<float>())
    value = uniform(random);
  return tensor;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "shape_program_bench: %s\n", what.c_str());
  return 2;
}

int RunModel(const fs::path& model, const fs::path& backends,
             const std::vector<std::string>& prefer, const std::vector<int64_t>& batches,
             int repeat) {
  auto network = ImportOnnxFile(model);
  if (!network.ok())
    return Fail(network.error().ToString());
  if (network->inputs.empty() || network->inputs[0].info.shape.empty() ||
      network->inputs[0].info.shape[0] >= 0) {
    return Fail(model.string() + ": the first input's first dimension is not dynamic");
  }
  auto runtime = Runtime::Create({.backend_paths = std::vector{backends}});
  if (!runtime.ok())
    return Fail(runtime.error().ToString());
  auto load = [&](std::size_t capacity) {
    auto id = runtime.value()->LoadNetwork(
        network.value(), {.backend_preferences = prefer, .shape_program_capacity = capacity});
    if (!id.ok()) {
      Fail(id.error().ToString());
      std::exit(2);
    }
    return id.value();
  };
  auto execute = [&](NetworkId id, const Tensor& input) {
    const ConstTensorView view = input.View();
    const auto start = Clock::now();
    auto outputs = runtime.value()->Execute(id, {&view, 1});
    const double micros = MicrosSince(start);
    if (!outputs.ok()) {
      Fail(outputs.error().ToString());
      std::exit(2);
    }
    return micros;
  };
  // Until `id` caches a program for `input`'s shape (built on the runtime's builder thread).
  auto await_program = [&](NetworkId id, const Tensor& input) {
    const Shape& shape = input.info().shape;
    for (;;) {
      for (const auto& program : runtime.value()->GetShapePrograms(id).value().programs) {
        if (program.input_shapes.at(0) == shape)
          return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  };

  const NetworkId fresh = load(8), without = load(0);
  std::string growth;
  for (int64_t batch : batches) {
    const Tensor input = InputFor(network.value(), batch);
    execute(without, input);  // the request's own working memory, allocated once beforehand
    const long before = ResidentKiB();
    execute(fresh, input);
    await_program(fresh, input);
    growth += ' ';
    growth += std::to_string(ResidentKiB() - before);
  }
  const auto stats = runtime.value()->GetShapePrograms(fresh).value();
  std::printf("rss_kib_per_new_program=%s (programs=%zu, compiled layers of the first=%zu)\n",
              growth.c_str(), stats.programs.size(),
              stats.programs.empty() ? std::size_t{0} : stats.programs.back().compiled_layers);
  const NetworkId first = load(1), cached = load(8), off = load(0);
  std::size_t per_shape = 0;
  for (const auto& layer : runtime.value()->GetPlacement(cached).value())
    per_shape += layer.compiled_per_input_shape ? 1 : 0;
  std::printf("model=%s prefer=%s layers=%zu offered_per_shape=%zu\n", model.filename().c_str(),
              prefer.empty() ? "(all)" : prefer[0].c_str(),
              runtime.value()->GetPlacement(cached).value().size(), per_shape);
  for (int64_t batch : batches) {
    const Tensor input = InputFor(network.value(), batch);
    const Tensor other = InputFor(network.value(), batch + 1);
    for (int warm = 0; warm < 5; ++warm) {
      execute(cached, input);
      execute(off, input);
    }
    await_program(cached, input);
    std::vector<double> first_us, ready_us, cached_us, off_us;
    for (int round = 0; round < repeat; ++round) {
      execute(first, other);  // its program evicts `input`'s: the next request rebuilds it
      await_program(first, other);
      const auto start = Clock::now();
      first_us.push_back(execute(first, input));
      await_program(first, input);
      ready_us.push_back(MicrosSince(start));
      cached_us.push_back(execute(cached, input));
      off_us.push_back(execute(off, input));
    }
    std::printf("batch=%-4lld first_us=%.1f ready_us=%.1f cached_us=%.1f off_us=%.1f\n",
                static_cast<long long>(batch), Median(first_us), Median(ready_us),
                Median(cached_us), Median(off_us));
  }

  return 0;
}

int RunLookup() {
  ShapeProgramCache<int> cache(8, std::make_shared<ShapeProgramCounters>());
  for (int64_t batch = 1; batch <= 8; ++batch)
    cache.Find({{batch, 784}}).claim.Publish(std::make_shared<const int>(1));
  constexpr int kCalls = 200000;
  auto measure = [&](int threads) {
    std::vector<double> per_call_ns;
    for (int round = 0; round < 15; ++round) {
      const auto start = Clock::now();
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&cache, t] {
          for (int i = 0; i < kCalls; ++i) {
            // A request builds its key from its inputs' shapes: part of the cost.
            InputShapes key = {{1 + (i + t) % 8, 784}};
            if (cache.Find(key).program == nullptr)
              std::abort();
          }
        });
      }
      for (auto& worker : workers)
        worker.join();
      per_call_ns.push_back(MicrosSince(start) * 1000.0 / kCalls);
    }
    return Median(per_call_ns);
  };
  const double one = measure(1);
  const double two = measure(2);
  std::printf("lookup_ns one_thread=%.1f two_threads_at_once=%.1f (per call, per thread)\n", one,
              two);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  fs::path model, backends;
  std::vector<std::string> prefer;
  std::vector<int64_t> batches = {1, 4, 64};
  int repeat = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        Fail(arg + " needs a value");
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--lookup")
      return RunLookup();
    if (arg == "--model") {
      model = value();
    } else if (arg == "--backends") {
      backends = value();
    } else if (arg == "--prefer") {
      prefer = Split(value());
    } else if (arg == "--batches") {
      batches.clear();
      for (const auto& batch : Split(value()))
        batches.push_back(std::stoll(batch));
    } else if (arg == "--repeat") {
      repeat = std::stoi(value());
    } else {
      return Fail("unknown argument " + arg);
    }
  }
  if (model.empty() || backends.empty())
    return Fail("--model and --backends are required (or --lookup)");
  return RunModel(model, backends, prefer, batches, repeat);
}
