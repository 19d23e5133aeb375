// Issue 20's ops end to end: models built as ONNX protobuf, imported, loaded through Runtime and
// run. One with Relu6 (Clip with constant bounds), Dropout and HardSwish after an Add; one with
// Sub, Div, LeakyRelu, HardSigmoid and Pad. On CpuRef alone, and preferring CpuAcc, which runs
// them all but a cropping Pad, and CpuAcc alone says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "cpu_acc_test_util.hpp"
#include "model_builder.hpp"

namespace backplane::cpu_acc_test {
namespace {

using ::backplane::testing::ModelBuilder;
using ::testing::AllOf;
using ::testing::HasSubstr;

using NewOpsNetworkTest = CpuAccTest;

const std::vector<float> kNewOpsBias = {-1, 0, 2};

// x[2,3] + bias[3] → Clip(0, 6) → Dropout (ratio 0.5, training_mode false) → HardSwish → y.
Network NewOpsNetwork() {
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 3});
  model.FloatInitializer("bias", {3}, kNewOpsBias);
  model.FloatInitializer("zero", {}, {0.0f}).FloatInitializer("six", {}, {6.0f});
  model.FloatInitializer("ratio", {}, {0.5f}).BoolInitializer("training", {}, {false});
  model.Node("Add", {"x", "bias"}, {"a"}, "add");
  model.Node("Clip", {"a", "zero", "six"}, {"c"}, "relu6");
  model.Node("Dropout", {"c", "ratio", "training"}, {"d"}, "drop");
  model.Node("HardSwish", {"d"}, {"y"}, "hswish");
  auto network = model.Import();
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  return network.ok() ? std::move(network).value() : Network{};
}

// The same computed here, one element at a time: relu6, then hardswish's piecewise form.
std::vector<float> NewOpsExpected(const std::vector<float>& x) {
  std::vector<float> y;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float a = x[i] + kNewOpsBias[i % 3];
    const float c = a < 0 ? 0 : a > 6 ? 6 : a;
    y.push_back(c >= 3 ? c : c * (c + 3) / 6);  // c >= 0: the part below -3 never applies
  }
  return y;
}

// Loads the network with `preferences`, runs it on `x` and returns y and each node's backend.
void LoadAndRunNewOps(Runtime& runtime, const std::vector<std::string>& preferences,
                      const std::vector<float>& x, std::vector<float>* y,
                      std::vector<std::string>* backends) {
  auto id = runtime.LoadNetwork(NewOpsNetwork(), {.backend_preferences = preferences});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  const ConstTensorView input{{DataType::kFloat32, {2, 3}}, x.data()};
  auto outputs = runtime.Execute(*id, {&input, 1});
  ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
  ASSERT_EQ(outputs->size(), 1u);
  const auto values = (*outputs)[0].Elements<float>();
  y->assign(values.begin(), values.end());
  auto placement = runtime.GetPlacement(*id);
  ASSERT_TRUE(placement.ok()) << placement.error().ToString();
  for (const LayerPlacement& layer : *placement)
    backends->push_back(layer.node + ":" + layer.backend_id);
  ASSERT_TRUE(runtime.UnloadNetwork(*id).ok());
}

TEST_F(NewOpsNetworkTest, Relu6DropoutHardSwishRunOnCpuRef) {
  // Below 0, between 0 and 3, between 3 and 6, above 6 after the bias.
  const std::vector<float> x = {-3, 1, 1.5f, 2, 5, 7};
  std::vector<float> y;
  std::vector<std::string> backends;
  LoadAndRunNewOps(runtime(), {"CpuRef"}, x, &y, &backends);
  std::string mismatch;
  EXPECT_TRUE(AllClose(y, NewOpsExpected(x), &mismatch)) << mismatch;
  EXPECT_THAT(backends,
              ::testing::ElementsAre("add:CpuRef", "relu6:CpuRef", "drop:CpuRef", "hswish:CpuRef"));
}

TEST_F(NewOpsNetworkTest, CpuAccRunsRelu6DropoutHardSwish) {
  const std::vector<float> x = {-3, 1, 1.5f, 2, 5, 7};
  std::vector<float> y;
  std::vector<std::string> backends;
  LoadAndRunNewOps(runtime(), {"CpuAcc", "CpuRef"}, x, &y, &backends);
  std::string mismatch;
  EXPECT_TRUE(AllClose(y, NewOpsExpected(x), &mismatch)) << mismatch;
  EXPECT_THAT(backends,
              ::testing::ElementsAre("add:CpuAcc", "relu6:CpuAcc", "drop:CpuAcc", "hswish:CpuAcc"));
}

TEST_F(NewOpsNetworkTest, CpuAccAloneNamesTheLayerItDeclines) {
  // A Pad with a negative amount crops: CpuRef does, CpuAcc declines.
  ModelBuilder model;
  model.Input("x", {2, 3}).Output("y", {2, 2});
  model.Int64Initializer("pads", {4}, {0, -1, 0, 0});
  model.Node("Pad", {"x", "pads"}, {"y"}, "pad");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  auto id = runtime().LoadNetwork(*network, {.backend_preferences = {"CpuAcc"}});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(id.error().message(), AllOf(HasSubstr("node 'pad' (Pad) is supported by no backend"),
                                          HasSubstr("negative pads (cropping) are not supported")));
}

TEST_F(NewOpsNetworkTest, EveryOtherNewOpRunsOnCpuAccWithTheSameResult) {
  // x[1,4] → Sub(x, 1) → Div(·, [1,2,4,8]) → LeakyRelu(0.5) → HardSigmoid(0.25, 0.5) → Pad one
  // zero either side → y[1,6], on each backend preferred.
  ModelBuilder model;
  model.Input("x", {1, 4}).Output("y", {1, 6});
  model.FloatInitializer("one", {}, {1.0f}).FloatInitializer("divisor", {4}, {1, 2, 4, 8});
  model.Int64Initializer("pads", {4}, {0, 1, 0, 1});
  model.Node("Sub", {"x", "one"}, {"s"}, "sub");
  model.Node("Div", {"s", "divisor"}, {"q"}, "div");
  ::backplane::testing::SetFloat(model.Node("LeakyRelu", {"q"}, {"l"}, "leaky"), "alpha", 0.5f);
  auto& hard_sigmoid = model.Node("HardSigmoid", {"l"}, {"h"}, "hsig");
  ::backplane::testing::SetFloat(hard_sigmoid, "alpha", 0.25f);
  ::backplane::testing::SetFloat(hard_sigmoid, "beta", 0.5f);
  model.Node("Pad", {"h", "pads"}, {"y"}, "pad");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();

  // x = [-7, 1, 9, 17]: (x - 1) / divisor = [-8, 0, 2, 2]; leaky: [-4, 0, 2, 2];
  // 0.25 v + 0.5: [-0.5, 0.5, 1, 1] clamped to [0, 0.5, 1, 1]; padded with a 0 either side.
  const std::vector<float> x = {-7, 1, 9, 17};
  const std::vector<float> expected = {0, 0, 0.5f, 1, 1, 0};
  for (const std::vector<std::string>& preferences :
       {std::vector<std::string>{"CpuRef"}, std::vector<std::string>{"CpuAcc", "CpuRef"}}) {
    SCOPED_TRACE(preferences[0]);
    auto id = runtime().LoadNetwork(*network, {.backend_preferences = preferences});
    ASSERT_TRUE(id.ok()) << id.error().ToString();
    const ConstTensorView input{{DataType::kFloat32, {1, 4}}, x.data()};
    auto outputs = runtime().Execute(*id, {&input, 1});
    ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
    const auto y = (*outputs)[0].Elements<float>();
    std::string mismatch;
    EXPECT_TRUE(AllClose({y.begin(), y.end()}, expected, &mismatch)) << mismatch;
    auto placement = runtime().GetPlacement(*id);
    ASSERT_TRUE(placement.ok());
    for (const LayerPlacement& layer : *placement)
      EXPECT_EQ(layer.backend_id, preferences[0]) << layer.node;
    ASSERT_TRUE(runtime().UnloadNetwork(*id).ok());
  }
}

}  // namespace
}  // namespace backplane::cpu_acc_test
