// The batch rule (row_independence.hpp): the generated catalogue of models on both sides of it,
// every supported operator covered, each refusal naming its node and why, and the rule failing
// closed on what it does not know.
#include "backplane/onnx/row_independence.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "batch_catalogue.hpp"
#include "model_builder.hpp"
#include "test_util.hpp"

namespace backplane::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(BatchIndependenceTest, RefusesSoftmaxOverTheBatchAxis) {
  ModelBuilder model;
  model.Input("x", {-1, -1}).Output("y", {-1, -1});
  model.NameDimension("x", 1, "M").NameDimension("y", 1, "M");
  SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", 0);
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const Status status = CheckRowsIndependent(*network);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "node 'sm' (Softmax) normalises over axis 0, the batch dimension: rows of different "
            "requests would mix");
}

TEST(BatchIndependenceTest, AcceptsSoftmaxOverTheLastAxis) {
  ModelBuilder model;
  model.Input("x", {-1, 4}).Output("y", {-1, 4});
  model.Node("Softmax", {"x"}, {"y"}, "sm");  // opset 13: axis -1
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_TRUE(CheckRowsIndependent(*network).ok()) << CheckRowsIndependent(*network).ToString();
}

TEST(BatchIndependenceTest, EveryCatalogueModelIsRefusedNamingItsNodeOrAccepted) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  // Several catalogues: each draws other dimensions, axes and chains.
  for (uint64_t round = 0; round < 20; ++round) {
    for (const BatchCase& batch_case : GenerateBatchCatalogue(seed + round)) {
      SCOPED_TRACE("round " + std::to_string(round) + ", model " + batch_case.name);
      const std::string bytes = batch_case.model;
      auto network =
          ImportOnnxModel(std::as_bytes(std::span(bytes.data(), bytes.size())), batch_case.name);
      ASSERT_TRUE(network.ok()) << network.error().ToString();
      const Status status = CheckRowsIndependent(*network);
      if (batch_case.safe()) {
        EXPECT_TRUE(status.ok()) << status.ToString();
        continue;
      }
      ASSERT_FALSE(status.ok());
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(), StartsWith(batch_case.refused + " "));
      EXPECT_THAT(status.message(), HasSubstr(batch_case.reason));
    }
  }
}

// Every operator import accepts has a safe model in the catalogue, and every one that can mix
// or move rows has an unsafe one too. Those that cannot (one input, worked row by row on
// dimension 0 as N) have none: there is no unsafe form of them to build.
TEST(BatchIndependenceTest, TheCatalogueCoversEverySupportedOperatorOnBothSides) {
  const std::set<std::string> supported = {"Add",           "Sub",
                                           "Mul",           "Div",
                                           "Relu",          "LeakyRelu",
                                           "Sigmoid",       "HardSigmoid",
                                           "HardSwish",     "Tanh",
                                           "Clip",          "Softmax",
                                           "Gemm",          "MatMul",
                                           "Conv",          "MaxPool",
                                           "AveragePool",   "GlobalAveragePool",
                                           "GlobalMaxPool", "BatchNormalization",
                                           "Flatten",       "Reshape",
                                           "Transpose",     "Concat",
                                           "Identity",      "Dropout",
                                           "Pad",           "Constant",
                                           "QuantizeLinear"};  // with its DequantizeLinear
  const std::set<std::string> row_by_row_only = {
      "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish",         "Tanh",
      "Clip", "Identity",  "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::map<std::string, std::pair<int, int>> counts;  // op type → safe, unsafe
  for (const BatchCase& batch_case : GenerateBatchCatalogue(seed)) {
    auto& [safe, unsafe] = counts[batch_case.op_type];
    ++(batch_case.safe() ? safe : unsafe);
  }
  for (const std::string& op : supported) {
    EXPECT_GT(counts[op].first, 0) << op << " has no safe model";
    if (!row_by_row_only.contains(op)) {
      EXPECT_GT(counts[op].second, 0) << op << " has no unsafe model";
    }
  }
  EXPECT_GT(counts["chain"].first, 0);
  EXPECT_GT(counts["chain"].second, 0);
}

// An operator without a rule (Gather imports, but has no batch rule yet).
TEST(BatchIndependenceTest, AnOperatorWithoutARuleIsRefused) {
  Network network;
  network.name = "gather";
  network.opset = 13;
  network.inputs = {{"x", {DataType::kFloat32, {-1, 4}}}};
  network.outputs = {{"y", {DataType::kFloat32, {-1, 4}}}};
  Tensor indices(TensorInfo{DataType::kInt64, {1}});
  indices.Elements<int64_t>()[0] = 0;
  network.constants.emplace("indices", std::move(indices));
  network.nodes = {{.name = "g",
                    .op_type = "Gather",
                    .attributes = {{"axis", int64_t{1}}},
                    .inputs = {"x", "indices"},
                    .outputs = {"y"}}};
  network.values = {{"x", {DataType::kFloat32, {-1, 4}}},
                    {"indices", {DataType::kInt64, {1}}},
                    {"y", {DataType::kFloat32, {-1, 1}}}};
  const Status status = CheckRowsIndependent(network);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "node 'g' (Gather) has no rule for the batch dimension, so its rows cannot be shown "
            "to stay apart");
}

TEST(BatchIndependenceTest, AScalarInputHasNoBatch) {
  ModelBuilder model;
  model.Input("x", {-1, 3}).Input("s", {});
  model.Node("Mul", {"x", "s"}, {"y"}, "m");
  model.OutputNoShape("y");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(CheckRowsIndependent(*network).message(),
            "graph input 's' is a scalar (shape []), which has no batch dimension");
}

// A Reshape whose -1 computes dimension 0 keeps the batch only when the rest of a row is known.
TEST(BatchIndependenceTest, AReshapeOverAnUnknownRowDimensionIsRefused) {
  ModelBuilder model;
  model.Input("x", {-1, -1, 4}).OutputNoShape("y");
  model.NameDimension("x", 1, "M");
  model.Int64Initializer("shape", {2}, {-1, 4});
  model.Node("Reshape", {"x", "shape"}, {"y"}, "r");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_THAT(CheckRowsIndependent(*network).message(),
              HasSubstr("node 'r' (Reshape) reshapes [?,?,4] to [-1,4] computing dimension 0, "
                        "and dimension 1 of a row is unknown at load"));
}

}  // namespace
}  // namespace backplane::testing
