// Every error status of `backplane serve`, each with a JSON error that names what and why, and
// none of them disturbing the requests around it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netinet/in.h>
#include <atomic>
#include <thread>

#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kMlpInfer[] = "/v2/models/mlp/infer";

std::string MlpBody(const std::string& input) {
  return R"({"inputs": [)" + input + "]}";
}

class ServeErrorsTest : public SharedServerTest<ServeErrorsTest> {
 public:
  // Small limits so that the tests can reach them; mnist allows one request at a time.
  static std::vector<std::string> PrepareHome(const ServeHome& home) {
    home.Write("config.json", R"({"max_body_bytes": 65536, "max_json_depth": 8,
                                  "max_header_bytes": 4096})");
    home.Write("models/mnist/config.json", R"({"max_in_flight": 1})");
    return {"--config", (home.path() / "config.json").string()};
  }

 protected:
  // Asserts the status and that the JSON error contains `message`.
  void ExpectError(const JsonReply& reply, int status, const std::string& message) {
    EXPECT_EQ(reply.status, status) << reply.text;
    ASSERT_TRUE(reply.body.is_object() && reply.body.contains("error")) << reply.text;
    EXPECT_THAT(reply.body["error"].get<std::string>(), HasSubstr(message));
  }
};

TEST_F(ServeErrorsTest, MalformedJsonIs400) {
  ExpectError(Post(*client_, kMlpInfer, "{\"inputs\": ["), 400, "malformed JSON");
  ExpectError(Post(*client_, kMlpInfer, ""), 400, "the request body is empty");
  ExpectError(Post(*client_, kMlpInfer, "[1, 2]"), 400, "must be a JSON object");
  ExpectError(Post(*client_, kMlpInfer, R"({"input": []})"), 400, "unknown key 'input'");
}

// Issue 44: a long string element or number came back whole in the 400; at most
// kMaxQuotedBytes of it now, with its size.
TEST_F(ServeErrorsTest, A400QuotesABoundedPartOfTheValue) {
  const std::string long_string = "\"" + std::string(60000, 's') + "\"";
  const std::string long_number = "1" + std::string(59999, '0');
  for (const std::string& element : {long_string, long_number}) {
    const JsonReply reply =
        Post(*client_, kMlpInfer,
             MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,)" +
                     element + "]}"));
    ExpectError(reply, 400, "... (");
    EXPECT_LT(reply.text.size(), 400u) << reply.text.substr(0, 400);
  }
}

TEST_F(ServeErrorsTest, JsonNestedTooDeeplyIs400) {
  ExpectError(Post(*client_, kMlpInfer, std::string(1000, '[')), 400,
              "nested deeper than 8 levels");
}

TEST_F(ServeErrorsTest, WrongShapeIs400) {
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,5],"datatype":"FP32",
                              "data":[1,2,3,4,5]})")),
      400, "input 'features': shape [1,5] does not match the model's [-1,4]");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                              "data":[1,2,3]})")),
      400, "'data' has 3 element(s), shape [1,4] needs 4");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[2,4],"datatype":"FP32",
                              "data":[[1,2,3,4],[1,2,3]]})")),
      400, "nested data has 3 element(s) at depth 1");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,-4],"datatype":"FP32",
                              "data":[]})")),
      400, "'shape' holds -4");
}

TEST_F(ServeErrorsTest, WrongDatatypeIs400) {
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"INT64",
                              "data":[1,2,3,4]})")),
      400, "datatype INT64 does not match the model's FP32");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP16",
                              "data":[1,2,3,4]})")),
      400, "datatype 'FP16' is not supported");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                              "data":[1,"two",3,4]})")),
      400, "element 1 is \"two\", expected a number for FP32");
  ExpectError(
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                              "data":[1,2,3,1e300]})")),
      400, "out of range for FP32");
}

TEST_F(ServeErrorsTest, MissingOrUnknownInputIs400) {
  ExpectError(Post(*client_, kMlpInfer, R"({"inputs": []})"), 400,
              "missing input 'features' (FP32 [-1,4]");
  ExpectError(Post(*client_, kMlpInfer, MlpBody(R"({"name":"pixels","shape":[1,4],"datatype":"FP32",
                              "data":[1,2,3,4]})")),
              400, "unknown input 'pixels' (the model takes: features)");
  const std::string features =
      R"({"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]})";
  ExpectError(Post(*client_, kMlpInfer, MlpBody(features + "," + features)), 400,
              "input 'features' is given twice");
  ExpectError(Post(*client_, kMlpInfer,
                   R"({"inputs": [)" + features + R"(], "outputs": [{"name": "logits"}]})"),
              400, "unknown requested output 'logits' (the model's outputs: probabilities)");
  // The binary tensor data extension is served now (serve_binary_test.cpp); a malformed use of
  // it is still refused by name.
  ExpectError(
      Post(*client_, kMlpInfer,
           R"({"inputs": [)" + features + R"(], "parameters": {"binary_data_output": "yes"}})"),
      400, "parameter 'binary_data_output' must be true or false");
}

TEST_F(ServeErrorsTest, UnknownModelVersionRouteIs404) {
  ExpectError(Post(*client_, "/v2/models/resnet/infer", "{}"), 404, "unknown model 'resnet'");
  ExpectError(Get(*client_, "/v2/models/resnet"), 404, "unknown model 'resnet'");
  ExpectError(Post(*client_, "/v2/models/mlp/versions/7/infer", "{}"), 404,
              "model 'mlp' has no version '7' serving (serving: 1)");
  ExpectError(Get(*client_, "/v2/models/mlp/versions/x1"), 404, "has no version 'x1'");
  ExpectError(Get(*client_, "/v2/nothing/here"), 404, "no route for GET /v2/nothing/here");
}

TEST_F(ServeErrorsTest, BodyOverTheLimitIs413) {
  const std::string big = MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                                      "data":[1,2,3,4]})") +
                          std::string(70000, ' ');
  ExpectError(Post(*client_, kMlpInfer, big), 413,
              "exceeds the limit of 65536 bytes (max_body_bytes)");
  // The same connection carries on.
  const auto next =
      Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                                    "data":[1,2,3,4]})"));
  EXPECT_EQ(next.status, 200) << next.text;
}

TEST_F(ServeErrorsTest, HeadersOverTheLimitAre431) {
  const auto reply = client_->Get("/v2/health/live", {{"X-Padding", std::string(5000, 'x')}});
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, 431);
  EXPECT_THAT(reply->body, HasSubstr("max_header_bytes"));
}

TEST_F(ServeErrorsTest, OverloadedModelIs503AndOthersCarryOn) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  // mnist admits one request at a time: concurrent clients meet 503 with one Retry-After, every
  // other request succeeds with the right answer.
  const std::string body = MnistRequestBody(0);
  std::atomic<int> ok{0}, overloaded{0}, other{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  JoinAll join_all{stop, clients};
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      auto client = server_->Client();
      while (!stop.load()) {
        auto reply = client->Post("/v2/models/mnist/infer", body, "application/json");
        if (reply && reply->status == 200 &&
            reply->body.find("Plus214_Output_0") != std::string::npos)
          ++ok;
        // Exactly one Retry-After: the transport and the REST codec each added one once.
        else if (reply && reply->status == 503 &&
                 reply->get_header_value_count("Retry-After") == 1 &&
                 reply->body.find("max_in_flight") != std::string::npos)
          ++overloaded;
        else
          ++other;
      }
    });
  }
  EXPECT_TRUE(Eventually([&] { return overloaded.load() > 0 && ok.load() > 0; }, 20s));
  stop.store(true);
  for (auto& thread : clients)
    thread.join();
  EXPECT_EQ(other.load(), 0);
  // The other model never noticed.
  EXPECT_EQ(Post(*client_, kMlpInfer, MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32",
                            "data":[1,2,3,4]})"))
                .status,
            200);
}

TEST_F(ServeErrorsTest, GarbageOnTheSocketNeitherCrashesNorDisturbs) {
  // Raw bytes that are not HTTP, a request line without headers' end, a huge request line.
  for (const std::string& garbage :
       {std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),
        std::string("GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
        std::string("POST /v2/models/mlp/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "zz\r\n"),
        "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n"}) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(server_->port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    (void)!write(fd, garbage.data(), garbage.size());
    shutdown(fd, SHUT_WR);
    char buffer[4096];
    while (read(fd, buffer, sizeof buffer) > 0) {
    }
    close(fd);
  }
  EXPECT_EQ(Get(*client_, "/v2/health/live").status, 200);
  EXPECT_EQ(server_->WaitForExit(0ms), std::nullopt);
}

// A model the runtime cannot prepare serves nothing, says why, and the rest serves on.
TEST(ServeNotReadyTest, ModelNotLoadedIs503) {
  ServeHome home;
  home.Write("models/mlp/config.json", R"({"backends": ["NoSuchBackend"]})");
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  const auto reply =
      Post(*client, kMlpInfer,
           MlpBody(R"({"name":"features","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]})"));
  EXPECT_EQ(reply.status, 503) << reply.text;
  EXPECT_THAT(reply.body["error"].get<std::string>(),
              HasSubstr("model 'mlp' is not ready: model 'mlp' version 1"));
  EXPECT_THAT(reply.body["error"].get<std::string>(), HasSubstr("NoSuchBackend"));
  // Loading it again is refused for its backends, not as an unknown model (404).
  const auto load = Post(*client, "/v2/repository/models/mlp/load", "");
  EXPECT_EQ(load.status, 409) << load.text;
  EXPECT_THAT(load.text, HasSubstr("NoSuchBackend names no backend of this runtime"));
  EXPECT_EQ(Get(*client, "/v2/models/mnist/ready").status, 200);
}

}  // namespace
}  // namespace backplane::testing
