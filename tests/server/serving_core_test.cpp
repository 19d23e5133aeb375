// The serving core in this process, as `backplane serve` starts it (cli's StartServer): a whole
// server without the executable, its ordered stop, and the rules REST and gRPC share.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <regex>

#include "cli/serve_command.hpp"
#include "grpc_service.grpc.pb.h"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {
using server::RunningServer;
using server::ServeConfig;
using ::testing::HasSubstr;

// The count of `backplane_inference_failures_total{model="mlp",code="<code>"}`, 0 when absent.
uint64_t MlpFailures(httplib::Client& client, const std::string& code) {
  const auto reply = client.Get("/metrics");
  EXPECT_TRUE(reply && reply->status == 200);
  if (!reply)
    return 0;
  std::smatch match;
  const std::regex sample("backplane_inference_failures_total\\{model=\"mlp\",code=\"" + code +
                          "\"\\} ([0-9]+)");
  return std::regex_search(reply->body, match, sample) ? std::stoull(match[1]) : 0;
}

TEST(ServingCoreTest, StartsAWholeServerInProcessAndStopsItInOrder) {
  ServeHome home;
  auto started = server::StartServer(InProcessConfig(home, /*grpc=*/true));
  ASSERT_TRUE(started.ok()) << started.error().ToString();
  RunningServer running = std::move(started).value();
  ASSERT_NE(running.http.port, 0);
  ASSERT_TRUE(running.grpc.has_value());

  httplib::Client client("127.0.0.1", running.http.port);
  auto ready = client.Get("/v2/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  auto infer = client.Post("/v2/models/mlp/infer",
                           R"({"inputs":[{"name":"features","shape":[1,4],"datatype":"FP32",
                               "data":[1,2,3,4]}]})",
                           "application/json");
  ASSERT_TRUE(infer);
  EXPECT_EQ(infer->status, 200) << infer->body;

  // Stop answers what was taken, then unloads every generation before it returns.
  running.core->Stop();
  EXPECT_FALSE(client.Get("/v2/health/live")) << "the transport still answers after Stop";
  auto loader = loader::Loader::Shared().value();
  EXPECT_EQ(loader->stats().live.load(), 0u) << "a generation outlived the serving core's Stop";
  running.core->Stop();  // idempotent
}

TEST(ServingCoreTest, AStartThatCannotBindNamesTheAddressAndLeavesNothingRunning) {
  ServeHome home;
  auto first = server::StartServer(InProcessConfig(home, /*grpc=*/true));
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  ServeConfig taken = InProcessConfig(home, /*grpc=*/true);
  taken.listen = first->http.ToString();
  auto second = server::StartServer(taken);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error().message(), HasSubstr(first->http.ToString()));
  // The first one never noticed.
  httplib::Client client("127.0.0.1", first->http.port);
  auto ready = client.Get("/v2/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
}

// Issue 19: failures were counted under HTTP statuses, so a gRPC INVALID_ARGUMENT landed in
// code="400". Now both transports count the runtime's code.
TEST(ServingCoreTest, RestAndGrpcFailuresAreCountedUnderOneStatusCode) {
  ServeHome home;
  auto started = server::StartServer(InProcessConfig(home, /*grpc=*/true));
  ASSERT_TRUE(started.ok()) << started.error().ToString();
  httplib::Client client("127.0.0.1", started->http.port);
  const uint64_t before = MlpFailures(client, "INVALID_ARGUMENT");

  auto rest = client.Post("/v2/models/mlp/infer", "{", "application/json");
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->status, 400);

  auto channel = grpc::CreateChannel(started->grpc->ToString(), grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  inference::ModelInferRequest request;
  request.set_model_name("mlp");
  auto* input = request.add_inputs();
  input->set_name("features");
  input->set_datatype("INT64");  // the model takes FP32
  input->add_shape(1);
  input->add_shape(4);
  for (int64_t value : {1, 2, 3, 4})
    input->mutable_contents()->add_int64_contents(value);
  inference::ModelInferResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status status = stub->ModelInfer(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  EXPECT_EQ(MlpFailures(client, "INVALID_ARGUMENT"), before + 2);
  EXPECT_EQ(MlpFailures(client, "400"), 0u);
}

}  // namespace
}  // namespace backplane::testing
