// A tiny BERT-like encoder layer as torch.onnx.export writes one (scripts/make_tiny_encoder.py:
// int64 ids and mask of symbolic batch and sequence, Gather embeddings, Shape chains feeding
// Slice and Reshape, LayerNormalization and its decomposed form, 4-D batched attention with the
// mask built by Unsqueeze/Cast/Sub/Mul (opset 17) or Equal/Expand/Where (opset 14), Softmax, Erf
// GELU, a Tanh pooler), imported and run through Runtime on CpuRef at three (batch, sequence)
// shapes against the numpy reference the script wrote. And malformed requests and models answered
// with an error naming the node: a token id out of the vocabulary, a mask of another length than
// the ids, a Reshape whose target, computed from the input's shape, has the wrong size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "cpu_acc_backend_path.hpp"
#include "onnx/model_builder.hpp"
#include "test_util.hpp"

namespace backplane {
namespace encoder_network_test {
namespace {

namespace fs = std::filesystem;
using ::backplane::testing::ModelBuilder;
using ::testing::AllOf;
using ::testing::HasSubstr;

const fs::path kEncoder = fs::path(BACKPLANE_SOURCE_DIR) / "tests/data/tiny_encoder";

class EncoderNetworkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_symlink(testing::CpuRefBackend(), dir_ / "Backplane_CpuRef_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{dir_.path()}});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
  }
  NetworkId Load(Network network) {
    auto id = runtime_->LoadNetwork(std::move(network), {.backend_preferences = {"CpuRef"}});
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    return id.ok() ? id.value() : NetworkId{};
  }
  static std::vector<ConstTensorView> Views(const std::vector<Tensor>& tensors) {
    std::vector<ConstTensorView> views;
    for (const Tensor& tensor : tensors)
      views.push_back(tensor.View());
    return views;
  }

  testing::TempDir dir_;
  std::unique_ptr<Runtime> runtime_;
};

Tensor Read(const fs::path& path) {
  auto tensor = ReadTensorProtoFile(path);
  EXPECT_TRUE(tensor.ok()) << tensor.error().ToString();
  return tensor.ok() ? std::move(tensor).value() : Tensor{};
}

// Opset 17 (LayerNormalization, an additive mask) and opset 14 (layer norms decomposed, the
// mask applied by Equal, Expand and Where).
class EncoderVariantTest : public EncoderNetworkTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(EncoderVariantTest, RunsOnCpuRefAsTheNumpyReferenceAtEveryShape) {
  const fs::path dir = kEncoder.parent_path() / GetParam();
  auto network = ImportOnnxFile(dir / "model.onnx");
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  ASSERT_EQ(network->inputs.size(), 2u);
  EXPECT_EQ(network->inputs[0].info, (TensorInfo{DataType::kInt64, {-1, -1}}));
  const NetworkId id = Load(std::move(network).value());
  for (const auto& layer : runtime_->GetPlacement(id).value())
    EXPECT_EQ(layer.backend_id, "CpuRef") << layer.node;
  for (int set = 0; set < 3; ++set) {
    const fs::path data = dir / ("test_data_set_" + std::to_string(set));
    const std::vector<Tensor> inputs = {Read(data / "input_0.pb"), Read(data / "input_1.pb")};
    const std::vector<Tensor> expected = {Read(data / "output_0.pb"), Read(data / "output_1.pb")};
    // Twice: the first request at a shape runs before its shape program exists, the second
    // (once built) may run it.
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("data set " + std::to_string(set) + " ids " + ToString(inputs[0].info().shape) +
                   " round " + std::to_string(round));
      auto outputs = runtime_->Execute(id, Views(inputs));
      ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
      ASSERT_EQ(outputs->size(), 2u);
      for (std::size_t o = 0; o < 2; ++o) {
        ASSERT_EQ((*outputs)[o].info(), expected[o].info()) << "output " << o;
        const auto got = (*outputs)[o].Elements<float>();
        const auto want = expected[o].Elements<float>();
        for (std::size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-4f) << "output " << o << " element " << i;
      }
    }
  }
}

// CpuAcc preferred, as a server prefers it: it takes the FP32 layers it runs (the MatMuls, the
// pooler) and refuses the encoder operators and every INT64 or BOOL tensor, which fall back to
// CpuRef; the answer is the same, at every shape (its compiled runs are offered again per input
// shape).
TEST_P(EncoderVariantTest, RunsBesideCpuAccAsTheNumpyReference) {
  const fs::path cpu_acc = testing::CpuAccBackend();
  BACKPLANE_REQUIRE_PATH(cpu_acc);
  fs::create_symlink(cpu_acc, dir_ / "Backplane_CpuAcc_backend.so");
  auto runtime = Runtime::Create({.backend_paths = std::vector{dir_.path()}});
  ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
  const fs::path dir = kEncoder.parent_path() / GetParam();
  auto network = ImportOnnxFile(dir / "model.onnx");
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  auto id = (*runtime)->LoadNetwork(std::move(network).value(),
                                    {.backend_preferences = {"CpuAcc", "CpuRef"}});
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  std::map<std::string, std::string> placed;
  for (const auto& layer : (*runtime)->GetPlacement(*id).value())
    placed[layer.node] = layer.backend_id;
  EXPECT_EQ(placed["word_emb"], "CpuRef");
  EXPECT_EQ(placed["ids_shape"], "CpuRef");
  EXPECT_EQ(placed["q_mm"], "CpuAcc");
  for (int set = 0; set < 3; ++set) {
    const fs::path data = dir / ("test_data_set_" + std::to_string(set));
    const std::vector<Tensor> inputs = {Read(data / "input_0.pb"), Read(data / "input_1.pb")};
    const std::vector<Tensor> expected = {Read(data / "output_0.pb"), Read(data / "output_1.pb")};
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("data set " + std::to_string(set) + " round " + std::to_string(round));
      auto outputs = (*runtime)->Execute(*id, Views(inputs));
      ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
      for (std::size_t o = 0; o < 2; ++o) {
        ASSERT_EQ((*outputs)[o].info(), expected[o].info()) << "output " << o;
        const auto got = (*outputs)[o].Elements<float>();
        const auto want = expected[o].Elements<float>();
        for (std::size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-4f) << "output " << o << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Opsets, EncoderVariantTest,
                         ::testing::Values("tiny_encoder", "tiny_encoder_opset14"));

TEST_F(EncoderNetworkTest, MalformedRequestsAreErrorsNamingTheNode) {
  auto network = ImportOnnxFile(kEncoder / "model.onnx");
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const NetworkId id = Load(std::move(network).value());
  const std::vector<int64_t> ids = {1, 2, 50};  // the vocabulary has 50 tokens
  const std::vector<int64_t> mask = {1, 1, 1};
  const std::vector<int64_t> short_mask = {1, 1};
  const std::vector<ConstTensorView> out_of_vocabulary = {
      {{DataType::kInt64, {1, 3}}, ids.data()}, {{DataType::kInt64, {1, 3}}, mask.data()}};
  auto outputs = runtime_->Execute(id, out_of_vocabulary);
  ASSERT_FALSE(outputs.ok());
  EXPECT_EQ(outputs.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(outputs.error().message(), AllOf(HasSubstr("node 'word_emb' (Gather)"),
                                               HasSubstr("index 50"), HasSubstr("out of range")));

  const std::vector<ConstTensorView> mismatched = {{{DataType::kInt64, {1, 3}}, ids.data()},
                                                   {{DataType::kInt64, {1, 2}}, short_mask.data()}};
  outputs = runtime_->Execute(id, mismatched);
  ASSERT_FALSE(outputs.ok());
  EXPECT_EQ(outputs.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(outputs.error().message(),
              AllOf(HasSubstr("node 'scores' (Add)"), HasSubstr("do not broadcast")));
}

TEST_F(EncoderNetworkTest, AReshapeToAnImpossibleComputedShapeIsAnErrorNamingTheNode) {
  // x[N, 6] reshaped to [N, 4]: the target is Shape(x)[0] with 4, computed per request.
  ModelBuilder model;
  model.Input("x", {-1, 6}).Output("y", {-1, 4});
  model.Int64Initializer("zero", {}, {0});
  model.Int64Initializer("axes", {1}, {0});
  model.Int64Initializer("four", {1}, {4});
  model.Node("Shape", {"x"}, {"shape"}, "shape");
  model.Node("Gather", {"shape", "zero"}, {"n"}, "n");
  model.Node("Unsqueeze", {"n", "axes"}, {"n1"}, "n1");
  testing::SetInt(model.Node("Concat", {"n1", "four"}, {"target"}, "target"), "axis", 0);
  model.Node("Reshape", {"x", "target"}, {"y"}, "bad_reshape");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const NetworkId id = Load(std::move(network).value());
  const std::vector<float> x(12, 1.0f);
  const ConstTensorView input{{DataType::kFloat32, {2, 6}}, x.data()};
  for (int round = 0; round < 2; ++round) {
    auto outputs = runtime_->Execute(id, {&input, 1});
    ASSERT_FALSE(outputs.ok());
    EXPECT_EQ(outputs.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(outputs.error().message(),
                AllOf(HasSubstr("node 'bad_reshape' (Reshape)"), HasSubstr("cannot reshape")));
  }
}

}  // namespace
}  // namespace encoder_network_test
}  // namespace backplane
