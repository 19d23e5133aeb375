// CpuAcc's int8 steps (compiler.cpp, QuantizedStep): QDQ networks as ONNX Runtime's static
// quantization writes them, built here with seeded random shapes, scales and zero points, run on
// CpuAcc and on CpuRef (the reference, with ONNX's float arithmetic) through one Runtime. The
// quantized outputs agree within one quantization step per element (the float sums of ONNX and
// the exact int32 sums of oneDNN round apart where a sum lands within a rounding error of an
// x.5); the placement says which layers ran int8; what CpuAcc cannot run int8 falls back, named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "model_builder.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::testing::HasSubstr;

constexpr int32_t kUint8 = onnx::TensorProto::UINT8;
constexpr int32_t kInt8 = onnx::TensorProto::INT8;
constexpr int32_t kInt32 = onnx::TensorProto::INT32;

// The activations' quantization: UINT8 or INT8 with a random zero point.
struct Activation {
  int32_t type = kUint8;
  float scale = 0.0f;
  int zero_point = 0;
  int low() const { return type == kUint8 ? 0 : -128; }
  int high() const { return type == kUint8 ? 255 : 127; }
};

// Builds a QDQ network the way ORT's quantizer writes one: each quantized value has its
// QuantizeLinear, each reader its own DequantizeLinear; weights INT8 with zero point 0, per
// output channel or per tensor; biases INT32 at scale x_scale * w_scale.
class QdqNetwork {
 public:
  QdqNetwork(std::mt19937_64& random, int32_t type) : random_(random), type_(type) {}

  ModelBuilder model;
  // When set, the steps' activation is Clip(first, second) instead of Relu.
  std::optional<std::pair<float, float>> clip;

  // Relu (or Clip, see `clip`) of `x` as layer `name`.
  std::string Activate(const std::string& x, const std::string& name) {
    if (!clip) {
      model.Node("Relu", {x}, {name}, name);
      return name;
    }
    model.FloatInitializer(name + "_min", {}, {clip->first});
    model.FloatInitializer(name + "_max", {}, {clip->second});
    model.Node("Clip", {x, name + "_min", name + "_max"}, {name}, name);
    return name;
  }

  Activation RandomActivation(float range) {
    Activation a;
    a.type = type_;
    a.scale = range / 255.0f * static_cast<float>(Uniform(0.8, 1.2));
    const int middle = type_ == kUint8 ? 128 : 0;
    a.zero_point = middle + static_cast<int>(std::uniform_int_distribution<int>(-20, 20)(random_));
    return a;
  }

  // QuantizeLinear of FP32 `x` as `a`: the quantized value's name.
  std::string Quantize(const std::string& x, const std::string& name, const Activation& a) {
    model.FloatInitializer(name + "_scale", {}, {a.scale});
    model.QuantizedInitializer(name + "_zero", {}, a.type, {a.zero_point});
    model.Node("QuantizeLinear", {x, name + "_scale", name + "_zero"}, {name}, name);
    return name;
  }

  // A DequantizeLinear of `q` (quantized as `a`) for one reader.
  std::string Dequantize(const std::string& q, const std::string& name, const Activation& a) {
    model.Node("DequantizeLinear", {q, q + "_scale", q + "_zero"}, {name}, name);
    (void)a;
    return name;
  }

  // DQ(x_q) -> Conv(DQ(W), DQ(B)) [-> Relu] -> Q: the QuantizeLinear's output name. `weights_zero`
  // non-zero makes weights CpuAcc cannot run int8; `quantize_output` false leaves out the Q (the
  // FP32 value's name is returned).
  std::string ConvStep(const std::string& x_q, const Activation& x, int64_t channels, int64_t maps,
                       int64_t kernel, int64_t group, bool per_channel, bool relu,
                       const Activation& y, const std::string& name, int weights_zero = 0,
                       bool quantize_output = true) {
    const std::string x_dq = Dequantize(x_q, name + "_x_dq", x);
    const int64_t per_map = channels / group * kernel * kernel;
    std::vector<int32_t> w(maps * per_map);
    for (auto& value : w)
      value = std::uniform_int_distribution<int>(-127, 127)(random_);
    std::vector<float> w_scales(per_channel ? maps : 1);
    for (auto& s : w_scales)
      s = static_cast<float>(Uniform(0.5, 1.5) / (64.0 * std::sqrt(double(per_map))));
    std::vector<int32_t> bias(maps);
    std::vector<float> bias_scales;
    for (int64_t m = 0; m < maps; ++m) {
      bias_scales.push_back(x.scale * w_scales[per_channel ? m : 0]);
      bias[m] = static_cast<int32_t>(Uniform(-0.3, 0.3) / bias_scales.back());
    }
    const Shape w_shape{maps, channels / group, kernel, kernel};
    model.QuantizedInitializer(name + "_w", {w_shape.begin(), w_shape.end()}, kInt8, w);
    model.FloatInitializer(name + "_w_scale",
                           per_channel ? std::vector<int64_t>{maps} : std::vector<int64_t>{},
                           w_scales);
    model.QuantizedInitializer(name + "_w_zero",
                               per_channel ? std::vector<int64_t>{maps} : std::vector<int64_t>{},
                               kInt8, std::vector<int32_t>(w_scales.size(), weights_zero));
    SetInt(model.Node("DequantizeLinear", {name + "_w", name + "_w_scale", name + "_w_zero"},
                      {name + "_w_dq"}, name + "_w_dq"),
           "axis", 0);
    model.QuantizedInitializer(name + "_b", {maps}, kInt32, bias);
    model.FloatInitializer(name + "_b_scale",
                           per_channel ? std::vector<int64_t>{maps} : std::vector<int64_t>{},
                           per_channel ? bias_scales : std::vector<float>{bias_scales[0]});
    SetInt(model.Node("DequantizeLinear", {name + "_b", name + "_b_scale"}, {name + "_b_dq"},
                      name + "_b_dq"),
           "axis", 0);
    auto& conv = model.Node("Conv", {x_dq, name + "_w_dq", name + "_b_dq"}, {name + "_conv"}, name);
    const int64_t pad = kernel / 2;
    SetInts(conv, "pads", {pad, pad, pad, pad});
    SetInt(conv, "group", group);
    std::string out = name + "_conv";
    if (relu)
      out = Activate(out, name + "_relu");
    return quantize_output ? Quantize(out, name + "_q", y) : out;
  }

  // DQ(x_q) -> Gemm(DQ(W [N,K]), DQ(B), transB) [-> Relu] -> Q, or MatMul(DQ(W [K,N])) without
  // a bias when `matmul`.
  std::string MatMulStep(const std::string& x_q, const Activation& x, int64_t k, int64_t n,
                         bool per_channel, bool relu, bool matmul, const Activation& y,
                         const std::string& name) {
    const std::string x_dq = Dequantize(x_q, name + "_x_dq", x);
    std::vector<int32_t> w(k * n);
    for (auto& value : w)
      value = std::uniform_int_distribution<int>(-127, 127)(random_);
    std::vector<float> w_scales(per_channel ? n : 1);
    for (auto& s : w_scales)
      s = static_cast<float>(Uniform(0.5, 1.5) / (64.0 * std::sqrt(double(k))));
    const std::vector<int64_t> scale_dims =
        per_channel ? std::vector<int64_t>{n} : std::vector<int64_t>{};
    model.QuantizedInitializer(
        name + "_w", matmul ? std::vector<int64_t>{k, n} : std::vector<int64_t>{n, k}, kInt8, w);
    model.FloatInitializer(name + "_w_scale", scale_dims, w_scales);
    SetInt(model.Node("DequantizeLinear", {name + "_w", name + "_w_scale"}, {name + "_w_dq"},
                      name + "_w_dq"),
           "axis", matmul ? 1 : 0);
    std::string out = name + "_mm";
    if (matmul) {
      model.Node("MatMul", {x_dq, name + "_w_dq"}, {out}, name);
    } else {
      std::vector<int32_t> bias(n);
      std::vector<float> bias_scales;
      for (int64_t c = 0; c < n; ++c) {
        bias_scales.push_back(x.scale * w_scales[per_channel ? c : 0]);
        bias[c] = static_cast<int32_t>(Uniform(-0.3, 0.3) / bias_scales.back());
      }
      model.QuantizedInitializer(name + "_b", {n}, kInt32, bias);
      model.FloatInitializer(name + "_b_scale", scale_dims,
                             per_channel ? bias_scales : std::vector<float>{bias_scales[0]});
      SetInt(model.Node("DequantizeLinear", {name + "_b", name + "_b_scale"}, {name + "_b_dq"},
                        name + "_b_dq"),
             "axis", 0);
      SetInt(model.Node("Gemm", {x_dq, name + "_w_dq", name + "_b_dq"}, {out}, name), "transB", 1);
    }
    if (relu)
      out = Activate(out, name + "_relu");
    return Quantize(out, name + "_q", y);
  }

  double Uniform(double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(random_);
  }

 private:
  std::mt19937_64& random_;
  int32_t type_;
};

class CpuAccInt8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_symlink(BACKPLANE_CPU_REF, dir_ / "Backplane_CpuRef_backend.so");
    fs::create_symlink(BACKPLANE_CPU_ACC, dir_ / "Backplane_CpuAcc_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{dir_.path()}});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
  }
  void TearDown() override {
    std::printf("worst difference from CpuRef in this test: %d step(s)\n", worst_);
    runtime_.reset();  // before dir_ goes
  }

  // Runs `model` once preferring `backend` (then CpuRef); its outputs, and its placement.
  std::vector<Tensor> Run(const ModelBuilder& model, const std::vector<ConstTensorView>& inputs,
                          const std::string& backend,
                          std::vector<LayerPlacement>* placement = nullptr) {
    auto network = model.Import();
    EXPECT_TRUE(network.ok()) << network.error().ToString();
    if (!network.ok())
      return {};
    auto id = runtime_->LoadNetwork(std::move(network).value(),
                                    {.backend_preferences = {backend, "CpuRef"}});
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    if (!id.ok())
      return {};
    auto outputs = runtime_->Execute(*id, inputs);
    EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
    if (placement != nullptr) {
      auto layers = runtime_->GetPlacement(*id);
      EXPECT_TRUE(layers.ok());
      if (layers.ok())
        *placement = std::move(layers).value();
    }
    EXPECT_TRUE(runtime_->UnloadNetwork(*id).ok());
    return outputs.ok() ? std::move(outputs).value() : std::vector<Tensor>{};
  }

  // CpuAcc's quantized outputs (every output is one) against CpuRef's: within `steps` each; the
  // worst difference over all outputs.
  int CompareQuantized(const ModelBuilder& model, const std::vector<ConstTensorView>& inputs,
                       int steps, std::vector<LayerPlacement>* placement) {
    const auto acc = Run(model, inputs, "CpuAcc", placement);
    const auto ref = Run(model, inputs, "CpuRef");
    EXPECT_EQ(acc.size(), ref.size());
    int worst = 0;
    for (std::size_t o = 0; o < std::min(acc.size(), ref.size()); ++o) {
      EXPECT_EQ(acc[o].info(), ref[o].info());
      const bool is_unsigned = acc[o].info().type == DataType::kUint8;
      const auto a = acc[o].Elements<uint8_t>();
      const auto r = ref[o].Elements<uint8_t>();
      int off = 0;
      for (std::size_t e = 0; e < std::min(a.size(), r.size()); ++e) {
        const int va = is_unsigned ? a[e] : static_cast<int8_t>(a[e]);
        const int vr = is_unsigned ? r[e] : static_cast<int8_t>(r[e]);
        worst = std::max(worst, std::abs(va - vr));
        off += va != vr;
        EXPECT_LE(std::abs(va - vr), steps)
            << "output " << o << " element " << e << ": CpuAcc " << va << ", CpuRef " << vr;
        if (std::abs(va - vr) > steps)
          break;
      }
      worst_ = std::max(worst_, worst);
      // Rounding apart is rare: most elements are equal.
      EXPECT_LE(off, static_cast<int>(a.size() / 20 + 1)) << "output " << o;
    }
    return worst;
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> runtime_;
  int worst_ = 0;  // over every comparison of the test
};

const LayerPlacement& Layer(const std::vector<LayerPlacement>& placement, const std::string& node) {
  for (const auto& layer : placement) {
    if (layer.node == node)
      return layer;
  }
  static const LayerPlacement kNone;
  ADD_FAILURE() << "no layer " << node;
  return kNone;
}

std::vector<float> RandomInput(std::mt19937_64& random, const Shape& shape, double range) {
  std::vector<float> x(static_cast<std::size_t>(ElementCount(shape)));
  for (auto& value : x)
    value = static_cast<float>(std::uniform_real_distribution<double>(-range, range)(random));
  return x;
}

// The rounds of ConvStepsMatchCpuRefWithinOneStep whose activation is a Clip.
bool ClipsInRound(int round) {
  return round % 4 == 1;
}

// One quantized convolution step (random geometry, per-channel or per-tensor weights, with Relu,
// Clip or neither), UINT8 and INT8 activations: int8 on CpuAcc, CpuRef's values within one step.
TEST_F(CpuAccInt8Test, ConvStepsMatchCpuRefWithinOneStep) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  for (int round = 0; round < 8; ++round) {
    const int32_t type = round % 2 == 0 ? kUint8 : kInt8;
    const bool per_channel = round % 4 < 2, relu = round % 3 != 0;
    const auto pick = [&](int low, int high) {
      return static_cast<int64_t>(std::uniform_int_distribution<int>(low, high)(random));
    };
    const int64_t batch = pick(1, 3), channels = pick(1, 9) * 2, size = pick(4, 11);
    const int64_t kernel = round % 4 == 3 ? 1 : 3;
    const int64_t group = round == 5 ? channels : 1;  // one depthwise case
    const int64_t maps = group > 1 ? channels : pick(1, 20);
    SCOPED_TRACE("round " + std::to_string(round) + ": batch " + std::to_string(batch) +
                 ", channels " + std::to_string(channels) + ", maps " + std::to_string(maps) +
                 ", size " + std::to_string(size) + ", group " + std::to_string(group) +
                 (per_channel ? ", per-channel" : ", per-tensor") +
                 (relu ? (ClipsInRound(round) ? ", clip" : ", relu") : ""));
    QdqNetwork net(random, type);
    if (ClipsInRound(round))  // Clip where others have Relu; the bounds cut into the output's range
      net.clip = std::pair{-0.25f, 1.0f};
    const Activation in = net.RandomActivation(2.0f);
    const Activation out = net.RandomActivation(relu ? 3.0f : 6.0f);
    net.model.Input("x", {batch, channels, size, size});
    const std::string x_q = net.Quantize("x", "x_q", in);
    const std::string y_q =
        net.ConvStep(x_q, in, channels, maps, kernel, group, per_channel, relu, out, "conv");
    net.model.Output(y_q, {batch, maps, size, size}, type);
    const std::vector<float> x = RandomInput(random, {batch, channels, size, size}, 1.0);
    const ConstTensorView input{{DataType::kFloat32, {batch, channels, size, size}}, x.data()};
    std::vector<LayerPlacement> placement;
    CompareQuantized(net.model, {input}, 1, &placement);
    const std::string types = type == kUint8 ? "u8 x s8 -> u8" : "s8 x s8 -> s8";
    EXPECT_THAT(
        Layer(placement, "conv").note,
        HasSubstr("int8 (" + types + (per_channel && maps > 1 ? ", per-channel" : ", per-tensor")));
    EXPECT_EQ(Layer(placement, "conv").backend_id, "CpuAcc");
    EXPECT_THAT(Layer(placement, "conv_q").note, HasSubstr("fused into conv (int8"));
    EXPECT_THAT(Layer(placement, "conv_w_dq").note, HasSubstr("fused into conv"));
    if (HasFailure())
      break;
  }
}

// An MLP: Gemm (transB, INT32 bias) + Relu, then MatMul without a bias, activations quantized
// between them; per-channel and per-tensor weights, UINT8 and INT8. Rounds 4 and 5 have 3-D
// activations [2, rows, K] (a transformer's): MatMul then for both steps.
TEST_F(CpuAccInt8Test, MatMulStepsMatchCpuRefWithinOneStep) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  for (int round = 0; round < 6; ++round) {
    const int32_t type = round % 2 == 0 ? kUint8 : kInt8;
    const bool per_channel = round < 2 || round == 5, three_d = round >= 4;
    const auto pick = [&](int low, int high) {
      return static_cast<int64_t>(std::uniform_int_distribution<int>(low, high)(random));
    };
    const int64_t rows = pick(1, 9), k = pick(4, 70), hidden = pick(2, 40), n = pick(2, 12);
    SCOPED_TRACE("round " + std::to_string(round) + ": " + (three_d ? "2x" : "") +
                 std::to_string(rows) + "x" + std::to_string(k) + " -> " + std::to_string(hidden) +
                 " -> " + std::to_string(n));
    const auto shape = [&](int64_t columns) {
      return three_d ? Shape{2, rows, columns} : Shape{rows, columns};
    };
    QdqNetwork net(random, type);
    const Activation in = net.RandomActivation(2.0f);
    const Activation mid = net.RandomActivation(3.0f);
    const Activation out = net.RandomActivation(4.0f);
    const Shape x_shape = shape(k);
    net.model.Input("x", {x_shape.begin(), x_shape.end()});
    const std::string x_q = net.Quantize("x", "x_q", in);
    const std::string h_q =
        net.MatMulStep(x_q, in, k, hidden, per_channel, true, three_d, mid, "fc1");
    const std::string y_q =
        net.MatMulStep(h_q, mid, hidden, n, per_channel, false, true, out, "fc2");
    const Shape h_shape = shape(hidden), y_shape = shape(n);
    net.model.Output(h_q, {h_shape.begin(), h_shape.end()}, type)
        .Output(y_q, {y_shape.begin(), y_shape.end()}, type);
    const std::vector<float> x = RandomInput(random, x_shape, 1.0);
    const ConstTensorView input{{DataType::kFloat32, x_shape}, x.data()};
    std::vector<LayerPlacement> placement;
    // fc2 reads fc1's quantized output: where fc1 rounded a step apart, fc2 may too.
    CompareQuantized(net.model, {input}, 1, &placement);
    EXPECT_THAT(Layer(placement, "fc1").note, HasSubstr("int8 ("));
    EXPECT_THAT(Layer(placement, "fc1").note,
                HasSubstr(three_d ? "+MatMul+Relu+QuantizeLinear" : "+Gemm+Relu+QuantizeLinear"));
    EXPECT_THAT(Layer(placement, "fc2").note, HasSubstr("+MatMul+QuantizeLinear"));
    EXPECT_THAT(Layer(placement, "fc1_relu").note, HasSubstr("fused into fc1"));
    if (HasFailure())
      break;
  }
}

// A residual block: conv1 + Relu and conv2 int8, then DQ(conv2) + DQ(x) -> Add [-> Relu] -> Q
// int8 too (with Relu on UINT8; on INT8 without, and with Clip(-0.5, 1)).
TEST_F(CpuAccInt8Test, ResidualBlockMatchesCpuRef) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  for (const auto [type, clipped] :
       {std::pair{kUint8, false}, std::pair{kInt8, false}, std::pair{kInt8, true}}) {
    SCOPED_TRACE(type == kUint8 ? "UINT8, Add + Relu" : clipped ? "INT8, Add + Clip" : "INT8, Add");
    constexpr int64_t kBatch = 2, kChannels = 8, kSize = 6;
    QdqNetwork net(random, type);
    const Activation in = net.RandomActivation(2.0f);
    const Activation a1 = net.RandomActivation(2.0f);
    const Activation a2 = net.RandomActivation(3.0f);
    const Activation sum = net.RandomActivation(4.0f);
    net.model.Input("x", {kBatch, kChannels, kSize, kSize});
    const std::string x_q = net.Quantize("x", "x_q", in);
    const std::string c1 =
        net.ConvStep(x_q, in, kChannels, kChannels, 3, 1, true, true, a1, "conv1");
    const std::string c2 =
        net.ConvStep(c1, a1, kChannels, kChannels, 3, 1, true, false, a2, "conv2");
    const std::string left = net.Dequantize(c2, "add_a", a2);
    const std::string right = net.Dequantize(x_q, "add_b", in);
    net.model.Node("Add", {left, right}, {"add"}, "add");
    const bool relu = type == kUint8 || clipped;
    net.clip = std::nullopt;
    if (clipped)
      net.clip = std::pair{-0.5f, 1.0f};
    const std::string y_q =
        net.Quantize(relu ? net.Activate("add", "add_relu") : "add", "y_q", sum);
    net.model.Output(y_q, {kBatch, kChannels, kSize, kSize}, type);
    const std::vector<float> x = RandomInput(random, {kBatch, kChannels, kSize, kSize}, 1.0);
    const ConstTensorView input{{DataType::kFloat32, {kBatch, kChannels, kSize, kSize}}, x.data()};
    std::vector<LayerPlacement> placement;
    // conv1's one-step roundings apart reach conv2 and the sum: two steps at most here.
    CompareQuantized(net.model, {input}, 2, &placement);
    EXPECT_THAT(Layer(placement, "conv1").note, HasSubstr("int8 ("));
    EXPECT_THAT(Layer(placement, "conv2").note, HasSubstr("int8 ("));
    const std::string t = type == kUint8 ? "u8" : "s8";
    EXPECT_THAT(Layer(placement, "add").note, HasSubstr("int8 (" + t + " + " + t + " -> " + t));
    EXPECT_THAT(Layer(placement, "y_q").note, HasSubstr("fused into add"));
    for (const auto& layer : placement)
      EXPECT_EQ(layer.backend_id, "CpuAcc") << layer.node << ": " << layer.fallback_reason;
  }
}

// Float layers between quantized ones, as ORT leaves them: the pairs around a GlobalAveragePool
// run as reorders from and to the int8 steps' layout, and a MatMul whose output is not quantized
// runs in FP32 with its weights dequantized once at compile time.
TEST_F(CpuAccInt8Test, FloatLayersBetweenRunBetweenReorders) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  constexpr int64_t kBatch = 3, kChannels = 6, kMaps = 16, kSize = 7, kClasses = 5;
  for (const int32_t type : {kUint8, kInt8}) {
    SCOPED_TRACE(type == kUint8 ? "UINT8" : "INT8");
    QdqNetwork net(random, type);
    const Activation in = net.RandomActivation(2.0f);
    const Activation conv = net.RandomActivation(3.0f);
    const Activation pooled = net.RandomActivation(1.5f);
    net.model.Input("x", {kBatch, kChannels, kSize, kSize});
    const std::string x_q = net.Quantize("x", "x_q", in);
    const std::string c_q = net.ConvStep(x_q, in, kChannels, kMaps, 3, 1, true, true, conv, "conv");
    net.model.Node("GlobalAveragePool", {net.Dequantize(c_q, "pool_dq", conv)}, {"pool"}, "pool");
    const std::string p_q = net.Quantize("pool", "pool_q", pooled);
    net.model.Node("Flatten", {net.Dequantize(p_q, "flat_dq", pooled)}, {"flat"}, "flat");
    std::vector<int32_t> w(kMaps * kClasses);
    for (auto& value : w)
      value = std::uniform_int_distribution<int>(-127, 127)(random);
    net.model.QuantizedInitializer("fc_w", {kMaps, kClasses}, kInt8, w);
    net.model.FloatInitializer("fc_w_scale", {}, {0.01f});
    net.model.Node("DequantizeLinear", {"fc_w", "fc_w_scale"}, {"fc_w_dq"}, "fc_w_dq");
    net.model.Node("MatMul", {"flat", "fc_w_dq"}, {"y"}, "fc");
    net.model.Output(p_q, {kBatch, kMaps, 1, 1}, type).Output("y", {kBatch, kClasses});
    const std::vector<float> x = RandomInput(random, {kBatch, kChannels, kSize, kSize}, 1.0);
    const ConstTensorView input{{DataType::kFloat32, {kBatch, kChannels, kSize, kSize}}, x.data()};
    std::vector<LayerPlacement> placement;
    const auto acc = Run(net.model, {input}, "CpuAcc", &placement);
    const auto ref = Run(net.model, {input}, "CpuRef");
    ASSERT_EQ(acc.size(), 2u);
    ASSERT_EQ(ref.size(), 2u);
    ASSERT_EQ(acc[0].info(), ref[0].info());
    const auto pool_acc = acc[0].Elements<uint8_t>(), pool_ref = ref[0].Elements<uint8_t>();
    const auto value = [&](uint8_t byte) {
      return type == kUint8 ? static_cast<int>(byte) : static_cast<int>(static_cast<int8_t>(byte));
    };
    bool same_pool = true;
    for (std::size_t e = 0; e < pool_acc.size(); ++e) {
      EXPECT_LE(std::abs(value(pool_acc[e]) - value(pool_ref[e])), 1) << "pool_q element " << e;
      same_pool = same_pool && pool_acc[e] == pool_ref[e];
    }
    if (same_pool) {  // else the MatMul's inputs differ by a step, and so may y
      const auto y_acc = acc[1].Elements<float>(), y_ref = ref[1].Elements<float>();
      for (std::size_t e = 0; e < y_acc.size(); ++e)
        EXPECT_NEAR(y_acc[e], y_ref[e], 1e-4 + 1e-4 * std::fabs(y_ref[e])) << "y element " << e;
    }
    EXPECT_THAT(Layer(placement, "conv").note, HasSubstr("int8 ("));
    const std::string t = type == kUint8 ? "u8" : "s8";
    EXPECT_THAT(Layer(placement, "pool_dq").note, HasSubstr("from " + t + " (zero point, scale)"));
    EXPECT_THAT(Layer(placement, "pool_q").note, HasSubstr("to " + t + " (scale, zero point)"));
    EXPECT_THAT(Layer(placement, "fc_w_dq").note, HasSubstr("dequantized once, at compile time"));
    EXPECT_THAT(Layer(placement, "fc").note, ::testing::Not(HasSubstr("int8")));
    for (const auto& layer : placement)
      EXPECT_EQ(layer.backend_id, "CpuAcc") << layer.node << ": " << layer.fallback_reason;
  }
}

// A quantized convolution whose result a float layer reads (no QuantizeLinear after it): int8
// with a FP32 destination, CpuRef's values within float rounding.
TEST_F(CpuAccInt8Test, ConvIntoAFloatLayerRunsInt8WithAFloatDestination) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  constexpr int64_t kBatch = 2, kChannels = 5, kMaps = 12, kSize = 6;
  for (const int32_t type : {kUint8, kInt8}) {
    SCOPED_TRACE(type == kUint8 ? "UINT8" : "INT8");
    QdqNetwork net(random, type);
    const Activation in = net.RandomActivation(2.0f);
    net.model.Input("x", {kBatch, kChannels, kSize, kSize});
    const std::string x_q = net.Quantize("x", "x_q", in);
    const std::string c =
        net.ConvStep(x_q, in, kChannels, kMaps, 3, 1, true, true, in, "conv", 0, false);
    SetInt(net.model.Node("Softmax", {c}, {"y"}, "softmax"), "axis", 1);
    net.model.Output("y", {kBatch, kMaps, kSize, kSize});
    const std::vector<float> x = RandomInput(random, {kBatch, kChannels, kSize, kSize}, 1.0);
    const ConstTensorView input{{DataType::kFloat32, {kBatch, kChannels, kSize, kSize}}, x.data()};
    std::vector<LayerPlacement> placement;
    const auto acc = Run(net.model, {input}, "CpuAcc", &placement);
    const auto ref = Run(net.model, {input}, "CpuRef");
    ASSERT_EQ(acc.size(), 1u);
    ASSERT_EQ(ref.size(), 1u);
    const auto y_acc = acc[0].Elements<float>(), y_ref = ref[0].Elements<float>();
    for (std::size_t e = 0; e < y_acc.size(); ++e)
      ASSERT_NEAR(y_acc[e], y_ref[e], 1e-5 + 1e-4 * std::fabs(y_ref[e])) << "y element " << e;
    const std::string t = type == kUint8 ? "u8" : "s8";
    EXPECT_THAT(Layer(placement, "conv").note,
                HasSubstr("int8 (" + t + " x s8 -> f32, per-channel scales)"));
    EXPECT_THAT(Layer(placement, "conv").note, HasSubstr("+Conv+Relu"));
    EXPECT_THAT(Layer(placement, "conv_relu").note, HasSubstr("fused into conv"));
    EXPECT_EQ(Layer(placement, "softmax").backend_id, "CpuAcc");
  }
}

// Weights with a non-zero zero point: their DequantizeLinear falls back to CpuRef, named with the
// reason, and the convolution runs in FP32 on CpuAcc (not int8); the answer is still CpuRef's.
TEST_F(CpuAccInt8Test, WeightsWithAZeroPointFallBackWithTheReason) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  QdqNetwork net(random, kUint8);
  const Activation in = net.RandomActivation(2.0f);
  const Activation out = net.RandomActivation(4.0f);
  net.model.Input("x", {1, 4, 5, 5});
  const std::string x_q = net.Quantize("x", "x_q", in);
  const std::string y_q = net.ConvStep(x_q, in, 4, 6, 3, 1, true, true, out, "conv", 3);
  net.model.Output(y_q, {1, 6, 5, 5}, kUint8);
  const std::vector<float> x = RandomInput(random, {1, 4, 5, 5}, 1.0);
  const ConstTensorView input{{DataType::kFloat32, {1, 4, 5, 5}}, x.data()};
  std::vector<LayerPlacement> placement;
  CompareQuantized(net.model, {input}, 1, &placement);
  const LayerPlacement& weights = Layer(placement, "conv_w_dq");
  EXPECT_EQ(weights.backend_id, "CpuRef");
  EXPECT_THAT(weights.fallback_reason, HasSubstr("DequantizeLinear node 'conv_w_dq'"));
  EXPECT_THAT(weights.fallback_reason, HasSubstr("zero point 3"));
  EXPECT_EQ(Layer(placement, "conv").backend_id, "CpuAcc");
  EXPECT_THAT(Layer(placement, "conv").note, ::testing::Not(HasSubstr("int8")));
}

}  // namespace
}  // namespace backplane
