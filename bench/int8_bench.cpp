// CpuAcc int8 against CpuAcc FP32 on the same networks: a ResNet-like, a MobileNetV2-like and an
// MLP, each built here twice, as the float model and as the QDQ model ONNX Runtime's static
// quantization would write from it (per-channel INT8 weights, INT32 biases, UINT8 activations,
// a QuantizeLinear at the input and a DequantizeLinear at the output). A scripted run, not Google
// Benchmark:
//
//   backplane_bench_int8 --backends DIR [--seconds S] [--threads T] [--batches 1,8]
//                        [--write-models OUT]
//
// DIR holds Backplane_CpuAcc_backend.so (and CpuRef, which must take no layer: the run fails with
// exit status 3 when a layer is not on CpuAcc). Per network and batch: median and p90 of
// Runtime::Execute over S seconds (default 2, at least 20 calls, after 20 warm-up calls), float
// and int8, in one line each, and their ratio, with how many layers the placement says ran int8.
// `--write-models OUT` also writes each model as OUT/<network>_b<batch>_{fp32,int8}.onnx (for
// `backplane run --repeat`, or ONNX Runtime).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "model_builder.hpp"

namespace {

namespace fs = std::filesystem;
using namespace backplane;
using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;

constexpr int32_t kUint8 = onnx::TensorProto::UINT8;
constexpr int32_t kInt8 = onnx::TensorProto::INT8;
constexpr int32_t kInt32 = onnx::TensorProto::INT32;

// Writes one network in float or in QDQ form. Values are named; in QDQ form every activation
// between layers is the output of a QuantizeLinear (UINT8), read through a DequantizeLinear of
// its own by each reader, and the scales are fixed guesses (speed does not depend on them; zero
// points do: see Out).
class NetWriter {
 public:
  NetWriter(bool quantized, uint32_t seed) : quantized_(quantized), random_(seed) {}

  ModelBuilder model;

  std::string Input(const std::string& name, const Shape& shape) {
    model.Input(name, {shape.begin(), shape.end()});
    return quantized_ ? Quantize(name, 1.0f / 64, 128) : name;
  }
  void Output(const std::string& value, const Shape& shape) {
    const std::string y = quantized_ ? Dequantize(value) : value;
    model.Output(y, {shape.begin(), shape.end()});
  }

  // Conv (pads k/2, `stride`, `group`) [+ Relu, or Clip(0, 6) when `relu6`]; the output's name.
  std::string Conv(const std::string& x, int64_t channels, int64_t maps, int64_t kernel,
                   int64_t stride, int64_t group, bool relu, bool relu6 = false) {
    const std::string name = Next("conv");
    const Shape w{maps, channels / group, kernel, kernel};
    const std::string w_name = Weights(name, w, 0, maps);
    const std::string b_name = Bias(name, maps);
    auto& conv = model.Node("Conv", {In(x), w_name, b_name}, {name}, name);
    const int64_t pad = kernel / 2;
    SetInts(conv, "pads", {pad, pad, pad, pad});
    SetInts(conv, "strides", {stride, stride});
    SetInt(conv, "group", group);
    return Out(Activation(name, relu, relu6), relu || relu6);
  }

  // Gemm(x [M,K], W [N,K] transB) [+ Relu].
  std::string Dense(const std::string& x, int64_t k, int64_t n, bool relu) {
    const std::string name = Next("fc");
    const std::string w_name = Weights(name, {n, k}, 0, n);
    const std::string b_name = Bias(name, n);
    SetInt(model.Node("Gemm", {In(x), w_name, b_name}, {name}, name), "transB", 1);
    return Out(Activation(name, relu, false), relu);
  }

  std::string Add(const std::string& a, const std::string& b, bool relu) {
    const std::string name = Next("add");
    model.Node("Add", {In(a), In(b)}, {name}, name);
    return Out(Activation(name, relu, false), relu);
  }

  std::string GlobalAveragePool(const std::string& x) {
    const std::string name = Next("gap");
    model.Node("GlobalAveragePool", {In(x)}, {name}, name);
    return Out(name, false);
  }

  std::string Flatten(const std::string& x) {
    const std::string name = Next("flatten");
    model.Node("Flatten", {In(x)}, {name}, name);
    return Out(name, false);
  }

 private:
  std::string Next(const std::string& what) { return what + std::to_string(++count_); }

  std::string Quantize(const std::string& x, float scale, int zero_point) {
    const std::string name = x + "_q";
    model.FloatInitializer(name + "_scale", {}, {scale});
    model.QuantizedInitializer(name + "_zero", {}, kUint8, {zero_point});
    model.Node("QuantizeLinear", {x, name + "_scale", name + "_zero"}, {name}, name);
    return name;
  }
  std::string Dequantize(const std::string& q) {
    const std::string name = q + "_dq" + std::to_string(++count_);
    model.Node("DequantizeLinear", {q, q + "_scale", q + "_zero"}, {name}, name);
    return name;
  }
  std::string In(const std::string& x) { return quantized_ ? Dequantize(x) : x; }
  // A value after Relu/ReLU6 gets zero point 0, as calibration gives it (its range starts at 0);
  // others 128.
  std::string Out(const std::string& y, bool non_negative) {
    return quantized_ ? Quantize(y, 1.0f / 16, non_negative ? 0 : 128) : y;
  }

  std::string Activation(const std::string& x, bool relu, bool relu6) {
    if (relu6) {
      model.FloatInitializer(x + "_min", {}, {0.0f});
      model.FloatInitializer(x + "_max", {}, {6.0f});
      model.Node("Clip", {x, x + "_min", x + "_max"}, {x + "_clip"}, x + "_clip");
      return x + "_clip";
    }
    if (relu) {
      model.Node("Relu", {x}, {x + "_relu"}, x + "_relu");
      return x + "_relu";
    }
    return x;
  }

  // Random weights of `shape`, per channel along `axis` (`channels` of them) when quantized.
  std::string Weights(const std::string& name, const Shape& shape, int64_t axis, int64_t channels) {
    const int64_t count = ElementCount(shape);
    const std::string w = name + "_w";
    std::uniform_int_distribution<int> values(-127, 127);
    const float scale = 1.0f / (64.0f * std::sqrt(static_cast<float>(count / channels)));
    if (!quantized_) {
      std::vector<float> data(count);
      for (float& v : data)
        v = static_cast<float>(values(random_)) * scale;
      model.FloatInitializer(w, {shape.begin(), shape.end()}, data);
      return w;
    }
    std::vector<int32_t> data(count);
    for (int32_t& v : data)
      v = values(random_);
    model.QuantizedInitializer(w + "_q", {shape.begin(), shape.end()}, kInt8, data);
    model.FloatInitializer(w + "_scale", {channels}, std::vector<float>(channels, scale));
    SetInt(model.Node("DequantizeLinear", {w + "_q", w + "_scale"}, {w}, w), "axis", axis);
    return w;
  }

  std::string Bias(const std::string& name, int64_t n) {
    const std::string b = name + "_b";
    if (!quantized_) {
      model.FloatInitializer(b, {n}, std::vector<float>(n, 0.01f));
      return b;
    }
    model.QuantizedInitializer(b + "_q", {n}, kInt32, std::vector<int32_t>(n, 100));
    model.FloatInitializer(b + "_scale", {}, {1e-4f});
    model.Node("DequantizeLinear", {b + "_q", b + "_scale"}, {b}, b);
    return b;
  }

  bool quantized_;
  std::mt19937 random_;
  int count_ = 0;
};

// ResNet-like: a 3x3 stem to 64 channels at 28x28, two residual blocks of two 3x3 convolutions,
// a strided block to 128 channels at 14x14, global average pool, a classifier.
void ResNetLike(NetWriter& net, int64_t batch) {
  std::string x = net.Input("x", {batch, 16, 28, 28});
  x = net.Conv(x, 16, 64, 3, 1, 1, true);
  for (int block = 0; block < 2; ++block) {
    const std::string h = net.Conv(x, 64, 64, 3, 1, 1, true);
    x = net.Add(net.Conv(h, 64, 64, 3, 1, 1, false), x, true);
  }
  const std::string shortcut = net.Conv(x, 64, 128, 1, 2, 1, false);
  const std::string h = net.Conv(x, 64, 128, 3, 2, 1, true);
  x = net.Add(net.Conv(h, 128, 128, 3, 1, 1, false), shortcut, true);
  x = net.Flatten(net.GlobalAveragePool(x));
  net.Output(net.Dense(x, 128, 10, false), {batch, 10});
}

// MobileNetV2-like: a stem to 32 channels at 56x56, inverted residual blocks (1x1 expand x6 +
// ReLU6, 3x3 depthwise + ReLU6, 1x1 project, residual Add where the shapes agree).
void MobileNetV2Like(NetWriter& net, int64_t batch) {
  std::string x = net.Input("x", {batch, 8, 56, 56});
  x = net.Conv(x, 8, 32, 3, 2, 1, false, true);  // 28x28
  struct Block {
    int64_t in, out, stride;
  };
  for (const Block& b : {Block{32, 32, 1}, Block{32, 32, 1}, Block{32, 64, 2}, Block{64, 64, 1}}) {
    const int64_t wide = b.in * 6;
    std::string h = net.Conv(x, b.in, wide, 1, 1, 1, false, true);
    h = net.Conv(h, wide, wide, 3, b.stride, wide, false, true);
    h = net.Conv(h, wide, b.out, 1, 1, 1, false);
    x = (b.stride == 1 && b.in == b.out) ? net.Add(h, x, false) : h;
  }
  x = net.Flatten(net.GlobalAveragePool(x));
  net.Output(net.Dense(x, 64, 10, false), {batch, 10});
}

// The MLP 784-512-512-10.
void Mlp(NetWriter& net, int64_t batch) {
  std::string x = net.Input("x", {batch, 784});
  x = net.Dense(x, 784, 512, true);
  x = net.Dense(x, 512, 512, true);
  net.Output(net.Dense(x, 512, 10, false), {batch, 10});
}

struct Timing {
  double median_us = 0, p90_us = 0;
  int calls = 0;
  int int8_layers = 0, layers = 0;
  bool ok = false;
};

Timing Measure(Runtime& runtime, const ModelBuilder& model, const Shape& input_shape,
               double seconds) {
  Timing timing;
  auto network = model.Import();
  if (!network.ok()) {
    std::fprintf(stderr, "import: %s\n", network.error().ToString().c_str());
    return timing;
  }
  auto id = runtime.LoadNetwork(std::move(network).value(), {.backend_preferences = {"CpuAcc"}});
  if (!id.ok()) {
    std::fprintf(stderr, "load: %s\n", id.error().ToString().c_str());
    return timing;
  }
  auto placement = runtime.GetPlacement(*id);
  for (const LayerPlacement& layer : placement.value()) {
    ++timing.layers;
    if (layer.backend_id != "CpuAcc") {
      std::fprintf(stderr, "layer %s on %s: %s\n", layer.node.c_str(), layer.backend_id.c_str(),
                   layer.fallback_reason.c_str());
      std::exit(3);
    }
    if (layer.note.find("int8 (") != std::string::npos)
      ++timing.int8_layers;
  }
  Tensor input({DataType::kFloat32, input_shape});
  std::mt19937 random(7);
  for (float& v : input.Elements<float>())
    v = std::uniform_real_distribution<float>(0.0f, 1.0f)(random);
  const std::vector<ConstTensorView> view{{input.info(), input.Elements<float>().data()}};
  for (int k = 0; k < 20; ++k) {
    if (!runtime.Execute(*id, view).ok())
      return timing;
  }
  std::vector<double> times;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while ((std::chrono::steady_clock::now() < end || times.size() < 20) && times.size() < 20000) {
    const auto start = std::chrono::steady_clock::now();
    if (!runtime.Execute(*id, view).ok())
      return timing;
    times.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  timing.median_us = times[times.size() / 2];
  timing.p90_us = times[times.size() * 9 / 10];
  timing.calls = static_cast<int>(times.size());
  timing.ok = runtime.UnloadNetwork(*id).ok();
  return timing;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> backends;
  double seconds = 2.0;
  int64_t threads = 1;
  std::vector<int64_t> batches{1, 8};
  fs::path write_models;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_value = a + 1 < argc;
    if (arg == "--backends" && has_value) {
      backends.emplace_back(argv[++a]);
    } else if (arg == "--seconds" && has_value) {
      seconds = std::atof(argv[++a]);
    } else if (arg == "--write-models" && has_value) {
      write_models = argv[++a];
    } else if (arg == "--threads" && has_value) {
      threads = std::atoll(argv[++a]);
    } else if (arg == "--batches" && has_value) {
      batches.clear();
      std::string list = argv[++a];
      for (std::size_t start = 0; start < list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        batches.push_back(std::atoll(list.substr(start, comma - start).c_str()));
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s --backends DIR [--seconds S] [--threads T] [--batches 1,8] "
                   "[--write-models OUT]\n",
                   argv[0]);
      return 2;
    }
  }
  BackendOptions options{{"intra_op_threads", threads}};
  auto runtime = Runtime::Create({.backend_paths = backends,
                                  .backend_options = {{"CpuAcc", options}},
                                  .scheduler = {.max_in_flight = 1024}});
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", runtime.error().ToString().c_str());
    return 1;
  }
  struct Network {
    const char* name;
    std::function<void(NetWriter&, int64_t)> write;
    std::function<Shape(int64_t)> input;
  };
  const Network networks[] = {
      {"resnet_like", ResNetLike,
       [](int64_t n) {
         return Shape{n, 16, 28, 28};
       }},
      {"mobilenetv2_like", MobileNetV2Like,
       [](int64_t n) {
         return Shape{n, 8, 56, 56};
       }},
      {"mlp", Mlp,
       [](int64_t n) {
         return Shape{n, 784};
       }},
  };
  std::printf("%-18s %5s %12s %12s %8s %s\n", "network", "batch", "fp32_med_us", "int8_med_us",
              "speedup", "int8 layers");
  for (const Network& network : networks) {
    for (const int64_t batch : batches) {
      NetWriter fp32(false, 1), int8(true, 1);
      network.write(fp32, batch);
      network.write(int8, batch);
      if (!write_models.empty()) {
        fs::create_directories(write_models);
        const std::string stem = std::string(network.name) + "_b" + std::to_string(batch);
        std::ofstream(write_models / (stem + "_fp32.onnx"), std::ios::binary)
            << fp32.model.Serialize();
        std::ofstream(write_models / (stem + "_int8.onnx"), std::ios::binary)
            << int8.model.Serialize();
      }
      const Timing f = Measure(**runtime, fp32.model, network.input(batch), seconds);
      const Timing q = Measure(**runtime, int8.model, network.input(batch), seconds);
      if (!f.ok || !q.ok) {
        std::fprintf(stderr, "%s batch %lld failed\n", network.name, static_cast<long long>(batch));
        return 1;
      }
      std::printf("%-18s %5lld %12.1f %12.1f %7.2fx %d of %d (p90 %.1f / %.1f us, %d / %d calls)\n",
                  network.name, static_cast<long long>(batch), f.median_us, q.median_us,
                  f.median_us / q.median_us, q.int8_layers, q.layers, f.p90_us, q.p90_us, f.calls,
                  q.calls);
      std::fflush(stdout);
    }
  }
  return 0;
}
