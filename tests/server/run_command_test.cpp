// `backplane run`, run as a user runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "backplane/onnx/network.hpp"
#include "onnx/model_builder.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

const fs::path kData = BACKPLANE_SHARED_DATA;

// The real executable, as a user runs it (stdout and stderr).
testing::CommandResult RunBackplane(const std::string& arguments) {
  return testing::RunCommand(std::string(BACKPLANE_EXECUTABLE) + " " + arguments + " 2>&1");
}

// Backends: a directory holding only CpuRef.
class RunCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BACKPLANE_REQUIRE_PATH(kData / "onnx-node");
    fs::create_symlink(testing::CpuRefBackend(), backends_ / "Backplane_CpuRef_backend.so");
  }
  std::string Backends() const { return "--backends " + backends_.path().string(); }
  testing::TempDir backends_;
};

TEST_F(RunCommandTest, TestDataPassesAndSaysWhereEachLayerRan) {
  const fs::path gemm = kData / "onnx-node" / "test_gemm_all_attributes";
  testing::CommandResult result =
      RunBackplane("run " + (gemm / "model.onnx").string() + " --test-data " + gemm.string() + " " +
                   Backends() + " --repeat 3");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("Gemm                 on CpuRef (generation"));
  EXPECT_THAT(result.output, HasSubstr("over 3 run(s)"));
  EXPECT_THAT(result.output, HasSubstr("test_data_set_0 output 0 (y): pass, max abs error"));
}

TEST_F(RunCommandTest, MismatchingTestDataFailsWithExitOne) {
  // MNIST's expected outputs are one-hot labels, not logits: a comparison must fail.
  const fs::path mnist = kData / "models" / "mnist";
  testing::CommandResult result = RunBackplane("run " + (mnist / "model.onnx").string() +
                                               " --test-data " + mnist.string() + " " + Backends());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("FAIL, max abs error"));
  EXPECT_THAT(result.output, HasSubstr("differ from the test data beyond atol"));
}

TEST_F(RunCommandTest, WritesOutputsThatMatchTheExpectedOnes) {
  const fs::path conv = kData / "onnx-node" / "test_conv_with_strides_padding";
  testing::TempDir out;
  testing::CommandResult result =
      RunBackplane("run " + (conv / "model.onnx").string() + " --input " +
                   (conv / "test_data_set_0" / "input_0.pb").string() + " --input " +
                   (conv / "test_data_set_0" / "input_1.pb").string() + " --output-dir " +
                   out.path().string() + " " + Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto written = ReadTensorProtoFile(out / "output_0.pb");
  auto expected = ReadTensorProtoFile(conv / "test_data_set_0" / "output_0.pb");
  ASSERT_TRUE(written.ok() && expected.ok());
  ASSERT_EQ(written->info(), expected->info());
  const auto a = written->Elements<float>();
  const auto b = expected->Elements<float>();
  for (std::size_t i = 0; i < b.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-4 + 1e-3 * std::abs(b[i]));
}

TEST_F(RunCommandTest, BadModelsAndInputsExitOneNamingTheProblem) {
  testing::TempDir dir;
  testing::WriteFile(dir / "model.onnx", "not a protobuf at all");
  testing::CommandResult garbage =
      RunBackplane("run " + (dir / "model.onnx").string() + " " + Backends());
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_THAT(garbage.output, HasSubstr("is not a valid ONNX model"));

  const fs::path relu = kData / "onnx-node" / "test_relu";
  testing::CommandResult missing_input =
      RunBackplane("run " + (relu / "model.onnx").string() + " " + Backends());
  EXPECT_EQ(missing_input.exit_code, 1);
  EXPECT_THAT(missing_input.output, HasSubstr("has 1 input(s) (x), 0 input file(s) given"));

  testing::CommandResult unknown_backend =
      RunBackplane("run " + (relu / "model.onnx").string() + " --prefer GpuAcc --input " +
                   (relu / "test_data_set_0" / "input_0.pb").string() + " " + Backends());
  EXPECT_EQ(unknown_backend.exit_code, 1);
  EXPECT_THAT(unknown_backend.output, HasSubstr("GpuAcc names no backend"));
}

// SDK 1.1: a run of layers that its backend compiled into one workload still prints one line per
// original layer, with what the backend did to it after the usual prefix; a layer that ran on
// its own prints exactly as before.
TEST_F(RunCommandTest, CompiledLayersKeepOneLineEachAndSayTheyWereFused) {
  fs::create_symlink(testing::Fixture("Subgraph"), backends_ / "Test_Subgraph_backend.so");
  testing::TempDir dir;
  testing::ModelBuilder model;  // y = (Relu(x) + x)^2: Relu and Add on TestSubgraph, Mul on CpuRef
  model.Input("x", {4}).Output("y", {4});
  model.Node("Relu", {"x"}, {"h"}, "relu");
  model.Node("Add", {"h", "x"}, {"s"}, "add");
  model.Node("Mul", {"s", "s"}, {"y"}, "square");
  testing::WriteFile(dir / "model.onnx", model.Serialize());
  Tensor x(TensorInfo{DataType::kFloat32, {4}});
  const float values[] = {-2, -1, 1, 2};
  std::memcpy(x.data(), values, sizeof(values));
  ASSERT_TRUE(WriteTensorProtoFile(dir / "x.pb", x, "x").ok());

  testing::CommandResult result = RunBackplane(
      "run " + (dir / "model.onnx").string() + " --input " + (dir / "x.pb").string() +
      " --prefer TestSubgraph,CpuRef --output-dir " + (dir / "out").string() + " " + Backends());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              ContainsRegex("layer relu +Relu +on TestSubgraph \\(generation [0-9]+\\) "
                            "\\[fused into relu \\(Relu\\+Add\\)\\]\n"));
  EXPECT_THAT(result.output,
              ContainsRegex("layer add +Add +on TestSubgraph \\(generation [0-9]+\\) "
                            "\\[fused into relu \\(Relu\\+Add\\)\\]\n"));
  EXPECT_THAT(result.output,
              ContainsRegex("layer square +Mul +on CpuRef \\(generation [0-9]+\\)\n"));
  auto y = ReadTensorProtoFile(dir / "out" / "output_0.pb");
  ASSERT_TRUE(y.ok()) << y.error().ToString();
  EXPECT_THAT(y->Elements<float>(), ::testing::ElementsAre(4, 1, 4, 16));
}

TEST_F(RunCommandTest, UsageErrorsExitTwo) {
  EXPECT_EQ(RunBackplane("run").exit_code, 2);
  EXPECT_EQ(RunBackplane("run model.onnx --repeat 0").exit_code, 2);
  EXPECT_EQ(RunBackplane("run model.onnx --input a.pb --test-data dir").exit_code, 2);
}

}  // namespace
}  // namespace backplane
