// Per-call backend options (SDK 1.4) as a client gives them: request-level KServe v2 parameters
// named "options.<BackendId>.<key>", over REST and gRPC, to a plain and to a batched model. The
// fixture backend TestValid adds its option "call_offset" (declared per call) to every output, so
// an answer says which value its request ran with.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "onnx/model_builder.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class CallOptionsServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CopyFile(Fixture("Valid"), home_.backends() / "Test_Valid_backend.so");
    WriteModel("offset", R"({"backends": ["TestValid"],
                             "backend_options": {"TestValid": {"call_offset": 10}}})");
    // A long wait for company: requests sent together meet in the batcher.
    WriteModel("batched", R"({"backends": ["TestValid"], "max_batch_size": 8,
                              "dynamic_batching": {"max_queue_delay_us": 300000}})");
    running_.emplace(StartInProcess(InProcessConfig(home_, /*grpc=*/true)));
    client_.emplace("127.0.0.1", running_->http.port);
  }

  void WriteModel(const std::string& name, const std::string& config) {
    home_.Write("models/" + name + "/1/model.onnx", RowIdentityModel());
    home_.Write("models/" + name + "/config.json", config);
  }

  // The row [first, 2, 3, 4] with request-level `parameters`.
  static std::string Body(float first, const json& parameters) {
    json body = json::parse(RowRequest(first));
    if (!parameters.is_null())
      body["parameters"] = parameters;
    return body.dump();
  }

  // What the model adds to the row's first element; NaN when the request fails.
  double RestOffset(const std::string& model, const json& parameters, float first = 1) {
    const auto reply = Post(*client_, "/v2/models/" + model + "/infer", Body(first, parameters));
    EXPECT_EQ(reply.status, 200) << model << ": " << reply.text;
    return reply.status == 200 ? reply.body["outputs"][0]["data"][0].get<double>() - first : NAN;
  }

  ServeHome home_;  // outlives the server
  std::optional<server::RunningServer> running_;
  std::optional<httplib::Client> client_;
};

TEST_F(CallOptionsServeTest, RestRequestParametersSetOneCallsOptions) {
  EXPECT_EQ(RestOffset("offset", nullptr), 10.0) << "the model's own value";
  EXPECT_EQ(RestOffset("offset", {{"options.TestValid.call_offset", 1.5}}), 1.5);
  EXPECT_EQ(RestOffset("offset", {{"options.TestValid.call_offset", 2}}), 2.0)
      << "an integer for a double option";
  EXPECT_EQ(RestOffset("offset", {{"unrelated", 1}, {"binary_data_output", false}}), 10.0)
      << "other parameters are ignored as before";
  EXPECT_EQ(RestOffset("offset", nullptr), 10.0) << "for that call alone";
}

TEST_F(CallOptionsServeTest, RestRefusesAWrongOptionWith400NamingBackendAndKey) {
  const struct {
    json parameters;
    std::string message;
  } cases[] = {
      {{{"options.TestValid.nope", 1}}, "backend TestValid has no option 'nope'"},
      {{{"options.TestValid.call_offset", "x"}},
       "backend TestValid option 'call_offset' is double, got string \"x\""},
      {{{"options.TestValid.prepared_offset", 1.0}},
       "backend TestValid option 'prepared_offset' is not taken per call"},
      {{{"options.GpuAcc.threads", 2}}, "the call's options name backend GpuAcc"},
      {{{"options.TestValid", 1}}, "must be named options.<backend>.<option>"},
      {{{"options.TestValid.call_offset", json::array({1})}},
       "parameter 'options.TestValid.call_offset' must be a bool, a number or a string"},
  };
  for (const auto& wrong : cases) {
    const auto reply = Post(*client_, "/v2/models/offset/infer", Body(1, wrong.parameters));
    EXPECT_EQ(reply.status, 400) << wrong.message << ": " << reply.text;
    EXPECT_THAT(reply.body.value("error", ""), HasSubstr(wrong.message)) << reply.text;
  }
  EXPECT_EQ(RestOffset("offset", nullptr), 10.0) << "nothing changed";
}

TEST_F(CallOptionsServeTest,
       GrpcRequestParametersSetOneCallsOptionsAndWrongOnesAreInvalidArgument) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(running_->grpc->port),
                                     grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  const auto infer = [&](const std::function<void(inference::ModelInferRequest&)>& parameters,
                         inference::ModelInferResponse* response) {
    inference::ModelInferRequest request;
    request.set_model_name("offset");
    auto* input = request.add_inputs();
    input->set_name("x");
    input->set_datatype("FP32");
    input->add_shape(1);
    input->add_shape(4);
    for (float value : {1.0f, 2.0f, 3.0f, 4.0f})
      input->mutable_contents()->add_fp32_contents(value);
    parameters(request);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->ModelInfer(&context, request, response);
  };
  const auto first_output = [](const inference::ModelInferResponse& response) {
    if (response.raw_output_contents_size() > 0) {
      float value = 0;
      std::memcpy(&value, response.raw_output_contents(0).data(), sizeof value);
      return value;
    }
    return response.outputs(0).contents().fp32_contents(0);
  };

  inference::ModelInferResponse response;
  ASSERT_TRUE(infer([](auto&) {}, &response).ok());
  EXPECT_EQ(first_output(response), 11.0f) << "the model's own value";
  ASSERT_TRUE(
      infer(
          [](auto& request) {
            (*request.mutable_parameters())["options.TestValid.call_offset"].set_int64_param(2);
          },
          &response)
          .ok());
  EXPECT_EQ(first_output(response), 3.0f) << "an int64 for a double option";
  ASSERT_TRUE(
      infer(
          [](auto& request) {
            (*request.mutable_parameters())["options.TestValid.call_offset"].set_double_param(0.5);
          },
          &response)
          .ok());
  EXPECT_EQ(first_output(response), 1.5f);

  const grpc::Status refused = infer(
      [](auto& request) {
        (*request.mutable_parameters())["options.TestValid.prepared_offset"].set_double_param(1);
      },
      &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("backend TestValid option 'prepared_offset' is not taken per call"));
  const grpc::Status unknown = infer(
      [](auto& request) {
        (*request.mutable_parameters())["options.TestValid.nope"].set_bool_param(true);
      },
      &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(unknown.error_message(), HasSubstr("backend TestValid has no option 'nope'"));
}

// Requests sent together to a batched model meet in its batcher; those whose options differ must
// not run as one execution (it would run with one request's options for all). Each answer adds
// its own request's value.
TEST_F(CallOptionsServeTest, ABatchedModelNeverJoinsRequestsWithDifferentOptions) {
  const std::vector<json> options = {nullptr,
                                     {{"options.TestValid.call_offset", 1.0}},
                                     {{"options.TestValid.call_offset", 2.0}},
                                     {{"options.TestValid.call_offset", 1.0}},
                                     nullptr,
                                     {{"options.TestValid.call_offset", 2.0}}};
  const std::vector<double> expected = {0, 1, 2, 1, 0, 2};
  for (int round = 0; round < 3; ++round) {
    std::vector<std::future<double>> answers;
    for (std::size_t i = 0; i < options.size(); ++i) {
      answers.push_back(std::async(std::launch::async, [&, i] {
        httplib::Client client("127.0.0.1", running_->http.port);
        const float first = static_cast<float>(10 * (i + 1));
        const auto reply = Post(client, "/v2/models/batched/infer", Body(first, options[i]));
        return reply.status == 200 ? reply.body["outputs"][0]["data"][0].get<double>() - first
                                   : NAN;
      }));
    }
    for (std::size_t i = 0; i < answers.size(); ++i)
      EXPECT_EQ(answers[i].get(), expected[i]) << "request " << i << ", round " << round;
  }
}

}  // namespace
}  // namespace backplane::testing
