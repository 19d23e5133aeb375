// Every ONNX conformance case and the MNIST model import, and their inferred output shapes equal
// those of the expected outputs in test_data_set_0 — both at import and through InferShapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

const std::filesystem::path kSharedData = BACKPLANE_SHARED_DATA;

// The case directories; one empty path when the data is absent, so that the test skips with a
// message instead of silently instantiating nothing.
std::vector<std::filesystem::path> CaseDirectories() {
  std::vector<std::filesystem::path> cases;
  std::error_code error;
  const auto node_dir = kSharedData / "onnx-node";
  if (std::filesystem::is_directory(node_dir, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(node_dir, error)) {
      if (std::filesystem::exists(entry.path() / "model.onnx"))
        cases.push_back(entry.path());
    }
  }
  std::sort(cases.begin(), cases.end());
  if (std::filesystem::exists(kSharedData / "models/mnist/model.onnx"))
    cases.push_back(kSharedData / "models/mnist");
  if (cases.empty())
    cases.emplace_back();
  return cases;
}

// "test_maxpool_2d_ceil" → "Maxpool2dCeil": test names without underscores.
std::string CaseName(const ::testing::TestParamInfo<std::filesystem::path>& info) {
  std::string name = info.param.filename().string();
  if (name.empty())
    return "DataMissing";
  if (name.starts_with("test_"))
    name = name.substr(5);
  std::string result;
  bool upper = true;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) {
      upper = true;
      continue;
    }
    result += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return result;
}

class NetworkConformanceTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(NetworkConformanceTest, InfersExpectedOutputShapes) {
  BACKPLANE_REQUIRE_PATH(kSharedData / "onnx-node");
  auto test_case = LoadOnnxTestCase(GetParam());
  ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
  const Network& network = test_case->network;
  ASSERT_EQ(network.outputs.size(), test_case->expected_outputs.size());

  std::vector<TensorInfo> input_infos;
  for (const Tensor& input : test_case->inputs)
    input_infos.push_back(input.info());
  auto values = InferShapes(network, input_infos);
  ASSERT_TRUE(values.ok()) << values.error().ToString();

  for (std::size_t i = 0; i < network.outputs.size(); ++i) {
    const TensorInfo& expected = test_case->expected_outputs[i].info();
    const ValueInfo& output = network.outputs[i];
    EXPECT_EQ(output.info, expected)
        << "output " << output.name << " at import: " << ToString(output.info.shape) << " vs "
        << ToString(expected.shape);
    EXPECT_EQ(network.values.at(output.name), expected) << "output " << output.name;
    EXPECT_EQ(values->at(output.name), expected) << "output " << output.name << " per request";
  }
  // Fixed input shapes leave nothing dynamic.
  for (const auto& [name, info] : network.values) {
    for (int64_t dim : info.shape)
      EXPECT_GE(dim, 0) << "value " << name << " " << ToString(info.shape);
  }
}

INSTANTIATE_TEST_SUITE_P(OnnxNode, NetworkConformanceTest, ::testing::ValuesIn(CaseDirectories()),
                         CaseName);

TEST(NetworkConformanceCountTest, AllCasesArePresent) {
  BACKPLANE_REQUIRE_PATH(kSharedData / "onnx-node");
  // 104 operator cases and MNIST: a lost case would otherwise shrink the suite silently.
  EXPECT_EQ(CaseDirectories().size(), 105u);
}

TEST(NetworkMnistTest, ImportsWithFoldedWeightsAndFixedShapes) {
  const auto path = kSharedData / "models/mnist/model.onnx";
  BACKPLANE_REQUIRE_PATH(path);
  auto network = ImportOnnxFile(path);
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  ASSERT_EQ(network->inputs.size(), 1u);
  EXPECT_EQ(network->inputs[0].name, "Input3");
  EXPECT_EQ(network->inputs[0].info, (TensorInfo{DataType::kFloat32, {1, 1, 28, 28}}));
  ASSERT_EQ(network->outputs.size(), 1u);
  EXPECT_EQ(network->outputs[0].info, (TensorInfo{DataType::kFloat32, {1, 10}}));
  EXPECT_EQ(network->opset, 13);
  EXPECT_FALSE(network->constants.empty());
  for (const Node& node : network->nodes)
    EXPECT_NE(node.op_type, "Constant");
}

}  // namespace
}  // namespace backplane
