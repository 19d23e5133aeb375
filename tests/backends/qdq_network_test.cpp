// Whole QDQ models, as ONNX Runtime's static quantization writes them, imported and run through
// Runtime on CpuRef: int8 per-channel weights dequantized into a float Conv or MatMul, its output
// quantized and dequantized again. Checked against a float reference computed here, within one
// quantization step (the float sums may round a value across a rounding boundary), and the
// quantized UINT8/INT8 outputs exactly where the reference is not near a boundary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
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

constexpr int32_t kUint8 = onnx::TensorProto::UINT8;
constexpr int32_t kInt8 = onnx::TensorProto::INT8;

// A runtime with CpuRef and CpuAcc, loaded from a temporary backend directory as a host does.
class QdqNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_symlink(BACKPLANE_CPU_REF, dir_ / "Backplane_CpuRef_backend.so");
    fs::create_symlink(BACKPLANE_CPU_ACC, dir_ / "Backplane_CpuAcc_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{dir_.path()}});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
  }
  void TearDown() override {
    runtime_.reset();  // before dir_ goes
  }

  // Imports `model`, runs it once on `inputs` with `preferences` and returns its outputs, and
  // in `placement` (when given) "node:backend" for every layer.
  std::vector<Tensor> Run(const ModelBuilder& model, const std::vector<ConstTensorView>& inputs,
                          const std::vector<std::string>& preferences = {"CpuRef"},
                          std::vector<std::string>* placement = nullptr) {
    auto network = model.Import();
    EXPECT_TRUE(network.ok()) << network.error().ToString();
    if (!network.ok())
      return {};
    auto id =
        runtime_->LoadNetwork(std::move(network).value(), {.backend_preferences = preferences});
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    if (!id.ok())
      return {};
    auto outputs = runtime_->Execute(*id, inputs);
    EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
    if (placement != nullptr) {
      auto layers = runtime_->GetPlacement(*id);
      EXPECT_TRUE(layers.ok()) << layers.error().ToString();
      if (layers.ok()) {
        for (const LayerPlacement& layer : *layers)
          placement->push_back(layer.node + ":" + layer.backend_id);
      }
    }
    EXPECT_TRUE(runtime_->UnloadNetwork(*id).ok());
    return outputs.ok() ? std::move(outputs).value() : std::vector<Tensor>{};
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> runtime_;
};

// ONNX's QuantizeLinear of one value, in double from the float quotient.
double FakeQuantize(double value, float scale, int zero_point, int low, int high,
                    int* quantized = nullptr) {
  const float quotient = static_cast<float>(value) / scale;
  const double q = std::fmin(std::fmax(std::nearbyint(quotient) + zero_point, low), high);
  if (quantized != nullptr)
    *quantized = static_cast<int>(q);
  return (q - zero_point) * scale;
}

// Whether `value` / scale is within a hair of a rounding boundary (an x.5), where float sums in
// another order may land on the other side.
bool NearBoundary(double value, float scale) {
  const double steps = value / scale;
  return std::fabs(steps - std::floor(steps) - 0.5) < 1e-3;
}

// x[N,3,5,5] → Conv(DQ(W int8 [4,3,3,3] per output channel), bias, pads 1) → Q (UINT8 per
// tensor, zero point 128) → q, and → DQ → y.
TEST_F(QdqNetworkTest, PerChannelConvRunsEndToEnd) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const auto uniform = [&](double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(random);
  };
  constexpr int kFilters = 4, kChannels = 3, kSize = 5, kKernel = 3, kBatch = 2;
  std::vector<int32_t> weights(kFilters * kChannels * kKernel * kKernel);
  for (auto& w : weights)
    w = static_cast<int32_t>(std::uniform_int_distribution<int>(-128, 127)(random));
  const std::vector<float> weight_scales = {0.01f, 0.02f, 0.005f, 0.04f};
  const std::vector<float> bias = {0.1f, -0.2f, 0.0f, 0.3f};
  const float out_scale = 0.05f;
  const int out_zero = 128;

  ModelBuilder model;
  model.Input("x", {-1, kChannels, kSize, kSize}).Output("y", {-1, kFilters, kSize, kSize});
  model.Output("q", {-1, kFilters, kSize, kSize}, kUint8);
  model.QuantizedInitializer("w_q", {kFilters, kChannels, kKernel, kKernel}, kInt8, weights);
  model.FloatInitializer("w_scale", {kFilters}, weight_scales);
  model.QuantizedInitializer("w_zero", {kFilters}, kInt8, {0, 0, 0, 0});
  model.FloatInitializer("bias", {kFilters}, bias);
  model.FloatInitializer("out_scale", {}, {out_scale});
  model.QuantizedInitializer("out_zero", {}, kUint8, {out_zero});
  SetInt(model.Node("DequantizeLinear", {"w_q", "w_scale", "w_zero"}, {"w"}, "w_dequant"), "axis",
         0);
  SetInts(model.Node("Conv", {"x", "w", "bias"}, {"c"}, "conv"), "pads", {1, 1, 1, 1});
  model.Node("QuantizeLinear", {"c", "out_scale", "out_zero"}, {"q"}, "out_quant");
  model.Node("DequantizeLinear", {"q", "out_scale", "out_zero"}, {"y"}, "out_dequant");

  std::vector<float> x(kBatch * kChannels * kSize * kSize);
  for (auto& value : x)
    value = static_cast<float>(uniform(-1, 1));
  const ConstTensorView input{{DataType::kFloat32, {kBatch, kChannels, kSize, kSize}}, x.data()};
  const auto outputs = Run(model, {input});
  ASSERT_EQ(outputs.size(), 2u);
  ASSERT_EQ(outputs[0].info(), (TensorInfo{DataType::kFloat32, {kBatch, kFilters, kSize, kSize}}));
  ASSERT_EQ(outputs[1].info(), (TensorInfo{DataType::kUint8, {kBatch, kFilters, kSize, kSize}}));
  const auto y = outputs[0].Elements<float>();
  const auto q = outputs[1].Elements<uint8_t>();

  int exact = 0;
  for (int n = 0; n < kBatch; ++n) {
    for (int f = 0; f < kFilters; ++f) {
      for (int i = 0; i < kSize; ++i) {
        for (int j = 0; j < kSize; ++j) {
          double sum = bias[f];
          for (int c = 0; c < kChannels; ++c) {
            for (int ki = 0; ki < kKernel; ++ki) {
              for (int kj = 0; kj < kKernel; ++kj) {
                const int row = i + ki - 1, column = j + kj - 1;
                if (row < 0 || row >= kSize || column < 0 || column >= kSize)
                  continue;
                const double w = weights[((f * kChannels + c) * kKernel + ki) * kKernel + kj] *
                                 static_cast<double>(weight_scales[f]);
                sum += w * x[((n * kChannels + c) * kSize + row) * kSize + column];
              }
            }
          }
          int quantized = 0;
          const double expected = FakeQuantize(sum, out_scale, out_zero, 0, 255, &quantized);
          const std::size_t index = ((n * kFilters + f) * kSize + i) * kSize + j;
          ASSERT_NEAR(y[index], expected, out_scale * 1.001)
              << "y[" << n << "," << f << "," << i << "," << j << "], float sum " << sum;
          if (!NearBoundary(sum, out_scale)) {
            ASSERT_EQ(q[index], quantized) << "q at " << index << ", float sum " << sum;
            ASSERT_NEAR(y[index], expected, 1e-6);
            ++exact;
          }
        }
      }
    }
  }
  EXPECT_GT(exact, kBatch * kFilters * kSize * kSize / 2);  // the check above did check
}

// x[N,6] → Q (UINT8, zero point 100) → DQ → MatMul(DQ(W int8 [6,4] per column, axis -1)) →
// Q (INT8 per tensor, zero point -5) → q, and → DQ → y.
struct MatMulQdq {
  static constexpr int kRows = 3, kInner = 6, kColumns = 4;
  static constexpr float kInScale = 0.01f, kOutScale = 0.04f;
  static constexpr int kInZero = 100, kOutZero = -5;
  const std::vector<float> weight_scales = {0.02f, 0.01f, 0.03f, 0.015f};
  std::vector<int32_t> weights;
  ModelBuilder model;

  explicit MatMulQdq(std::mt19937_64& random) : weights(kInner * kColumns) {
    for (auto& w : weights)
      w = static_cast<int32_t>(std::uniform_int_distribution<int>(-128, 127)(random));
    model.Input("x", {-1, kInner}).Output("y", {-1, kColumns}).Output("q", {-1, kColumns}, kInt8);
    model.FloatInitializer("in_scale", {}, {kInScale});
    model.QuantizedInitializer("in_zero", {}, kUint8, {kInZero});
    model.QuantizedInitializer("w_q", {kInner, kColumns}, kInt8, weights);
    model.FloatInitializer("w_scale", {kColumns}, weight_scales);
    model.FloatInitializer("out_scale", {}, {kOutScale});
    model.QuantizedInitializer("out_zero", {}, kInt8, {kOutZero});
    model.Node("QuantizeLinear", {"x", "in_scale", "in_zero"}, {"x_q"}, "in_quant");
    model.Node("DequantizeLinear", {"x_q", "in_scale", "in_zero"}, {"x_dq"}, "in_dequant");
    SetInt(model.Node("DequantizeLinear", {"w_q", "w_scale"}, {"w"}, "w_dequant"), "axis", -1);
    model.Node("MatMul", {"x_dq", "w"}, {"m"}, "matmul");
    model.Node("QuantizeLinear", {"m", "out_scale", "out_zero"}, {"q"}, "out_quant");
    model.Node("DequantizeLinear", {"q", "out_scale", "out_zero"}, {"y"}, "out_dequant");
  }
};

TEST_F(QdqNetworkTest, PerColumnMatMulWithQuantizedActivationsRunsEndToEnd) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const MatMulQdq qdq(random);
  constexpr int kRows = MatMulQdq::kRows, kInner = MatMulQdq::kInner,
                kColumns = MatMulQdq::kColumns;
  const auto& weights = qdq.weights;
  const auto& weight_scales = qdq.weight_scales;
  const float in_scale = MatMulQdq::kInScale, out_scale = MatMulQdq::kOutScale;
  const int in_zero = MatMulQdq::kInZero, out_zero = MatMulQdq::kOutZero;
  const ModelBuilder& model = qdq.model;

  std::vector<float> x(kRows * kInner);
  for (auto& value : x)
    value = static_cast<float>(std::uniform_real_distribution<double>(-1.5, 1.5)(random));
  const ConstTensorView input{{DataType::kFloat32, {kRows, kInner}}, x.data()};
  const auto outputs = Run(model, {input});
  ASSERT_EQ(outputs.size(), 2u);
  ASSERT_EQ(outputs[1].info(), (TensorInfo{DataType::kInt8, {kRows, kColumns}}));
  const auto y = outputs[0].Elements<float>();
  const auto q = outputs[1].Elements<int8_t>();
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kColumns; ++c) {
      double sum = 0;
      for (int k = 0; k < kInner; ++k) {
        // x below -1 saturates at 0 - 100: the input's quantization clips it to -1.
        const double x_dq = FakeQuantize(x[r * kInner + k], in_scale, in_zero, 0, 255);
        sum += x_dq * weights[k * kColumns + c] * static_cast<double>(weight_scales[c]);
      }
      int quantized = 0;
      const double expected = FakeQuantize(sum, out_scale, out_zero, -128, 127, &quantized);
      const int index = r * kColumns + c;
      ASSERT_NEAR(y[index], expected, out_scale * 1.001) << "y[" << r << "," << c << "]";
      if (!NearBoundary(sum, out_scale))
        ASSERT_EQ(q[index], quantized) << "q[" << r << "," << c << "], float sum " << sum;
    }
  }
}

// With CpuAcc preferred (as a server's default is), CpuAcc takes every layer: the MatMul with its
// pairs as one int8 step, the input's QuantizeLinear and the output's DequantizeLinear as
// reorders; the answers are CpuRef's within one step (float sums against exact int32 ones).
TEST_F(QdqNetworkTest, PairsRunOnCpuAccAsAnInt8Step) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const MatMulQdq qdq(random);
  std::vector<float> x(2 * MatMulQdq::kInner);
  for (auto& value : x)
    value = static_cast<float>(std::uniform_real_distribution<double>(-1.5, 1.5)(random));
  const ConstTensorView input{{DataType::kFloat32, {2, MatMulQdq::kInner}}, x.data()};
  std::vector<std::string> placement;
  const auto mixed = Run(qdq.model, {input}, {"CpuAcc", "CpuRef"}, &placement);
  const auto reference = Run(qdq.model, {input});
  EXPECT_THAT(placement, ::testing::UnorderedElementsAre("in_quant:CpuAcc", "in_dequant:CpuAcc",
                                                         "w_dequant:CpuAcc", "matmul:CpuAcc",
                                                         "out_quant:CpuAcc", "out_dequant:CpuAcc"));
  ASSERT_EQ(mixed.size(), 2u);
  ASSERT_EQ(reference.size(), 2u);
  const auto y = mixed[0].Elements<float>();
  const auto y_reference = reference[0].Elements<float>();
  for (std::size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], y_reference[i], MatMulQdq::kOutScale * 1.001) << "y at " << i;
}

// `backplane run` on a QDQ model file: every layer placed, and the INT8 output written as a
// TensorProto file equal to what Runtime gives.
TEST_F(QdqNetworkTest, BackplaneRunRunsAQdqModelAndWritesItsInt8Output) {
  std::mt19937_64 random(::backplane::testing::TestSeed());
  const MatMulQdq qdq(random);
  const fs::path model_file = dir_ / "qdq.onnx";
  {
    std::ofstream file(model_file, std::ios::binary);
    file << qdq.model.Serialize();
  }
  Tensor x({DataType::kFloat32, {2, MatMulQdq::kInner}});
  float next = -1.3f;
  for (float& value : x.Elements<float>())
    value = next += 0.21f;
  ASSERT_TRUE(WriteTensorProtoFile(dir_ / "x.pb", x, "x").ok());

  const auto result = ::backplane::testing::RunCommand(
      std::string(BACKPLANE_EXECUTABLE) + " run --backends " + dir_.path().string() +
      " --prefer CpuRef --input " + (dir_ / "x.pb").string() + " --output-dir " +
      (dir_ / "out").string() + " " + model_file.string() + " 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("out_quant"));
  auto written = ReadTensorProtoFile(dir_ / "out" / "output_1.pb");
  ASSERT_TRUE(written.ok()) << written.error().ToString();
  ASSERT_EQ(written->info(), (TensorInfo{DataType::kInt8, {2, MatMulQdq::kColumns}}));

  const ConstTensorView input{x.info(), x.Elements<float>().data()};
  const auto outputs = Run(qdq.model, {input});
  ASSERT_EQ(outputs.size(), 2u);
  const auto expected = outputs[1].Elements<int8_t>();
  const auto got = written->Elements<int8_t>();
  EXPECT_EQ(std::vector<int8_t>(got.begin(), got.end()),
            std::vector<int8_t>(expected.begin(), expected.end()));
}

// `backplane run --test-data` compares an INT8 output as numbers of its type: its own values
// pass with no error, and -1 written where the network answers 1 fails by 2 (read as float
// bytes, the difference would be some bit pattern's, and a 3-byte tensor none at all).
TEST_F(QdqNetworkTest, BackplaneRunTestDataComparesInt8OutputsAsNumbers) {
  std::mt19937_64 random(::backplane::testing::TestSeed());
  const MatMulQdq qdq(random);
  const fs::path model_dir = dir_ / "case";
  const fs::path data_set = model_dir / "test_data_set_0";
  fs::create_directories(data_set);
  {
    std::ofstream file(model_dir / "model.onnx", std::ios::binary);
    file << qdq.model.Serialize();
  }
  Tensor x({DataType::kFloat32, {2, MatMulQdq::kInner}});
  float next = -0.9f;
  for (float& value : x.Elements<float>())
    value = next += 0.17f;
  ASSERT_TRUE(WriteTensorProtoFile(data_set / "input_0.pb", x, "x").ok());
  auto outputs = Run(qdq.model, {x.View()});
  ASSERT_EQ(outputs.size(), 2u);
  ASSERT_EQ(outputs[1].info().type, DataType::kInt8);
  ASSERT_TRUE(WriteTensorProtoFile(data_set / "output_0.pb", outputs[0], "y").ok());
  ASSERT_TRUE(WriteTensorProtoFile(data_set / "output_1.pb", outputs[1], "q").ok());

  const std::string command = std::string(BACKPLANE_EXECUTABLE) + " run --backends " +
                              dir_.path().string() + " --prefer CpuRef --test-data " +
                              model_dir.string() + " " + (model_dir / "model.onnx").string() +
                              " 2>&1";
  auto result = ::backplane::testing::RunCommand(command);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("output 1 (q): pass, max abs error 0,"));

  // One element made 2 apart in the signed reading: -1 for 1, or 1 for anything else.
  int8_t& first = outputs[1].Elements<int8_t>()[0];
  first = first == 1 ? int8_t{-1} : int8_t{1};
  const int8_t answered = Run(qdq.model, {x.View()})[1].Elements<int8_t>()[0];
  const int distance = std::abs(int{first} - int{answered});
  ASSERT_TRUE(WriteTensorProtoFile(data_set / "output_1.pb", outputs[1], "q").ok());
  result = ::backplane::testing::RunCommand(command);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("output 1 (q): FAIL, max abs error " +
                                                  std::to_string(distance) + ","));
}

// A DequantizeLinear of constant weights reads only constants: the runtime computes it once when
// the network loads (LoadedNetwork::FoldConstantSteps) and the placement says so; the layers that
// read a request's values run per request, with the same answers as the model's definition.
TEST_F(QdqNetworkTest, DequantizedConstantWeightsAreComputedOnceAtLoad) {
  std::mt19937_64 random(::backplane::testing::TestSeed());
  const MatMulQdq qdq(random);
  Tensor x({DataType::kFloat32, {2, MatMulQdq::kInner}});
  float next = -0.7f;
  for (float& value : x.Elements<float>())
    value = next += 0.23f;
  std::vector<std::string> placement;
  const auto first = Run(qdq.model, {x.View()}, {"CpuRef"}, &placement);
  ASSERT_EQ(first.size(), 2u);
  auto network = qdq.model.Import();
  ASSERT_TRUE(network.ok());
  auto id = runtime_->LoadNetwork(std::move(network).value(), {.backend_preferences = {"CpuRef"}});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  std::map<std::string, std::string> notes;
  for (const LayerPlacement& layer : runtime_->GetPlacement(*id).value())
    notes[layer.node] = layer.note;
  EXPECT_EQ(notes["w_dequant"], "folded: computed once at load");
  for (const char* per_request : {"in_quant", "in_dequant", "matmul", "out_quant", "out_dequant"})
    EXPECT_EQ(notes[per_request], "") << per_request;
  // Requests after the fold answer as the first did, every time.
  for (int run = 0; run < 3; ++run) {
    auto outputs = runtime_->Execute(*id, std::vector<ConstTensorView>{x.View()});
    ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
    EXPECT_EQ(ElementsAsDoubles((*outputs)[0].View()), ElementsAsDoubles(first[0].View()));
    EXPECT_EQ(ElementsAsDoubles((*outputs)[1].View()), ElementsAsDoubles(first[1].View()));
  }
}

// ---- QOperator forms (onnx/src/qoperator_expansion.hpp) ---------------------------------------

// An INT32 initializer (QLinearConv's bias), as ONNX stores it.
void Int32Initializer(ModelBuilder& model, const std::string& name, std::vector<int64_t> dims,
                      const std::vector<int32_t>& values) {
  onnx::TensorProto* tensor = model.proto().mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::INT32);
  for (int64_t dim : dims)
    tensor->add_dims(dim);
  for (int32_t value : values)
    tensor->add_int32_data(value);
}

// ONNX's requantization of an exact integer accumulator: round half to even, then saturate.
int Requantize(double accumulator, double multiplier, int zero_point, int low, int high) {
  return static_cast<int>(
      std::clamp(std::nearbyint(accumulator * multiplier) + zero_point, double(low), double(high)));
}

// QLinearConv with a per-channel INT8 weight and an INT32 bias against the operator's definition
// computed with integers: every element within one quantization step (the expansion accumulates
// in float), and most of them exact.
TEST_F(QdqNetworkTest, QLinearConvAnswersAsItsIntegerDefinition) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const auto integer = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  constexpr int kFilters = 3, kChannels = 2, kSize = 6, kKernel = 3, kStride = 2;
  constexpr int kOut = (kSize + 2 - kKernel) / kStride + 1;
  const float x_scale = 0.02f, y_scale = 0.07f;
  const int x_zero = integer(0, 255), y_zero = integer(0, 255);  // the range ends included
  std::vector<float> w_scales(kFilters);
  for (float& scale : w_scales)
    scale = 0.002f * static_cast<float>(integer(1, 20));
  std::vector<int32_t> w(kFilters * kChannels * kKernel * kKernel), bias(kFilters);
  for (auto& value : w)
    value = integer(-127, 127);
  for (auto& value : bias)
    value = integer(-2000, 2000);
  std::vector<int32_t> x(kChannels * kSize * kSize);
  for (auto& value : x)
    value = integer(0, 255);

  ModelBuilder model;
  model.Input("x", {1, kChannels, kSize, kSize}, kUint8)
      .Output("y", {1, kFilters, kOut, kOut}, kUint8);
  model.FloatInitializer("x_scale", {}, {x_scale});
  model.QuantizedInitializer("x_zero", {}, kUint8, {x_zero});
  model.QuantizedInitializer("w", {kFilters, kChannels, kKernel, kKernel}, kInt8, w);
  model.FloatInitializer("w_scale", {kFilters}, w_scales);
  model.QuantizedInitializer("w_zero", {kFilters}, kInt8, {0, 0, 0});
  model.FloatInitializer("y_scale", {}, {y_scale});
  model.QuantizedInitializer("y_zero", {}, kUint8, {y_zero});
  Int32Initializer(model, "bias", {kFilters}, bias);
  auto& conv =
      model.Node("QLinearConv",
                 {"x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"},
                 {"y"}, "qconv");
  SetInts(conv, "pads", {1, 1, 1, 1});
  SetInts(conv, "strides", {kStride, kStride});

  std::vector<uint8_t> x_bytes(x.begin(), x.end());
  const ConstTensorView input{{DataType::kUint8, {1, kChannels, kSize, kSize}}, x_bytes.data()};
  std::vector<std::string> placement;
  const auto outputs = Run(model, {input}, {"CpuRef"}, &placement);
  ASSERT_EQ(outputs.size(), 1u);
  ASSERT_EQ(outputs[0].info(), (TensorInfo{DataType::kUint8, {1, kFilters, kOut, kOut}}));
  EXPECT_THAT(placement, ::testing::Contains("qconv/Conv:CpuRef"));
  const auto y = outputs[0].Elements<uint8_t>();
  int exact = 0;
  for (int f = 0; f < kFilters; ++f) {
    for (int i = 0; i < kOut; ++i) {
      for (int j = 0; j < kOut; ++j) {
        int64_t accumulator = bias[f];
        for (int c = 0; c < kChannels; ++c) {
          for (int ki = 0; ki < kKernel; ++ki) {
            for (int kj = 0; kj < kKernel; ++kj) {
              const int row = i * kStride + ki - 1, column = j * kStride + kj - 1;
              if (row < 0 || row >= kSize || column < 0 || column >= kSize)
                continue;
              accumulator += int64_t{x[(c * kSize + row) * kSize + column] - x_zero} *
                             w[((f * kChannels + c) * kKernel + ki) * kKernel + kj];
            }
          }
        }
        const int want = Requantize(static_cast<double>(accumulator),
                                    double{x_scale} * w_scales[f] / y_scale, y_zero, 0, 255);
        const int got = y[(f * kOut + i) * kOut + j];
        ASSERT_LE(std::abs(got - want), 1)
            << "y[0," << f << "," << i << "," << j << "]: accumulator " << accumulator;
        exact += got == want;
      }
    }
  }
  EXPECT_GT(exact, kFilters * kOut * kOut * 3 / 4);
}

// QLinearMatMul (UINT8 a per tensor, INT8 b per column, INT8 y), then com.microsoft's QLinearAdd
// of its output with itself, a MaxPool-free chain; and MaxPool and Reshape applied to a quantized
// value keep its scale and zero point (exact).
TEST_F(QdqNetworkTest, QLinearMatMulAddAndValuePreservingOpsAnswerAsTheirDefinitions) {
  const uint64_t seed = ::backplane::testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const auto integer = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  constexpr int kRows = 4, kInner = 5, kColumns = 4;
  const float a_scale = 0.03f, y_scale = 0.05f, sum_scale = 0.09f;
  const int a_zero = integer(0, 255), y_zero = integer(-128, 127), sum_zero = integer(-20, 20);
  std::vector<float> b_scales(kColumns);
  for (float& scale : b_scales)
    scale = 0.004f * static_cast<float>(integer(1, 10));
  std::vector<int32_t> b(kInner * kColumns);
  for (auto& value : b)
    value = integer(-128, 127);
  std::vector<uint8_t> a(kRows * kInner);
  for (auto& value : a)
    value = static_cast<uint8_t>(integer(0, 255));

  ModelBuilder model;
  auto* microsoft = model.proto().add_opset_import();
  microsoft->set_domain("com.microsoft");
  microsoft->set_version(1);
  model.Input("a", {kRows, kInner}, kUint8);
  model.Output("y", {kRows, kColumns}, kInt8).Output("sum", {kRows, kColumns}, kInt8);
  model.Output("pooled", {1, 1, kRows / 2, kColumns / 2}, kInt8);
  model.FloatInitializer("a_scale", {}, {a_scale});
  model.QuantizedInitializer("a_zero", {}, kUint8, {a_zero});
  model.QuantizedInitializer("b", {kInner, kColumns}, kInt8, b);
  model.FloatInitializer("b_scale", {kColumns}, b_scales);
  model.QuantizedInitializer("b_zero", {kColumns}, kInt8, {0, 0, 0, 0});
  model.FloatInitializer("y_scale", {}, {y_scale});
  model.QuantizedInitializer("y_zero", {}, kInt8, {y_zero});
  model.FloatInitializer("sum_scale", {}, {sum_scale});
  model.QuantizedInitializer("sum_zero", {}, kInt8, {sum_zero});
  model.Int64Initializer("image", {4}, {1, 1, kRows, kColumns});
  model.Node("QLinearMatMul",
             {"a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale", "y_zero"}, {"y"},
             "qmatmul");
  model
      .Node("QLinearAdd",
            {"y", "y_scale", "y_zero", "y", "y_scale", "y_zero", "sum_scale", "sum_zero"}, {"sum"},
            "qadd")
      .set_domain("com.microsoft");
  model.Node("Reshape", {"y", "image"}, {"y_image"}, "to_image");
  auto& pool = model.Node("MaxPool", {"y_image"}, {"pooled"}, "pool");
  SetInts(pool, "kernel_shape", {2, 2});
  SetInts(pool, "strides", {2, 2});

  const ConstTensorView input{{DataType::kUint8, {kRows, kInner}}, a.data()};
  const auto outputs = Run(model, {input});
  ASSERT_EQ(outputs.size(), 3u);
  ASSERT_EQ(outputs[0].info(), (TensorInfo{DataType::kInt8, {kRows, kColumns}}));
  const auto y = outputs[0].Elements<int8_t>();
  const auto sum = outputs[1].Elements<int8_t>();
  const auto pooled = outputs[2].Elements<int8_t>();
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kColumns; ++c) {
      int64_t accumulator = 0;
      for (int k = 0; k < kInner; ++k)
        accumulator += int64_t{a[r * kInner + k] - a_zero} * b[k * kColumns + c];
      const int want = Requantize(static_cast<double>(accumulator),
                                  double{a_scale} * b_scales[c] / y_scale, y_zero, -128, 127);
      const int got = y[r * kColumns + c];
      ASSERT_LE(std::abs(got - want), 1) << "y[" << r << "," << c << "]";
      // QLinearAdd of got with itself, from got's own value.
      const int want_sum =
          Requantize(2.0 * (got - y_zero), double{y_scale} / sum_scale, sum_zero, -128, 127);
      ASSERT_LE(std::abs(sum[r * kColumns + c] - want_sum), 1) << "sum[" << r << "," << c << "]";
    }
  }
  for (int i = 0; i < kRows / 2; ++i) {
    for (int j = 0; j < kColumns / 2; ++j) {
      const int want =
          std::max({y[2 * i * kColumns + 2 * j], y[2 * i * kColumns + 2 * j + 1],
                    y[(2 * i + 1) * kColumns + 2 * j], y[(2 * i + 1) * kColumns + 2 * j + 1]});
      EXPECT_EQ(pooled[i * (kColumns / 2) + j], want) << "pooled[" << i << "," << j << "]";
    }
  }
}

TEST_F(QdqNetworkTest, QOperatorNodesThatCannotBeExpandedAreRefusedNamingTheNode) {
  const auto refused = [](const ModelBuilder& model) {
    auto network = model.Import();
    return network.ok() ? std::string("imported") : network.error().ToString();
  };
  const auto conv = [](ModelBuilder& model, std::vector<std::string> inputs) {
    model.Input("x", {1, 1, 3, 3}, kUint8).Output("y", {1, 1, 1, 1}, kUint8);
    model.FloatInitializer("s", {}, {0.1f});
    model.QuantizedInitializer("z", {}, kUint8, {0});
    model.QuantizedInitializer("w", {1, 1, 3, 3}, kInt8, std::vector<int32_t>(9, 1));
    model.QuantizedInitializer("wz", {}, kInt8, {0});
    Int32Initializer(model, "bias", {1}, {5});
    model.Node("QLinearConv", std::move(inputs), {"y"}, "qconv");
  };
  {
    ModelBuilder model;
    conv(model, {"x", "s", "z", "w", "s", "wz", "s"});
    EXPECT_THAT(refused(model), ::testing::AllOf(::testing::HasSubstr("node 'qconv' (QLinearConv)"),
                                                 ::testing::HasSubstr("takes 8 to 9 inputs")));
  }
  {
    ModelBuilder model;
    model.Input("x_scale", {}, onnx::TensorProto::FLOAT);
    conv(model, {"x", "x_scale", "z", "w", "s", "wz", "s", "z", "bias"});
    EXPECT_THAT(refused(model),
                ::testing::AllOf(::testing::HasSubstr("node 'qconv' (QLinearConv)"),
                                 ::testing::HasSubstr("x_scale (a scalar) and w_scale as FP32 "
                                                      "constants")));
  }
  {
    ModelBuilder model;  // QLinearAdd exists in com.microsoft only
    model.Input("a", {2}, kUint8).Output("c", {2}, kUint8);
    model.FloatInitializer("s", {}, {0.1f});
    model.QuantizedInitializer("z", {}, kUint8, {0});
    model.Node("QLinearAdd", {"a", "s", "z", "a", "s", "z", "s", "z"}, {"c"}, "qadd");
    EXPECT_THAT(refused(model), ::testing::HasSubstr("unsupported operator QLinearAdd"));
  }
}

}  // namespace
}  // namespace backplane
