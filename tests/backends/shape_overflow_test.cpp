// Shapes whose element count overflows (issue 23), on both first-party backends: a crafted model
// is refused by the import whichever backend it would run on, a hand-built Network that skips
// import is refused by the runtime, and each backend refuses such a description and such a request
// by itself instead of running a kernel over a buffer its wrapped count sized. Before the checks,
// Gemm and Conv on either backend and Softmax(axis=0) on CpuRef ended the process with SIGSEGV.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "cpu_acc_test_util.hpp"
#include "model_builder.hpp"

namespace backplane::cpu_acc_test {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

// 2^62 + 1: times 4 it is 2^64 + 4, which wraps to 4 in int64 arithmetic.
constexpr int64_t kWrap = (int64_t{1} << 62) + 1;

using ShapeOverflowTest = CpuAccTest;

// One layer after a Reshape of x[1,4] to a shape whose count wraps to 4; `shape` and the layer
// are what the attack run used.
struct Follower {
  std::string op_type;
  Ints reshape_to;
};

const std::vector<Follower>& Followers() {
  static const std::vector<Follower> followers = {{"Gemm", {kWrap, 4}},
                                                  {"Conv", {1, 1, kWrap, 4}},
                                                  {"Softmax", {kWrap, 4}},
                                                  {"Transpose", {kWrap, 4}}};
  return followers;
}

ModelBuilder CraftedModel(const Follower& follower) {
  ModelBuilder model;
  model.Input("x", {1, 4}).OutputNoShape("y");
  model.Int64Initializer("shape", {static_cast<int64_t>(follower.reshape_to.size())},
                         follower.reshape_to);
  model.Node("Reshape", {"x", "shape"}, {"r"}, "reshape");
  if (follower.op_type == "Gemm") {
    model.FloatInitializer("w", {4, 4});
    model.Node("Gemm", {"r", "w"}, {"y"}, "follower");
  } else if (follower.op_type == "Conv") {
    model.FloatInitializer("w", {1, 1, 1, 1});
    model.Node("Conv", {"r", "w"}, {"y"}, "follower");
  } else if (follower.op_type == "Softmax") {
    SetInt(model.Node("Softmax", {"r"}, {"y"}, "follower"), "axis", 0);
  } else {
    SetInts(model.Node("Transpose", {"r"}, {"y"}, "follower"), "perm", {1, 0});
  }
  return model;
}

const std::vector<std::vector<std::string>>& Preferences() {
  static const std::vector<std::vector<std::string>> preferences = {{"CpuRef"},
                                                                    {"CpuAcc", "CpuRef"}};
  return preferences;
}

// The crafted model never reaches a backend: the import refuses the Reshape itself, whichever
// backend the model prefers (the hand-built networks below and the backends' own tests take the
// checks after it). Asserted at the import, so that a refusal coming from elsewhere fails this.
TEST_F(ShapeOverflowTest, CraftedReshapeIsRefusedByTheImportBeforeAnyBackend) {
  for (const auto& follower : Followers()) {
    SCOPED_TRACE(follower.op_type);
    auto network = CraftedModel(follower).Import();
    ASSERT_FALSE(network.ok()) << "imported";
    EXPECT_EQ(network.error().code(), StatusCode::kInvalidArgument) << network.error().ToString();
    EXPECT_THAT(network.error().message(),
                AllOf(HasSubstr("node 'reshape' (Reshape)"), HasSubstr("overflows")));
  }
}

// A Network built by hand, as an embedder may: import never saw it.
Network HandBuiltGemm(const Shape& x_shape) {
  Network network;
  network.name = "hand-built";
  network.opset = 13;
  network.inputs = {{"x", {DataType::kFloat32, x_shape}}};
  network.outputs = {{"y", {DataType::kFloat32, {x_shape[0], 4}}}};
  network.constants.emplace("w", Tensor(TensorInfo{DataType::kFloat32, {4, 4}}));
  network.nodes = {{.name = "gemm", .op_type = "Gemm", .inputs = {"x", "w"}, .outputs = {"y"}}};
  network.values = {{"x", network.inputs[0].info},
                    {"w", network.constants.at("w").info()},
                    {"y", network.outputs[0].info}};
  return network;
}

TEST_F(ShapeOverflowTest, RuntimeRefusesHandBuiltNetworkThatOverflows) {
  for (const auto& preferences : Preferences()) {
    SCOPED_TRACE("preferring " + preferences[0]);
    auto id =
        runtime().LoadNetwork(HandBuiltGemm({kWrap, 4}), {.backend_preferences = preferences});
    ASSERT_FALSE(id.ok()) << "loaded";
    EXPECT_EQ(id.error().code(), StatusCode::kInvalidArgument) << id.error().ToString();
    EXPECT_THAT(id.error().message(), AllOf(HasSubstr("'x'"), HasSubstr("overflows")));
  }
}

TEST_F(ShapeOverflowTest, RuntimeRefusesRequestThatOverflowsADynamicInput) {
  for (const auto& preferences : Preferences()) {
    SCOPED_TRACE("preferring " + preferences[0]);
    auto id = runtime().LoadNetwork(HandBuiltGemm({-1, 4}), {.backend_preferences = preferences});
    ASSERT_TRUE(id.ok()) << id.error().ToString();
    const std::vector<float> x = {1, 2, 3, 4};
    const ConstTensorView input{{DataType::kFloat32, {kWrap, 4}}, x.data()};
    auto outputs = runtime().Execute(*id, {&input, 1});
    ASSERT_FALSE(outputs.ok()) << "ran";
    EXPECT_EQ(outputs.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(outputs.error().message(), AllOf(HasSubstr("'x'"), HasSubstr("overflows")));
    EXPECT_TRUE(runtime().UnloadNetwork(*id).ok());
  }
}

OperatorDesc MakeOp(std::string op_type, std::vector<Shape> inputs, std::vector<Shape> outputs,
                    AttributeMap attributes = {}) {
  OperatorDesc op;
  op.name = "crafted";
  op.op_type = std::move(op_type);
  op.attributes = std::move(attributes);
  for (auto& shape : inputs) {
    op.inputs.push_back({DataType::kFloat32, std::move(shape)});
    op.constant_inputs.push_back(nullptr);
  }
  for (auto& shape : outputs)
    op.outputs.push_back({DataType::kFloat32, std::move(shape)});
  return op;
}

// The descriptions the crafted models gave the backends: every shape's count wraps to 4 or 16.
std::vector<OperatorDesc> CraftedDescriptions() {
  return {MakeOp("Gemm", {{kWrap, 4}, {4, 4}}, {{kWrap, 4}}),
          MakeOp("Conv", {{1, 1, kWrap, 4}, {1, 1, 1, 1}}, {{1, 1, kWrap, 4}}),
          MakeOp("Softmax", {{kWrap, 4}}, {{kWrap, 4}}, {{"axis", int64_t{0}}}),
          MakeOp("Transpose", {{kWrap, 4}}, {{4, kWrap}}, {{"perm", Ints{1, 0}}})};
}

TEST_F(ShapeOverflowTest, BackendsRefuseDescriptionsThatOverflow) {
  for (loader::BackendInstance* backend : {&cpu_ref(), &cpu_acc()}) {
    for (const OperatorDesc& op : CraftedDescriptions()) {
      SCOPED_TRACE(op.op_type + " on " + backend->id());
      Status supported = backend->IsSupported(op);
      ASSERT_FALSE(supported.ok()) << "supported";
      EXPECT_EQ(supported.code(), StatusCode::kInvalidArgument) << supported.ToString();
      EXPECT_THAT(supported.message(), AllOf(HasSubstr("'crafted'"), HasSubstr("overflows")));
      auto workload = backend->CreateWorkload(op);
      ASSERT_FALSE(workload.ok()) << "created";
      EXPECT_THAT(workload.error().message(), HasSubstr("overflows"));
    }
  }
}

TEST_F(ShapeOverflowTest, BackendsRefuseRequestsThatOverflow) {
  // Dynamic descriptions that the backends accept, then a request whose shapes wrap to 4 with a
  // 4-element buffer behind them.
  const std::vector<OperatorDesc> dynamic = {
      MakeOp("Gemm", {{-1, 4}, {4, 4}}, {{-1, 4}}),
      MakeOp("Softmax", {{-1, 4}}, {{-1, 4}}, {{"axis", int64_t{0}}}),
      MakeOp("Transpose", {{-1, 4}}, {{4, -1}}, {{"perm", Ints{1, 0}}})};
  std::vector<float> data(16, 1.0f);
  for (loader::BackendInstance* backend : {&cpu_ref(), &cpu_acc()}) {
    for (const OperatorDesc& op : dynamic) {
      SCOPED_TRACE(op.op_type + " on " + backend->id());
      auto workload = backend->CreateWorkload(op);
      if (!workload.ok()) {
        // Declining a dynamic description is fine (CpuAcc wants a constant W for Gemm).
        EXPECT_EQ(workload.error().code(), StatusCode::kUnimplemented)
            << workload.error().ToString();
        continue;
      }
      std::vector<ConstTensorView> inputs = {{{DataType::kFloat32, {kWrap, 4}}, data.data()}};
      if (op.op_type == "Gemm")
        inputs.push_back({{DataType::kFloat32, {4, 4}}, data.data()});
      const Shape out = op.op_type == "Transpose" ? Shape{4, kWrap} : Shape{kWrap, 4};
      const TensorView output{{DataType::kFloat32, out}, data.data()};
      Status status = (*workload)->Execute(inputs, {&output, 1});
      ASSERT_FALSE(status.ok()) << "ran";
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
      EXPECT_THAT(status.message(), HasSubstr("overflows"));
    }
  }
}

// A pool whose kernel dims each fit but whose 2^63 taps do not: a huge stride keeps the output at
// one position. Before the checks CpuRef's tap count wrapped and the pool returned "OK" without
// visiting a single tap.
void ExpectWindowRefused(loader::BackendInstance& backend) {
  const int64_t k = int64_t{1} << 21;
  const int64_t stride = int64_t{1} << 40;
  const OperatorDesc op = MakeOp("AveragePool", {{1, 1, 1, 1, 1}}, {{1, 1, 1, 1, 1}},
                                 {{"kernel_shape", Ints{k, k, k}},
                                  {"pads", Ints{k, k, k, k, k, k}},
                                  {"strides", Ints{stride, stride, stride}}});
  Status refused = backend.IsSupported(op);
  if (refused.ok()) {
    auto workload = backend.CreateWorkload(op);
    if (!workload.ok()) {
      refused = workload.error();
    } else {
      float x = 1.0f, y = 0.0f;
      const ConstTensorView input{op.inputs[0], &x};
      const TensorView output{op.outputs[0], &y};
      refused = (*workload)->Execute({&input, 1}, {&output, 1});
    }
  }
  ASSERT_FALSE(refused.ok()) << "ran";
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("overflow"));
}

TEST_F(ShapeOverflowTest, CpuRefRefusesWindowWhoseTapCountOverflows) {
  ExpectWindowRefused(cpu_ref());
}

TEST_F(ShapeOverflowTest, CpuAccRefusesWindowWhoseTapCountOverflows) {
  ExpectWindowRefused(cpu_acc());
}

}  // namespace
}  // namespace backplane::cpu_acc_test
