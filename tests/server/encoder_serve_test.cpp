// The tiny encoder (tests/data/tiny_encoder, scripts/make_tiny_encoder.py) served by `backplane
// serve`: INT64 token ids and attention mask in KServe v2 JSON over REST and in typed and raw
// contents over gRPC, the answer within 1e-4 of numpy's; a token id outside the vocabulary
// answered 400 naming the node.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "grpc_service.grpc.pb.h"
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

// The encoder's first test data set: inputs and expected outputs.
struct DataSet {
  Tensor ids, mask, hidden, pooled;
};
DataSet ReadDataSet() {
  const fs::path data = kEncoder / "test_data_set_0";
  DataSet set;
  Tensor* tensors[] = {&set.ids, &set.mask, &set.hidden, &set.pooled};
  const char* files[] = {"input_0.pb", "input_1.pb", "output_0.pb", "output_1.pb"};
  for (int i = 0; i < 4; ++i) {
    auto tensor = ReadTensorProtoFile(data / files[i]);
    EXPECT_TRUE(tensor.ok()) << tensor.error().ToString();
    if (tensor.ok())
      *tensors[i] = std::move(tensor).value();
  }
  return set;
}

void ServeEncoder(const ServeHome& home) {
  std::ifstream model(kEncoder / "model.onnx", std::ios::binary);
  std::ostringstream bytes;
  bytes << model.rdbuf();
  home.Write("models/encoder/1/model.onnx", bytes.str());
}

// models/text_classifier, as `scripts/run.sh` serves it: its example request answered with the
// probabilities numpy computed for it (example_expected.json, written by its make_model.py).
TEST(EncoderServeTest, TheExampleTextClassifierAnswersItsExampleRequest) {
  ServeHome home;
  auto running = StartInProcess(InProcessConfig(home));
  httplib::Client client("127.0.0.1", running.http.port);
  const fs::path example = fs::path(BACKPLANE_SOURCE_DIR) / "models/text_classifier";
  std::ifstream request_file(example / "example_request.json");
  std::ostringstream request;
  request << request_file.rdbuf();
  const json expected = json::parse(std::ifstream(example / "example_expected.json"));
  const auto reply = Post(client, "/v2/models/text_classifier/infer", request.str());
  ASSERT_EQ(reply.status, 200) << reply.text;
  EXPECT_EQ(reply.body["id"], "two-sentences");
  const json& output = reply.body["outputs"][0];
  EXPECT_EQ(output["name"], "probabilities");
  EXPECT_EQ(output["shape"], json::parse("[2, 2]"));
  ASSERT_EQ(output["data"].size(), expected["probabilities"].size());
  for (std::size_t i = 0; i < output["data"].size(); ++i)
    EXPECT_NEAR(output["data"][i].get<double>(), expected["probabilities"][i].get<double>(), 1e-5)
        << "probability " << i;
}

TEST(EncoderServeTest, ServesInt64TokenIdsOverRest) {
  ServeHome home;
  ServeEncoder(home);
  auto running = StartInProcess(InProcessConfig(home));
  httplib::Client client("127.0.0.1", running.http.port);

  const DataSet set = ReadDataSet();
  const Tensor* ids = &set.ids;
  const Tensor* mask = &set.mask;
  const Tensor* hidden = &set.hidden;
  const Tensor* pooled = &set.pooled;
  const json request = {
      {"inputs", {Int64Input("input_ids", *ids), Int64Input("attention_mask", *mask)}}};
  const auto reply = Post(client, "/v2/models/encoder/infer", request.dump());
  ASSERT_EQ(reply.status, 200) << reply.text;
  ASSERT_EQ(reply.body["outputs"].size(), 2u);
  const Tensor* expected[] = {hidden, pooled};
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

TEST(EncoderServeTest, ServesInt64TokenIdsOverGrpcTypedAndRaw) {
  ServeHome home;
  ServeEncoder(home);
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  ASSERT_TRUE(running.grpc.has_value());
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(running.grpc->port),
                                     grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  const DataSet set = ReadDataSet();
  for (const bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "raw contents" : "typed contents");
    inference::ModelInferRequest request;
    request.set_model_name("encoder");
    for (const auto& [name, tensor] :
         {std::pair{"input_ids", &set.ids}, std::pair{"attention_mask", &set.mask}}) {
      auto* input = request.add_inputs();
      input->set_name(name);
      input->set_datatype("INT64");
      for (int64_t dim : tensor->info().shape)
        input->add_shape(dim);
      if (raw) {
        request.add_raw_input_contents(reinterpret_cast<const char*>(tensor->bytes().data()),
                                       tensor->bytes().size());
      } else {
        for (int64_t value : tensor->Elements<int64_t>())
          input->mutable_contents()->add_int64_contents(value);
      }
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    inference::ModelInferResponse response;
    const grpc::Status status = stub->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.outputs_size(), 2);
    const Tensor* expected[] = {&set.hidden, &set.pooled};
    for (int o = 0; o < 2; ++o) {
      const auto want = expected[o]->Elements<float>();
      std::vector<float> got;
      if (raw) {
        ASSERT_EQ(response.raw_output_contents_size(), 2);
        const std::string& bytes = response.raw_output_contents(o);
        got.resize(bytes.size() / sizeof(float));
        std::memcpy(got.data(), bytes.data(), got.size() * sizeof(float));
      } else {
        const auto& values = response.outputs(o).contents().fp32_contents();
        got.assign(values.begin(), values.end());
      }
      ASSERT_EQ(got.size(), want.size()) << "output " << o;
      for (std::size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-4) << "output " << o << " " << i;
    }
  }
}

}  // namespace
}  // namespace encoder_serve_test
}  // namespace backplane::testing
