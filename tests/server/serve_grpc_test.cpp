// KServe v2 over gRPC against a real `backplane serve`, through the C++ stub generated from the
// server's own .proto. tests/grpc_client holds the independent client (Node's grpc-js).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "backplane/onnx/network.hpp"
#include "grpc_service.grpc.pb.h"
#include "sanitizer_build.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {
using nlohmann::json;
using ::testing::HasSubstr;

class ServeGrpcTest : public SharedServerTest<ServeGrpcTest> {
 protected:
  void SetUp() override {
    ASSERT_NE(server_->grpc_port(), 0) << server_->Log();
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
    stub_ = inference::GRPCInferenceService::NewStub(channel_);
  }

  // One call with a 10 s deadline.
  template <typename Request, typename Response, typename Method>
  grpc::Status Call(Method method, const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ((*stub_).*method)(&context, request, response);
  }

  static inference::ModelInferRequest MlpRequest() {
    inference::ModelInferRequest request;
    request.set_model_name("mlp");
    request.set_id("grpc-1");
    auto* input = request.add_inputs();
    input->set_name("features");
    input->set_datatype("FP32");
    input->add_shape(2);
    input->add_shape(4);
    for (float value : {1.0f, 2.0f, 3.0f, 4.0f, -1.0f, 0.5f, 0.0f, 2.0f})
      input->mutable_contents()->add_fp32_contents(value);
    return request;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

using Service = inference::GRPCInferenceService::Stub;

TEST_F(ServeGrpcTest, HealthAndServerMetadata) {
  inference::ServerLiveResponse live;
  ASSERT_TRUE(Call(&Service::ServerLive, inference::ServerLiveRequest(), &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(Call(&Service::ServerReady, inference::ServerReadyRequest(), &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ServerMetadataResponse metadata;
  ASSERT_TRUE(Call(&Service::ServerMetadata, inference::ServerMetadataRequest(), &metadata).ok());
  EXPECT_EQ(metadata.name(), "backplane");
  EXPECT_FALSE(metadata.version().empty());
  auto client = server_->Client();
  const auto rest = Get(*client, "/v2");
  ASSERT_EQ(rest.status, 200) << rest.text;
  EXPECT_EQ(
      json(std::vector<std::string>(metadata.extensions().begin(), metadata.extensions().end())),
      rest.body["extensions"]);
}

TEST_F(ServeGrpcTest, ModelReadyAndMetadataAgreeWithRest) {
  inference::ModelReadyRequest ready_request;
  ready_request.set_name("mnist");
  inference::ModelReadyResponse ready;
  ASSERT_TRUE(Call(&Service::ModelReady, ready_request, &ready).ok());
  EXPECT_TRUE(ready.ready());

  inference::ModelMetadataRequest request;
  request.set_name("mlp");
  inference::ModelMetadataResponse metadata;
  ASSERT_TRUE(Call(&Service::ModelMetadata, request, &metadata).ok());
  auto client = server_->Client();
  const auto rest = Get(*client, "/v2/models/mlp");
  ASSERT_EQ(rest.status, 200) << rest.text;
  EXPECT_EQ(metadata.name(), rest.body["name"]);
  EXPECT_EQ(metadata.platform(), rest.body["platform"]);
  ASSERT_EQ(metadata.versions_size(), 1);
  EXPECT_EQ(metadata.versions(0), rest.body["versions"][0]);
  ASSERT_EQ(metadata.inputs_size(), 1);
  EXPECT_EQ(metadata.inputs(0).name(), rest.body["inputs"][0]["name"]);
  EXPECT_EQ(metadata.inputs(0).datatype(), rest.body["inputs"][0]["datatype"]);
  EXPECT_EQ(json(std::vector<int64_t>(metadata.inputs(0).shape().begin(),
                                      metadata.inputs(0).shape().end())),
            rest.body["inputs"][0]["shape"]);
  EXPECT_EQ(metadata.outputs(0).name(), rest.body["outputs"][0]["name"]);
}

TEST_F(ServeGrpcTest, TypedContentsGiveRestsNumbers) {
  inference::ModelInferResponse response;
  const grpc::Status status = Call(&Service::ModelInfer, MlpRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_name(), "mlp");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "grpc-1");
  ASSERT_EQ(response.outputs_size(), 1);
  const auto& output = response.outputs(0);
  EXPECT_EQ(output.datatype(), "FP32");
  EXPECT_THAT(output.shape(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(response.raw_output_contents_size(), 0);  // typed in, typed out

  auto client = server_->Client();
  const auto rest = Post(*client, "/v2/models/mlp/infer", R"({
    "inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
                "data": [1, 2, 3, 4, -1, 0.5, 0, 2]}]})");
  ASSERT_EQ(rest.status, 200) << rest.text;
  const auto& data = rest.body["outputs"][0]["data"];
  ASSERT_EQ(output.contents().fp32_contents_size(), static_cast<int>(data.size()));
  for (int i = 0; i < output.contents().fp32_contents_size(); ++i)
    EXPECT_EQ(output.contents().fp32_contents(i), data[i].get<float>()) << i;
}

TEST_F(ServeGrpcTest, RawContentsPredictMnistLabels) {
  BACKPLANE_REQUIRE_PATH(MnistDataDir());
  for (int index = 0; index < 3; ++index) {
    auto tensor = ReadTensorProtoFile(MnistDataDir().parent_path() /
                                      ("test_data_set_" + std::to_string(index)) / "input_0.pb");
    ASSERT_TRUE(tensor.ok()) << tensor.error().ToString();
    inference::ModelInferRequest request;
    request.set_model_name("mnist");
    auto* input = request.add_inputs();
    input->set_name("Input3");
    input->set_datatype("FP32");
    for (int64_t dim : tensor->info().shape)
      input->add_shape(dim);
    request.add_raw_input_contents(reinterpret_cast<const char*>(tensor->bytes().data()),
                                   tensor->bytes().size());
    inference::ModelInferResponse response;
    const grpc::Status status = Call(&Service::ModelInfer, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    // Raw in, raw out (as Triton answers).
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    const std::string& raw = response.raw_output_contents(0);
    ASSERT_EQ(raw.size(), 10 * sizeof(float));
    float logits[10];
    std::memcpy(logits, raw.data(), raw.size());
    EXPECT_EQ(std::max_element(logits, logits + 10) - logits, MnistLabel(index)) << index;

    // The same numbers as REST's JSON.
    auto client = server_->Client();
    const auto rest = Post(*client, "/v2/models/mnist/infer", MnistRequestBody(index));
    ASSERT_EQ(rest.status, 200) << rest.text;
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(logits[i], rest.body["outputs"][0]["data"][i].get<float>()) << i;
  }
}

TEST_F(ServeGrpcTest, ErrorsMapToGrpcCodesWithRestsMessages) {
  inference::ModelInferResponse response;
  auto unknown = MlpRequest();
  unknown.set_model_name("no-such-model");
  grpc::Status status = Call(&Service::ModelInfer, unknown, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("no-such-model"));

  auto wrong_type = MlpRequest();
  wrong_type.mutable_inputs(0)->set_datatype("INT64");
  status = Call(&Service::ModelInfer, wrong_type, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("input 'features': datatype INT64 does not match the model's FP32"));

  auto wrong_shape = MlpRequest();
  wrong_shape.mutable_inputs(0)->set_shape(1, 5);
  status = Call(&Service::ModelInfer, wrong_shape, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("shape [2,5] does not match the model's [-1,4]"));

  auto short_contents = MlpRequest();
  short_contents.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
  status = Call(&Service::ModelInfer, short_contents, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("fp32_contents has 7 element(s)"));

  auto wrong_field = MlpRequest();
  wrong_field.mutable_inputs(0)->mutable_contents()->clear_fp32_contents();
  for (int i = 0; i < 8; ++i)
    wrong_field.mutable_inputs(0)->mutable_contents()->add_int64_contents(i);
  status = Call(&Service::ModelInfer, wrong_field, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("contents in int64_contents"));

  auto raw_size = MlpRequest();
  raw_size.mutable_inputs(0)->clear_contents();
  raw_size.add_raw_input_contents(std::string(31, '\0'));
  status = Call(&Service::ModelInfer, raw_size, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("raw_input_contents holds 31 bytes"));
  EXPECT_THAT(status.error_message(), HasSubstr("needs 32"));

  auto unknown_input = MlpRequest();
  unknown_input.mutable_inputs(0)->set_name("pixels");
  status = Call(&Service::ModelInfer, unknown_input, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("unknown input 'pixels' (the model takes: features)"));

  auto unknown_output = MlpRequest();
  unknown_output.add_outputs()->set_name("logits");
  status = Call(&Service::ModelInfer, unknown_output, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("unknown requested output 'logits'"));

  inference::ModelMetadataRequest metadata_request;
  metadata_request.set_name("mlp");
  metadata_request.set_version("7");
  inference::ModelMetadataResponse metadata;
  EXPECT_EQ(Call(&Service::ModelMetadata, metadata_request, &metadata).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // The server kept serving through all of it.
  status = Call(&Service::ModelInfer, MlpRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Issue 23: requests REST and gRPC answered differently (gRPC returned plain values for Triton's
// classification parameter, and an empty batch was 400 on REST but UNIMPLEMENTED on gRPC). Each
// now gets the same message on both, with codes that map to each other.
TEST_F(ServeGrpcTest, RestAndGrpcRefuseTheSameRequestsAlike) {
  auto client = server_->Client();
  struct Case {
    std::string what;
    inference::ModelInferRequest grpc;
    std::string rest;
    grpc::StatusCode grpc_code;
    int http_status;
    std::string message;
  };
  std::vector<Case> cases;

  auto classification = MlpRequest();
  (*classification.add_outputs()->mutable_parameters())["classification"].set_int64_param(2);
  classification.mutable_outputs(0)->set_name("probabilities");
  cases.push_back(
      {"classification", classification,
       R"({"inputs":[{"name":"features","shape":[2,4],"datatype":"FP32","data":[1,2,3,4,-1,0.5,0,2]}],)"
       R"("outputs":[{"name":"probabilities","parameters":{"classification":2}}]})",
       grpc::StatusCode::INVALID_ARGUMENT, 400,
       "requested output 'probabilities': parameter 'classification' (Triton's classification "
       "extension) is "
       "not supported"});

  // Issue 44: gRPC read every dimension of a 500,000-dimension shape (389 ms) before it compared
  // the shape with the model's; REST refused more than 32 at once. One limit, checked first.
  auto many_dims = MlpRequest();
  many_dims.mutable_inputs(0)->clear_shape();
  std::string rest_dims;
  for (int i = 0; i < 33; ++i) {
    many_dims.mutable_inputs(0)->add_shape(1);
    rest_dims += i == 0 ? "1" : ",1";
  }
  cases.push_back({"33 dims", many_dims,
                   R"({"inputs":[{"name":"features","shape":[)" + rest_dims +
                       R"(],"datatype":"FP32","data":[1]}]})",
                   grpc::StatusCode::INVALID_ARGUMENT, 400,
                   "input 'features': 'shape' has 33 dims, more than 32"});

  for (const Case& c : cases) {
    inference::ModelInferResponse response;
    const grpc::Status status = Call(&Service::ModelInfer, c.grpc, &response);
    const JsonReply reply = Post(*client, "/v2/models/mlp/infer", c.rest);
    EXPECT_EQ(status.error_code(), c.grpc_code) << c.what << ": " << status.error_message();
    EXPECT_EQ(reply.status, c.http_status) << c.what << ": " << reply.text;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.what;
    ASSERT_TRUE(reply.body.contains("error")) << c.what << ": " << reply.text;
    EXPECT_EQ(reply.body["error"].get<std::string>(), status.error_message()) << c.what;
  }

  // An empty batch runs where its backend can (CpuRef: an empty answer) and is refused where it
  // cannot (CpuAcc: UNIMPLEMENTED, REST 501): either way both transports agree.
  auto empty = MlpRequest();
  empty.mutable_inputs(0)->set_shape(0, 0);
  empty.mutable_inputs(0)->clear_contents();
  inference::ModelInferResponse response;
  const grpc::Status status = Call(&Service::ModelInfer, empty, &response);
  const JsonReply reply =
      Post(*client, "/v2/models/mlp/infer",
           R"({"inputs":[{"name":"features","shape":[0,4],"datatype":"FP32","data":[]}]})");
  if (status.ok()) {
    ASSERT_EQ(reply.status, 200) << reply.text;
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).shape(0), 0);
    EXPECT_EQ(reply.body["outputs"][0]["shape"][0], 0) << reply.text;
  } else {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    EXPECT_EQ(reply.status, 501) << reply.text;
    EXPECT_EQ(reply.body.value("error", ""), status.error_message());
  }
}

// Issue 23 (fuzzing: found checking resource limits, shown by tests/fuzz/grpc_request_fuzz and
// its input corpus/grpc_request/regression_huge_shape_few_contents.bin): the typed contents were
// counted only after the tensor their shape declares was allocated, so a 35-byte message made the
// server allocate and zero 12 GB; here 2 TiB (2^39 elements, 8 values), which the allocator
// refuses.
TEST_F(ServeGrpcTest, TypedContentsAreCountedBeforeTheTensorIsAllocated) {
  inference::ModelInferResponse response;
  auto huge = MlpRequest();
  huge.mutable_inputs(0)->set_shape(0, int64_t{1} << 37);
  const grpc::Status status = Call(&Service::ModelInfer, huge, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("input 'features': fp32_contents has 8 element(s), shape "
                        "[137438953472,4] needs 549755813888"));
  EXPECT_TRUE(Call(&Service::ModelInfer, MlpRequest(), &response).ok());
}

// Issue 23: a 1 MB gzip-compressed ModelInfer was inflated to 1 GiB before the 16 MiB limit was
// checked (1.1 GB of resident memory per message, not given back). The server accepts no
// compressed message: it cannot bound what one inflates to before inflating it.
TEST_F(ServeGrpcTest, ACompressedMessageIsRefusedBeforeItIsInflated) {
#if defined(BACKPLANE_TSAN_BUILD)
  // Tens of MiB through gRPC's uninstrumented zlib and protobuf take minutes under TSan; this is
  // a test of memory and messages, not of threads (release and ASan run it).
  GTEST_SKIP() << "too slow under ThreadSanitizer";
#endif
  auto bomb = MlpRequest();
  bomb.mutable_inputs(0)->clear_contents();
  bomb.add_raw_input_contents(std::string(std::size_t{96} << 20, '\0'));  // gzips to ~100 KB
  const std::optional<int64_t> peak_before = ProcStatusBytes(server_->pid(), "VmHWM");
  ASSERT_TRUE(peak_before) << "no VmHWM in the server's /proc status";
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  context.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  inference::ModelInferResponse response;
  const grpc::Status status = stub_->ModelInfer(&context, bomb, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("gzip"));
  const std::optional<int64_t> peak_after = ProcStatusBytes(server_->pid(), "VmHWM");
  ASSERT_TRUE(peak_after) << "no VmHWM in the server's /proc status";
  EXPECT_LT(*peak_after - *peak_before, int64_t{32} << 20) << "the server inflated the message";

  // Uncompressed calls are served as before.
  EXPECT_TRUE(Call(&Service::ModelInfer, MlpRequest(), &response).ok());
}

// Issue 23: a 50,000-dimension shape got a 100 KB status message (the Node client then hung until
// its deadline) and a 4 MiB model name came back as a 4 MiB trailer. What a message quotes from
// the request is bounded.
TEST_F(ServeGrpcTest, ErrorsQuoteABoundedPartOfTheRequest) {
#if defined(BACKPLANE_TSAN_BUILD)
  // Tens of MiB through gRPC's uninstrumented zlib and protobuf take minutes under TSan; this is
  // a test of memory and messages, not of threads (release and ASan run it).
  GTEST_SKIP() << "too slow under ThreadSanitizer";
#endif
  inference::ModelInferResponse response;
  auto long_name = MlpRequest();
  long_name.set_model_name(std::string(std::size_t{4} << 20, 'm'));
  grpc::Status status;
  {
    // 4 MiB each way through gRPC takes long under ThreadSanitizer on a busy machine.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    status = stub_->ModelInfer(&context, long_name, &response);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(status.error_message().size(), 512u);
  EXPECT_THAT(status.error_message(), HasSubstr("mmm...' (4194304 bytes)"));

  auto many_dims = MlpRequest();
  many_dims.mutable_inputs(0)->clear_shape();
  for (int i = 0; i < 50000; ++i)
    many_dims.mutable_inputs(0)->add_shape(1);
  status = Call(&Service::ModelInfer, many_dims, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(status.error_message().size(), 512u) << status.error_message().substr(0, 512);
  EXPECT_THAT(status.error_message(), HasSubstr("'shape' has 50000 dims, more than 32"));

  auto long_input_name = MlpRequest();
  long_input_name.mutable_inputs(0)->set_name(std::string(100000, 'x'));
  status = Call(&Service::ModelInfer, long_input_name, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(status.error_message().size(), 512u);
}

// Not ready (an unloaded model) → UNAVAILABLE, as REST's 503.
TEST(ServeGrpcLifecycleTest, AnUnloadedModelIsUnavailableAndNotReady) {
  ServeHome home;
  auto server = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  auto client = server->Client();
  ASSERT_EQ(Post(*client, "/v2/repository/models/mlp/unload", "").status, 200);
  auto channel = grpc::CreateChannel(server->grpc_target(), grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  grpc::ClientContext ready_context;
  inference::ModelReadyRequest ready_request;
  ready_request.set_name("mlp");
  inference::ModelReadyResponse ready;
  ASSERT_TRUE(stub->ModelReady(&ready_context, ready_request, &ready).ok());
  EXPECT_FALSE(ready.ready());

  grpc::ClientContext infer_context;
  inference::ModelInferRequest request;
  request.set_model_name("mlp");
  inference::ModelInferResponse response;
  const grpc::Status status = stub->ModelInfer(&infer_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("unloaded"));
}

TEST(ServeGrpcLifecycleTest, OffMeansNoGrpcAndABadAddressIsAStartupError) {
  ServeHome home;
  auto server = ServeProcess::Start({"--models", home.models().string(), "--backends",
                                     home.backends().string(), "--grpc-listen", "off"});
  EXPECT_EQ(server->grpc_port(), 0);
  EXPECT_THAT(server->Log(), ::testing::Not(HasSubstr("grpc://")));

  // A gRPC address already taken is a startup error, not a shared port.
  auto first = ServeProcess::Start(
      {"--models", home.models().string(), "--backends", home.backends().string()});
  const auto taken = ServeProcess::RunToExit(
      {"--listen", "127.0.0.1:0", "--grpc-listen", first->grpc_target(), "--models",
       home.models().string(), "--backends", home.backends().string()});
  EXPECT_EQ(taken.exit_code, 1) << taken.output;
  EXPECT_THAT(taken.output, HasSubstr("cannot listen for gRPC on " + first->grpc_target()));

  const auto bad = ServeProcess::RunToExit(
      {"--listen", "127.0.0.1:0", "--grpc-listen", "nowhere", "--models", home.models().string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("gRPC listen address 'nowhere'"));
}

// ---- HTTP/2 floods from raw sockets (bench/body_burst.py has the same client in Python)

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload = {}) {
  std::string frame;
  const auto length = static_cast<uint32_t>(payload.size());
  frame += static_cast<char>(length >> 16);
  frame += static_cast<char>(length >> 8);
  frame += static_cast<char>(length);
  frame += static_cast<char>(type);
  frame += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8)
    frame += static_cast<char>(stream >> shift);
  frame += payload;
  return frame;
}

// HPACK "literal header field without indexing, new name", no Huffman; lengths below 127.
std::string Literal(std::string_view name, std::string_view value) {
  std::string field(1, '\0');
  field += static_cast<char>(name.size());
  field += name;
  field += static_cast<char>(value.size());
  field += value;
  return field;
}

int64_t VmRssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoll(line.substr(6));
  }
  return 0;
}

// One raw HTTP/2 connection to the gRPC port that opens `streams` ModelInfer calls (HEADERS),
// each cancelled at once (RST_STREAM CANCEL) when `reset`, as fast as the socket takes them,
// once both SETTINGS are acknowledged. The connection stays open until destroyed; a thread
// reads and discards what the server sends. Thread-compatible.
class H2Flood {
 public:
  H2Flood(int port, int streams, bool reset) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      return;
    if (!Send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + Frame(4, 0, 0)) || !ExchangeSettings())
      return;
    reader_ = std::thread([this] {
      char buffer[65536];
      while (recv(fd_, buffer, sizeof buffer, 0) > 0) {
      }
    });
    const std::string block = Literal(":method", "POST") + Literal(":scheme", "http") +
                              Literal(":path", "/inference.GRPCInferenceService/ModelInfer") +
                              Literal(":authority", "127.0.0.1") +
                              Literal("content-type", "application/grpc") +
                              Literal("te", "trailers");
    std::string batch;
    for (int i = 0; i < streams; ++i) {
      const auto stream = static_cast<uint32_t>(2 * i + 1);
      batch += Frame(1, 0x4, stream, block);  // HEADERS, END_HEADERS
      if (reset)
        batch += Frame(3, 0, stream, std::string("\0\0\0\x08", 4));  // RST_STREAM CANCEL
      if (batch.size() >= (64u << 10) || i + 1 == streams) {
        if (!Send(batch))
          return;  // the server closed the connection: it refused the flood
        batch.clear();
      }
      sent_ = i + 1;
    }
  }
  ~H2Flood() {
    shutdown(fd_, SHUT_RDWR);  // the reader leaves its recv before the descriptor goes
    if (reader_.joinable())
      reader_.join();
    close(fd_);
  }
  H2Flood(const H2Flood&) = delete;
  H2Flood& operator=(const H2Flood&) = delete;

  int sent() const { return sent_; }

 private:
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Reads until the server's SETTINGS (acknowledged) and its acknowledgement of ours arrived.
  bool ExchangeSettings() {
    timeval timeout{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::string buffer;
    bool theirs = false;
    bool ours = false;
    while (!(theirs && ours)) {
      char chunk[4096];
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0)
        return false;
      buffer.append(chunk, static_cast<std::size_t>(n));
      while (buffer.size() >= 9) {
        const std::size_t length = (static_cast<uint8_t>(buffer[0]) << 16) |
                                   (static_cast<uint8_t>(buffer[1]) << 8) |
                                   static_cast<uint8_t>(buffer[2]);
        if (buffer.size() < 9 + length)
          break;
        if (buffer[3] == 4 && (buffer[4] & 1) == 0) {
          theirs = true;
          if (!Send(Frame(4, 1, 0)))
            return false;
        } else if (buffer[3] == 4) {
          ours = true;
        }
        buffer.erase(0, 9 + length);
      }
    }
    timeout.tv_sec = 0;
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return true;
  }

  int fd_ = -1;
  int sent_ = 0;
  std::thread reader_;
};

// The highest VmRSS of `pid` sampled every 100 ms, in KiB, while `flood` runs and `settle` after.
template <typename Flood>
int64_t PeakRssKib(pid_t pid, Flood flood, std::chrono::milliseconds settle) {
  std::atomic<bool> sampling{true};
  std::atomic<int64_t> peak{VmRssKib(pid)};
  std::thread sampler([&] {
    while (sampling) {
      peak = std::max<int64_t>(peak, VmRssKib(pid));
      std::this_thread::sleep_for(100ms);
    }
  });
  flood();
  std::this_thread::sleep_for(settle);
  sampling = false;
  sampler.join();
  return peak;
}

// What a flood may add to the server's resident memory: max_buffered_body_bytes (the gRPC
// memory quota) plus this, for everything gRPC holds outside its quota (docs/operators.md,
// "Memory under bursts").
constexpr int64_t kFloodAllowanceKib = 64 << 10;

class ServeGrpcFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
    GTEST_SKIP() << "resident memory under a sanitizer measures the sanitizer";
#endif
    home_.Write("config.json", R"({"max_body_bytes": 1048576,
                                   "max_buffered_body_bytes": 33554432})");
    server_ = ServeProcess::Start({"--models", home_.models().string(), "--backends",
                                   home_.backends().string(), "--config",
                                   (home_.path() / "config.json").string()});
    ASSERT_NE(server_->grpc_port(), 0) << server_->Log();
  }

  // Floods from 8 connections at once, each `streams` calls, and returns the peak VmRSS growth
  // in KiB while the connections stay open and 2 s after the last frame was sent.
  int64_t FloodGrowthKib(int streams, bool reset) {
    const int64_t before = VmRssKib(server_->pid());
    return PeakRssKib(
               server_->pid(),
               [&] {
                 std::vector<std::thread> clients;
                 std::vector<std::unique_ptr<H2Flood>> floods(8);
                 for (std::size_t i = 0; i < floods.size(); ++i) {
                   clients.emplace_back([&, i] {
                     floods[i] = std::make_unique<H2Flood>(server_->grpc_port(), streams, reset);
                   });
                 }
                 for (auto& client : clients)
                   client.join();
                 std::this_thread::sleep_for(2s);  // the connections stay open meanwhile
               },
               0ms) -
           before;
  }

  ServeHome home_;
  std::unique_ptr<ServeProcess> server_;
};

// Issue 44: 84,000 calls opened on 8 connections and never cancelled held 1.28 GB (gRPC let a
// connection open 2^31 streams); grpc_max_concurrent_streams (100) bounds them per connection.
TEST_F(ServeGrpcFloodTest, CallsLeftOpenAreBoundedWhileTheyArrive) {
  const int64_t growth = FloodGrowthKib(10500, /*reset=*/false);
  EXPECT_LT(growth, (32 << 10) + kFloodAllowanceKib) << "KiB";
  // The server still answers.
  auto channel = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  inference::ServerLiveResponse live;
  EXPECT_TRUE(stub->ServerLive(&context, inference::ServerLiveRequest(), &live).ok());
}

// The HTTP/2 rapid reset (CVE-2023-44487): 84,000 HEADERS+RST_STREAM pairs on 8 connections
// drove the server to 1.2 GB resident several seconds after they were sent. Disabled: gRPC 1.51
// gives no way to bound it (docs/operators.md, "Memory under bursts"); this is the check for
// whatever does.
TEST_F(ServeGrpcFloodTest, DISABLED_RapidResetIsBoundedWhileItArrives) {
  const int64_t growth = FloodGrowthKib(10500, /*reset=*/true);
  EXPECT_LT(growth, (32 << 10) + kFloodAllowanceKib) << "KiB";
}

}  // namespace
}  // namespace backplane::testing
