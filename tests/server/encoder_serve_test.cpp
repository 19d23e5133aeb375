// The tiny encoder (tests/data/tiny_encoder, scripts/make_tiny_encoder.py) served by `backplane
// serve` over REST: INT64 token ids and attention mask in KServe v2 JSON, the answer within 1e-4
// of numpy's, and a token id outside the vocabulary answered 400 naming the node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backplane/onnx/network.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace encoder_serve_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

const fs::path kEncoder = fs::path(BACKPLANE_SOURCE_DIR) / "tests/data/tiny_encoder";

json Int64Input(const std::string& name, const Tensor& tensor) {
  const auto values = tensor.Elements<int64_t>();
  return {{"name", name},
          {"shape", tensor.info().shape},
          {"datatype", "INT64"},
          {"data", std::vector<int64_t>(values.begin(), values.end())}};
}

TEST(EncoderServeTest, ServesInt64TokenIdsOverRest) {
  ServeHome home;
  std::ifstream model(kEncoder / "model.onnx", std::ios::binary);
  std::ostringstream bytes;
  bytes << model.rdbuf();
  home.Write("models/encoder/1/model.onnx", bytes.str());
  auto running = StartInProcess(InProcessConfig(home));
  httplib::Client client("127.0.0.1", running.http.port);

  const fs::path data = kEncoder / "test_data_set_0";
  auto ids = ReadTensorProtoFile(data / "input_0.pb");
  auto mask = ReadTensorProtoFile(data / "input_1.pb");
  auto hidden = ReadTensorProtoFile(data / "output_0.pb");
  auto pooled = ReadTensorProtoFile(data / "output_1.pb");
  ASSERT_TRUE(ids.ok() && mask.ok() && hidden.ok() && pooled.ok());
  const json request = {
      {"inputs", {Int64Input("input_ids", *ids), Int64Input("attention_mask", *mask)}}};
  const auto reply = Post(client, "/v2/models/encoder/infer", request.dump());
  ASSERT_EQ(reply.status, 200) << reply.text;
  ASSERT_EQ(reply.body["outputs"].size(), 2u);
  const Tensor* expected[] = {&hidden.value(), &pooled.value()};
  for (std::size_t o = 0; o < 2; ++o) {
    const json& output = reply.body["outputs"][o];
    EXPECT_EQ(output["datatype"], "FP32");
    EXPECT_EQ(output["shape"], json(expected[o]->info().shape));
    const auto want = expected[o]->Elements<float>();
    ASSERT_EQ(output["data"].size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(output["data"][i].get<double>(), want[i], 1e-4) << "output " << o << " " << i;
  }

  const json out_of_vocabulary = {
      {"inputs",
       {{{"name", "input_ids"}, {"shape", {1, 2}}, {"datatype", "INT64"}, {"data", {3, 999}}},
        {{"name", "attention_mask"}, {"shape", {1, 2}}, {"datatype", "INT64"}, {"data", {1, 1}}}}}};
  const auto refused = Post(client, "/v2/models/encoder/infer", out_of_vocabulary.dump());
  EXPECT_EQ(refused.status, 400) << refused.text;
  EXPECT_THAT(refused.text, AllOf(HasSubstr("word_emb"), HasSubstr("index 999")));
}

}  // namespace
}  // namespace encoder_serve_test
}  // namespace backplane::testing
