// The KServe v2 API of `backplane serve` through real HTTP: health, metadata, inference of real
// MNIST images, the repository extension.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// One server for the read-only tests of this file.
class ServeApiTest : public SharedServerTest<ServeApiTest> {};

TEST_F(ServeApiTest, HealthLiveAndReady) {
  EXPECT_EQ(Get(*client_, "/v2/health/live").status, 200);
  const auto ready = Get(*client_, "/v2/health/ready");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, json({{"ready", true}}));
}

TEST_F(ServeApiTest, ServerMetadataNamesTheExtensions) {
  const auto reply = Get(*client_, "/v2");
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["name"], "backplane");
  EXPECT_THAT(reply.body["extensions"].get<std::vector<std::string>>(),
              ::testing::IsSupersetOf({"model_repository", "backend_admin", "metrics"}));
}

TEST_F(ServeApiTest, ModelMetadataDescribesInputsAndOutputs) {
  const auto reply = Get(*client_, "/v2/models/mnist");
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["name"], "mnist");
  EXPECT_EQ(reply.body["versions"], json({"1"}));
  EXPECT_EQ(reply.body["platform"], "onnx");
  EXPECT_EQ(reply.body["inputs"],
            json::parse(R"([{"name":"Input3","datatype":"FP32","shape":[1,1,28,28]}])"));
  EXPECT_EQ(reply.body["outputs"],
            json::parse(R"([{"name":"Plus214_Output_0","datatype":"FP32","shape":[1,10]}])"));
  // A dynamic dimension is -1.
  const auto mlp = Get(*client_, "/v2/models/mlp/versions/1");
  ASSERT_EQ(mlp.status, 200) << mlp.text;
  EXPECT_EQ(mlp.body["inputs"][0]["shape"], json({-1, 4}));
}

TEST_F(ServeApiTest, ModelReadiness) {
  const auto reply = Get(*client_, "/v2/models/mnist/ready");
  EXPECT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["ready"], true);
  EXPECT_EQ(Get(*client_, "/v2/models/mnist/versions/1/ready").status, 200);
  EXPECT_EQ(Get(*client_, "/v2/models/mnist/versions/2/ready").status, 404);
  EXPECT_EQ(Get(*client_, "/v2/models/nonexistent/ready").status, 404);
}

TEST_F(ServeApiTest, ClassifiesMnistTestImages) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  for (int index = 0; index < 3; ++index) {
    const auto reply = Post(*client_, "/v2/models/mnist/infer", MnistRequestBody(index));
    ASSERT_EQ(reply.status, 200) << reply.text;
    EXPECT_EQ(reply.body["model_name"], "mnist");
    EXPECT_EQ(reply.body["model_version"], "1");
    EXPECT_EQ(reply.body["id"], "image-" + std::to_string(index));
    const auto& output = reply.body["outputs"][0];
    EXPECT_EQ(output["name"], "Plus214_Output_0");
    EXPECT_EQ(output["datatype"], "FP32");
    EXPECT_EQ(output["shape"], json({1, 10}));
    EXPECT_EQ(ArgMax(reply.body), MnistLabel(index)) << reply.text;
  }
}

TEST_F(ServeApiTest, TheShippedExampleRequestIsAFive) {
  const std::string body =
      ReadFile(std::filesystem::path(BACKPLANE_SOURCE_DIR) / "models/mnist/example_request.json");
  const auto reply = Post(*client_, "/v2/models/mnist/versions/1/infer", body);
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["id"], "mnist-test-image-0-label-5");
  EXPECT_EQ(ArgMax(reply.body), 5) << reply.text;
}

TEST_F(ServeApiTest, MlpTakesNestedDataWithADynamicBatch) {
  // Nested rows (the spec allows flat or nested), batch 2; expected from numpy on the same
  // weights (models/mlp/make_model.py).
  const auto reply = Post(*client_, "/v2/models/mlp/infer", R"({
    "inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                "data": [[1, 2, 3, 4], [-1, 0.5, 0, 2]]}],
    "outputs": [{"name": "probabilities"}]})");
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_FALSE(reply.body.contains("id"));
  const auto& output = reply.body["outputs"][0];
  EXPECT_EQ(output["shape"], json({2, 3}));
  const std::vector<double> expected = {0.88673604, 0.0525964,  0.06066757,
                                        0.69209903, 0.16173875, 0.14616212};
  ASSERT_EQ(output["data"].size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(output["data"][i].get<double>(), expected[i], 1e-5) << i;
  // The same as flat data.
  const auto flat = Post(*client_, "/v2/models/mlp/infer", R"({
    "inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                "data": [1, 2, 3, 4, -1, 0.5, 0, 2]}]})");
  ASSERT_EQ(flat.status, 200) << flat.text;
  EXPECT_EQ(flat.body["outputs"], reply.body["outputs"]);
}

TEST_F(ServeApiTest, RepositoryIndexListsEveryModel) {
  const auto reply = Post(*client_, "/v2/repository/index", "");
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body, json::parse(R"([
    {"name": "mlp", "version": "1", "state": "READY"},
    {"name": "mnist", "version": "1", "state": "READY"},
    {"name": "mnist_int8", "version": "1", "state": "READY"},
    {"name": "text_classifier", "version": "1", "state": "READY"}])"));
  EXPECT_EQ(Post(*client_, "/v2/repository/index", R"({"ready": true})").body.size(), 4u);
}

TEST_F(ServeApiTest, PlacementSaysWhichBackendRunsEachLayer) {
  const auto reply = Get(*client_, "/v2/models/mnist/placement");
  ASSERT_EQ(reply.status, 200) << reply.text;
  const auto& layers = reply.body["versions"][0]["layers"];
  ASSERT_EQ(layers.size(), 11u) << reply.text;
  for (const auto& layer : layers) {
    EXPECT_EQ(layer["backend"], "CpuRef");
    EXPECT_GE(layer["generation"].get<int>(), 1);
    // CpuRef declines compiling runs: every layer has a workload of its own.
    EXPECT_EQ(layer["compiled"], false);
    EXPECT_EQ(layer["subgraph"], "");
    EXPECT_EQ(layer["note"], "");
  }
  EXPECT_EQ(layers[0]["op_type"], "Conv");
}

// ---- The repository extension: a server of its own, since these change what is loaded.

TEST(ServeRepositoryTest, UnloadThenLoadAndPickUpANewVersion) {
  ServeHome home;
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();

  auto unloaded = Post(*client, "/v2/repository/models/mlp/unload", "");
  ASSERT_EQ(unloaded.status, 200) << unloaded.text;
  EXPECT_EQ(unloaded.body["state"], "UNAVAILABLE");
  // Not serving: the model exists in the repository but is not ready (503, with why).
  auto infer = Post(*client, "/v2/models/mlp/infer",
                    R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32",
                        "data":[1,2,3,4]}]})");
  EXPECT_EQ(infer.status, 503) << infer.text;
  EXPECT_THAT(infer.body["error"].get<std::string>(), HasSubstr("unloaded"));
  auto index = Post(*client, "/v2/repository/index", "");
  EXPECT_EQ(index.body[0], json::parse(R"({"name":"mlp","state":"UNAVAILABLE",
                                           "reason":"unloaded"})"));
  EXPECT_EQ(Post(*client, "/v2/repository/models/mlp/unload", "").status, 404);

  // A second version directory appears; `load` picks it up (the mlp policy serves all).
  std::filesystem::create_directories(home.models() / "mlp" / "2");
  std::filesystem::copy_file(home.models() / "mlp" / "1" / "model.onnx",
                             home.models() / "mlp" / "2" / "model.onnx");
  auto loaded = Post(*client, "/v2/repository/models/mlp/load", "{}");
  ASSERT_EQ(loaded.status, 200) << loaded.text;
  EXPECT_EQ(loaded.body["versions"], json({"1", "2"}));
  auto v2 = Post(*client, "/v2/models/mlp/versions/2/infer",
                 R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32",
                     "data":[1,2,3,4]}]})");
  ASSERT_EQ(v2.status, 200) << v2.text;
  EXPECT_EQ(v2.body["model_version"], "2");
  // Without a version: the highest serving.
  auto latest = Post(*client, "/v2/models/mlp/infer",
                     R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32",
                         "data":[1,2,3,4]}]})");
  EXPECT_EQ(latest.body["model_version"], "2");

  // A load that fails leaves what serves untouched.
  home.Write("models/mlp/config.json", R"({"max_inflight": 3})");
  auto refused = Post(*client, "/v2/repository/models/mlp/load", "");
  EXPECT_EQ(refused.status, 400) << refused.text;
  EXPECT_THAT(
      refused.body["error"].get<std::string>(),
      HasSubstr("unknown key 'max_inflight' (known: backends, max_in_flight, "
                "instances, version_policy, max_batch_size, dynamic_batching, backend_options)"));
  EXPECT_EQ(Get(*client, "/v2/models/mlp/versions/2/ready").status, 200);

  // Loading a model directory that does not exist, and a name that could escape the repository.
  EXPECT_EQ(Post(*client, "/v2/repository/models/nothing/load", "").status, 404);
  EXPECT_EQ(Post(*client, "/v2/repository/models/../load", "").status, 400);
  EXPECT_EQ(Post(*client, "/v2/repository/models/.hidden/load", "").status, 400);
  EXPECT_EQ(Post(*client, "/v2/repository/models/..%2F..%2Fetc/load", "").status, 404);
}

TEST(ServeRepositoryTest, AModelThatFailsToLoadIsReportedAndTheServerStillStarts) {
  ServeHome home;
  home.Write("models/broken/1/model.onnx", "this is not a protobuf");
  home.Write("models/badconfig/config.json", R"({"version_policy": {"newest": 1}})");
  std::filesystem::copy_file(home.models() / "mlp" / "1" / "model.onnx", home.path() / "mlp.onnx");
  home.Write("models/badconfig/1/model.onnx", ReadFile(home.path() / "mlp.onnx"));
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  EXPECT_EQ(Get(*client, "/v2/health/ready").status, 200);
  EXPECT_EQ(Get(*client, "/v2/models/mnist/ready").status, 200);

  auto index = Post(*client, "/v2/repository/index", "");
  ASSERT_EQ(index.status, 200);
  std::map<std::string, json> by_name;
  for (const auto& entry : index.body)
    by_name[entry["name"]] = entry;
  EXPECT_EQ(by_name["broken"]["state"], "UNAVAILABLE");
  EXPECT_THAT(by_name["broken"]["reason"].get<std::string>(), HasSubstr("model.onnx"));
  EXPECT_THAT(by_name["badconfig"]["reason"].get<std::string>(),
              HasSubstr("'version_policy' has unknown kind 'newest'"));
  auto ready = Get(*client, "/v2/models/broken/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_THAT(server->Log(), HasSubstr("model 'broken' version 1"));
}

}  // namespace
}  // namespace backplane::testing
