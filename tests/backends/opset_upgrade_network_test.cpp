// Old-opset forms rewritten at import compute what their opset-13 forms compute: each model is
// built at the old opset and again in the opset-13 form, both imported and run through Runtime on
// CpuRef, and the outputs compared exactly (the same kernel runs on the same data); Softmax before
// opset 13, whose rewrite is more than an attribute, against its definition.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "cpu_acc_test_util.hpp"
#include "model_builder.hpp"

namespace backplane::cpu_acc_test {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetFloat;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;

using OpsetUpgradeNetworkTest = CpuAccTest;

// Builds the same computation at `opset`: the old form below 13, the new one from 13 on.
using OpsetModel = std::function<void(ModelBuilder& model, int64_t opset)>;

// Imports the model built at `opset`, runs it on CpuRef with x and returns output "y".
std::vector<float> RunOpsetModelOnCpuRef(Runtime& runtime, const OpsetModel& build, int64_t opset,
                                         const Shape& x_shape, const std::vector<float>& x) {
  ModelBuilder model;
  model.proto().mutable_opset_import(0)->set_version(opset);
  build(model, opset);
  auto network = model.Import();
  EXPECT_TRUE(network.ok()) << "opset " << opset << ": " << network.error().ToString();
  if (!network.ok())
    return {};
  auto id = runtime.LoadNetwork(std::move(network).value(), {.backend_preferences = {"CpuRef"}});
  EXPECT_TRUE(id.ok()) << id.error().ToString();
  if (!id.ok())
    return {};
  const ConstTensorView input{{DataType::kFloat32, x_shape}, x.data()};
  auto outputs = runtime.Execute(*id, {&input, 1});
  EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
  std::vector<float> y;
  if (outputs.ok() && outputs->size() == 1) {
    const auto values = (*outputs)[0].Elements<float>();
    y.assign(values.begin(), values.end());
  }
  EXPECT_TRUE(runtime.UnloadNetwork(*id).ok());
  return y;
}

void ExpectSameAsOpset13(Runtime& runtime, const OpsetModel& build, int64_t old_opset,
                         const Shape& x_shape, const std::vector<float>& x) {
  const std::vector<float> old_y = RunOpsetModelOnCpuRef(runtime, build, old_opset, x_shape, x);
  const std::vector<float> new_y = RunOpsetModelOnCpuRef(runtime, build, 13, x_shape, x);
  ASSERT_FALSE(new_y.empty());
  EXPECT_EQ(old_y, new_y) << "opset " << old_opset << " vs 13";
}

const std::vector<float> kOpsetX = {-7, -1, 0.5f, 2, 5, 9};

TEST_F(OpsetUpgradeNetworkTest, SoftmaxDefaultAxisOnRank2) {
  // Default axis 1 before 13, -1 from 13: both the last axis of [2,3].
  auto build = [](ModelBuilder& model, int64_t) {
    model.Input("x", {2, 3}).Output("y", {2, 3});
    model.Node("Softmax", {"x"}, {"y"}, "sm");
  };
  ExpectSameAsOpset13(runtime(), build, 11, {2, 3}, kOpsetX);
}

TEST_F(OpsetUpgradeNetworkTest, SoftmaxOverChannelsFollowedByOnes) {
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {1, 6, 1, 1}).Output("y", {1, 6, 1, 1});
    auto& softmax = model.Node("Softmax", {"x"}, {"y"}, "sm");
    if (opset >= 13)
      SetInt(softmax, "axis", 1);
  };
  ExpectSameAsOpset13(runtime(), build, 9, {1, 6, 1, 1}, kOpsetX);
}

// Softmax-11 by its definition: the input coerced to 2-D around `axis`, each row normalised.
std::vector<float> Softmax11Reference(const std::vector<float>& x, const Shape& shape,
                                      std::size_t axis) {
  std::size_t row = 1;
  for (std::size_t d = axis; d < shape.size(); ++d)
    row *= static_cast<std::size_t>(shape[d]);
  std::vector<float> y(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += row) {
    const float peak = *std::max_element(x.begin() + begin, x.begin() + begin + row);
    double sum = 0;
    for (std::size_t i = begin; i < begin + row; ++i)
      sum += std::exp(static_cast<double>(x[i] - peak));
    for (std::size_t i = begin; i < begin + row; ++i)
      y[i] = static_cast<float>(std::exp(static_cast<double>(x[i] - peak)) / sum);
  }
  return y;
}

TEST_F(OpsetUpgradeNetworkTest, SoftmaxBeforeOpset13MatchesItsDefinitionOnRandomShapes) {
  // Random ranks, shapes, axes (default, positive, negative) and opsets, with the first dim
  // symbolic in half of the models; CpuRef against the definition above.
  const unsigned seed = ::testing::UnitTest::GetInstance()->random_seed() + 20;
  std::mt19937 random(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t rank = 1 + random() % 4;
    Shape shape;
    for (std::size_t d = 0; d < rank; ++d)
      shape.push_back(1 + static_cast<int64_t>(random() % 4));
    const bool has_axis = random() % 3 != 0;
    const auto r = static_cast<int64_t>(rank);
    int64_t axis = has_axis ? static_cast<int64_t>(random() % (2 * rank)) - r : 1;
    if (!has_axis && rank == 1)
      continue;  // the default axis 1 is out of range at rank 1
    Shape declared = shape;
    if (random() % 2 == 0)
      declared[0] = -1;
    const int64_t opset = 7 + static_cast<int64_t>(random() % 6);
    std::vector<float> x(static_cast<std::size_t>(ElementCount(shape)));
    std::uniform_real_distribution<float> value(-4, 4);
    for (float& v : x)
      v = value(random);
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) + ": opset " +
                 std::to_string(opset) + " x " + ToString(shape) + " declared " +
                 ToString(declared) + (has_axis ? " axis " + std::to_string(axis) : " no axis"));
    auto build = [&](ModelBuilder& model, int64_t) {
      model.Input("x", declared).OutputNoShape("y");
      auto& softmax = model.Node("Softmax", {"x"}, {"y"}, "sm");
      if (has_axis)
        SetInt(softmax, "axis", axis);
    };
    const std::vector<float> y = RunOpsetModelOnCpuRef(runtime(), build, opset, shape, x);
    const std::vector<float> want =
        Softmax11Reference(x, shape, static_cast<std::size_t>(axis < 0 ? axis + r : axis));
    ASSERT_EQ(y.size(), want.size());
    for (std::size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], want[i], 1e-6f) << "element " << i;
  }
}

TEST_F(OpsetUpgradeNetworkTest, Clip6Attributes) {
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {2, 3}).Output("y", {2, 3});
    if (opset < 11) {
      auto& clip = model.Node("Clip", {"x"}, {"y"}, "relu6");
      SetFloat(clip, "min", 0.0f);
      SetFloat(clip, "max", 6.0f);
    } else {
      model.FloatInitializer("zero", {}, {0.0f}).FloatInitializer("six", {}, {6.0f});
      model.Node("Clip", {"x", "zero", "six"}, {"y"}, "relu6");
    }
  };
  ExpectSameAsOpset13(runtime(), build, 10, {2, 3}, kOpsetX);
}

TEST_F(OpsetUpgradeNetworkTest, Clip6DefaultMinIsTheLowestFloat) {
  // Clip-6 without `min` maps -inf to the lowest float, as Clip-13 with that bound does.
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {2, 3}).Output("y", {2, 3});
    if (opset < 11) {
      SetFloat(model.Node("Clip", {"x"}, {"y"}, "clip"), "max", 1.0f);
    } else {
      model.FloatInitializer("lo", {}, {std::numeric_limits<float>::lowest()});
      model.FloatInitializer("hi", {}, {1.0f});
      model.Node("Clip", {"x", "lo", "hi"}, {"y"}, "clip");
    }
  };
  const float inf = std::numeric_limits<float>::infinity();
  ExpectSameAsOpset13(runtime(), build, 8, {2, 3}, {-inf, -1, 0.5f, 2, inf, 9});
}

TEST_F(OpsetUpgradeNetworkTest, DropoutRatioAttribute) {
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {2, 3}).Output("y", {2, 3});
    auto& dropout = model.Node("Dropout", {"x"}, {"y"}, "drop");
    if (opset < 12)
      SetFloat(dropout, "ratio", 0.5f);
  };
  ExpectSameAsOpset13(runtime(), build, 10, {2, 3}, kOpsetX);
}

TEST_F(OpsetUpgradeNetworkTest, Pad2Attributes) {
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {2, 3}).Output("y", {3, 5});
    if (opset < 11) {
      auto& pad = model.Node("Pad", {"x"}, {"y"}, "pad");
      SetInts(pad, "pads", {1, 0, 0, 2});
      SetFloat(pad, "value", 2.5f);
    } else {
      model.Int64Initializer("pads", {4}, {1, 0, 0, 2});
      model.FloatInitializer("value", {}, {2.5f});
      model.Node("Pad", {"x", "pads", "value"}, {"y"}, "pad");
    }
  };
  ExpectSameAsOpset13(runtime(), build, 10, {2, 3}, kOpsetX);
}

TEST_F(OpsetUpgradeNetworkTest, BatchNormalizationSpatialOne) {
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {1, 2, 3, 1}).Output("y", {1, 2, 3, 1});
    model.FloatInitializer("scale", {2}, {1.0f, 2.0f}).FloatInitializer("bias", {2}, {0.0f, 1.0f});
    model.FloatInitializer("mean", {2}, {0.5f, -1.0f}).FloatInitializer("var", {2}, {1.0f, 4.0f});
    auto& bn = model.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"}, "bn");
    if (opset < 9)
      SetInt(bn, "spatial", 1);
  };
  ExpectSameAsOpset13(runtime(), build, 7, {1, 2, 3, 1}, kOpsetX);
}

TEST_F(OpsetUpgradeNetworkTest, MobileNetStyleClassifierAtOpset8) {
  // The shape of an old model zoo export: Conv → BatchNormalization (spatial) → Clip-6 (ReLU6) →
  // GlobalAveragePool → Flatten → Gemm (C required before 11) → Softmax-1 on [N, classes].
  auto build = [](ModelBuilder& model, int64_t opset) {
    model.Input("x", {1, 2, 2, 2}).Output("y", {1, 3});
    model.FloatInitializer("w", {2, 2, 1, 1}, {1.0f, -0.5f, 0.25f, 2.0f});
    model.FloatInitializer("scale", {2}, {1.0f, 0.5f}).FloatInitializer("bias", {2}, {0.1f, 3.0f});
    model.FloatInitializer("mean", {2}, {0.0f, 1.0f}).FloatInitializer("var", {2}, {1.0f, 0.25f});
    model.FloatInitializer("fc_w", {3, 2}, {1.0f, -1.0f, 0.5f, 0.5f, -2.0f, 1.0f});
    model.FloatInitializer("fc_b", {3}, {0.0f, 0.1f, -0.1f});
    model.Node("Conv", {"x", "w"}, {"c"}, "conv");
    auto& bn = model.Node("BatchNormalization", {"c", "scale", "bias", "mean", "var"}, {"b"}, "bn");
    if (opset < 11) {
      SetInt(bn, "spatial", 1);
      auto& clip = model.Node("Clip", {"b"}, {"r"}, "relu6");
      SetFloat(clip, "min", 0.0f);
      SetFloat(clip, "max", 6.0f);
    } else {
      model.FloatInitializer("zero", {}, {0.0f}).FloatInitializer("six", {}, {6.0f});
      model.Node("Clip", {"b", "zero", "six"}, {"r"}, "relu6");
    }
    model.Node("GlobalAveragePool", {"r"}, {"g"}, "pool");
    model.Node("Flatten", {"g"}, {"f"}, "flatten");
    SetInt(model.Node("Gemm", {"f", "fc_w", "fc_b"}, {"logits"}, "fc"), "transB", 1);
    model.Node("Softmax", {"logits"}, {"y"}, "prob");
  };
  ExpectSameAsOpset13(runtime(), build, 8, {1, 2, 2, 2}, {-7, -1, 0.5f, 2, 5, 9, 0, 1});
}

}  // namespace
}  // namespace backplane::cpu_acc_test
