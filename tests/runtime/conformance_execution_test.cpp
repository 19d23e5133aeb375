// ONNX backend conformance cases and the real MNIST model, run end to end on CpuRef through the
// Runtime: import, placement, execution, comparison with the expected outputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;

const fs::path kData = BACKPLANE_SHARED_DATA;

std::vector<std::string> ConformanceCases() {
  std::vector<std::string> cases;
  std::error_code error;
  for (fs::directory_iterator it(kData / "onnx-node", error), end; !error && it != end;
       it.increment(error)) {
    cases.push_back(it->path().filename().string());
  }
  std::sort(cases.begin(), cases.end());
  if (cases.empty())
    cases.push_back("no_data");  // one case that skips, so the suite says why
  return cases;
}

// A runtime with only CpuRef, shared by the cases of one test program.
Runtime& CpuRefRuntime() {
  static testing::TempDir dir;
  static std::unique_ptr<Runtime> runtime = [] {
    fs::create_symlink(testing::CpuRefBackend(), dir / "Backplane_CpuRef_backend.so");
    return Runtime::Create(
               {.backend_paths = std::vector{dir.path()}, .default_preferences = {"CpuRef"}})
        .value();
  }();
  return *runtime;
}

// atol 1e-4 + rtol 1e-3 (the tolerance), on every element.
void ExpectClose(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.info(), expected.info()) << what;
  const auto got = actual.Elements<float>();
  const auto want = expected.Elements<float>();
  int reported = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float tolerance = 1e-4f + 1e-3f * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tolerance) && reported++ < 5) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
}

class ConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceTest, MatchesTheExpectedOutputsOnCpuRef) {
  BACKPLANE_REQUIRE_PATH(kData / "onnx-node");
  auto test_case = LoadOnnxTestCase(kData / "onnx-node" / GetParam());
  ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
  Runtime& runtime = CpuRefRuntime();
  auto id = runtime.LoadNetwork(std::move(test_case.value().network));
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  std::vector<ConstTensorView> inputs;
  for (const auto& input : test_case->inputs)
    inputs.push_back(input.View());
  auto outputs = runtime.Execute(id.value(), inputs);
  ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
  ASSERT_EQ(outputs->size(), test_case->expected_outputs.size());
  for (std::size_t i = 0; i < outputs->size(); ++i) {
    ExpectClose((*outputs)[i], test_case->expected_outputs[i], "output " + std::to_string(i));
  }
  EXPECT_TRUE(runtime.UnloadNetwork(id.value()).ok());
}

INSTANTIATE_TEST_SUITE_P(OnnxNode, ConformanceTest, ::testing::ValuesIn(ConformanceCases()),
                         [](const auto& info) { return info.param; });

TEST(MnistTest, PredictsTheLabelOfEachTestImage) {
  const fs::path mnist = kData / "models" / "mnist";
  BACKPLANE_REQUIRE_PATH(mnist);
  Runtime& runtime = CpuRefRuntime();
  std::optional<NetworkId> id;
  for (int set = 0; set < 3; ++set) {
    auto test_case = LoadOnnxTestCase(mnist, set);
    ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
    if (!id)
      id = runtime.LoadNetwork(std::move(test_case.value().network)).value();
    std::vector<ConstTensorView> inputs{test_case->inputs[0].View()};
    auto outputs = runtime.Execute(*id, inputs);
    ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
    const auto logits = (*outputs)[0].Elements<float>();
    const auto label = test_case->expected_outputs[0].Elements<float>();  // one-hot
    const auto predicted = std::max_element(logits.begin(), logits.end()) - logits.begin();
    const auto expected = std::max_element(label.begin(), label.end()) - label.begin();
    EXPECT_EQ(predicted, expected) << "test_data_set_" << set;
  }
  auto placement = runtime.GetPlacement(*id).value();
  for (const auto& layer : placement)
    EXPECT_EQ(layer.backend_id, "CpuRef") << layer.node;
}

}  // namespace
}  // namespace backplane
