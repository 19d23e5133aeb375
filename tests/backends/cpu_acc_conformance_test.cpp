// The ONNX conformance cases and MNIST end to end through Runtime with the preference
// CpuAcc, CpuRef (as tests/runtime/conformance_execution_test.cpp runs them on CpuRef alone):
// every case must pass at atol 1e-4 + rtol 1e-3 with every layer on CpuAcc, but for the cases
// below, whose layers CpuAcc declines on purpose (they must then run on CpuRef): a case CpuAcc
// started declining would otherwise pass on CpuRef unseen.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "backplane/onnx/network.hpp"
#include "cpu_acc_test_util.hpp"
#include "test_util.hpp"

namespace backplane::cpu_acc_test {
namespace {

namespace fs = std::filesystem;

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

// Case → why CpuAcc declines its layers.
const std::map<std::string, std::string, std::less<>> kDeclinedByCpuAcc = {
    {"test_reshape_allowzero_reordered",
     "its shape is a graph input: CpuAcc takes constant shapes only (op_support.cpp, "
     "CheckReshape)"},
};

class CpuAccConformanceTest : public CpuAccTest,
                              public ::testing::WithParamInterface<std::string> {};

TEST_P(CpuAccConformanceTest, MatchesTheExpectedOutputsPreferringCpuAcc) {
  BACKPLANE_REQUIRE_PATH(kData / "onnx-node");
  auto test_case = LoadOnnxTestCase(kData / "onnx-node" / GetParam());
  ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
  auto id = runtime().LoadNetwork(std::move(test_case.value().network));
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  std::vector<ConstTensorView> inputs;
  for (const auto& input : test_case->inputs)
    inputs.push_back(input.View());
  auto outputs = runtime().Execute(id.value(), inputs);
  ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
  ASSERT_EQ(outputs->size(), test_case->expected_outputs.size());
  std::string placement;
  for (const auto& layer : runtime().GetPlacement(id.value()).value())
    placement += " " + layer.op_type + "@" + layer.backend_id;
  RecordProperty("placement", placement);
  const auto declined = kDeclinedByCpuAcc.find(GetParam());
  for (const auto& layer : runtime().GetPlacement(id.value()).value()) {
    if (declined == kDeclinedByCpuAcc.end())
      EXPECT_EQ(layer.backend_id, "CpuAcc") << layer.node << " (placement:" << placement << ")";
    else
      EXPECT_EQ(layer.backend_id, "CpuRef") << layer.node << ": " << declined->second;
  }
  for (std::size_t i = 0; i < outputs->size(); ++i) {
    ExpectClose((*outputs)[i], test_case->expected_outputs[i],
                "output " + std::to_string(i) + " (placement:" + placement + ")");
  }
  EXPECT_TRUE(runtime().UnloadNetwork(id.value()).ok());
}

INSTANTIATE_TEST_SUITE_P(OnnxNode, CpuAccConformanceTest, ::testing::ValuesIn(ConformanceCases()),
                         [](const auto& info) { return info.param; });

using CpuAccMnistTest = CpuAccTest;

TEST_F(CpuAccMnistTest, PredictsTheLabelsWithEveryLayerOnCpuAcc) {
  const fs::path mnist = kData / "models" / "mnist";
  BACKPLANE_REQUIRE_PATH(mnist);
  std::optional<NetworkId> id;
  for (int set = 0; set < 3; ++set) {
    auto test_case = LoadOnnxTestCase(mnist, set);
    ASSERT_TRUE(test_case.ok()) << test_case.error().ToString();
    if (!id)
      id = runtime().LoadNetwork(std::move(test_case.value().network)).value();
    std::vector<ConstTensorView> inputs{test_case->inputs[0].View()};
    auto outputs = runtime().Execute(*id, inputs);
    ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
    const auto logits = (*outputs)[0].Elements<float>();
    const auto label = test_case->expected_outputs[0].Elements<float>();  // one-hot
    const auto predicted = std::max_element(logits.begin(), logits.end()) - logits.begin();
    const auto expected = std::max_element(label.begin(), label.end()) - label.begin();
    EXPECT_EQ(predicted, expected) << "test_data_set_" << set;
  }
  for (const auto& layer : runtime().GetPlacement(*id).value())
    EXPECT_EQ(layer.backend_id, "CpuAcc") << layer.node;
  EXPECT_TRUE(runtime().UnloadNetwork(*id).ok());
}

// The logits, not only the argmax: CpuAcc per layer against CpuRef per layer.
TEST_F(CpuAccMnistTest, LogitsMatchCpuRef) {
  const fs::path mnist = kData / "models" / "mnist";
  BACKPLANE_REQUIRE_PATH(mnist);
  auto reference_case = LoadOnnxTestCase(mnist, 0);
  auto accelerated_case = LoadOnnxTestCase(mnist, 0);
  ASSERT_TRUE(reference_case.ok() && accelerated_case.ok());
  auto reference = runtime().LoadNetwork(std::move(reference_case.value().network),
                                         {.backend_preferences = {"CpuRef"}});
  auto accelerated = runtime().LoadNetwork(std::move(accelerated_case.value().network));
  ASSERT_TRUE(reference.ok()) << reference.error().ToString();
  ASSERT_TRUE(accelerated.ok()) << accelerated.error().ToString();
  std::vector<ConstTensorView> inputs{reference_case->inputs[0].View()};
  auto want = runtime().Execute(reference.value(), inputs);
  auto got = runtime().Execute(accelerated.value(), inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  ExpectClose((*got)[0], (*want)[0], "logits");
  EXPECT_TRUE(runtime().UnloadNetwork(reference.value()).ok());
  EXPECT_TRUE(runtime().UnloadNetwork(accelerated.value()).ok());
}

}  // namespace
}  // namespace backplane::cpu_acc_test
