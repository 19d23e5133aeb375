// A batch never mixes clients (issue 44): a model is batched only when its rows stay apart
// (onnx's CheckRowsIndependent, at load). The generated catalogue's unsafe models are refused at
// load naming their node; its safe ones, served batched to concurrent clients, answer every
// request exactly as the same request alone (a lone request padded with zero rows too); and a
// request of zero rows gets the same answer batched as unbatched, over REST and gRPC.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <iterator>
#include <random>

#include "cli/serve_command.hpp"
#include "grpc_service.grpc.pb.h"
#include "onnx/batch_catalogue.hpp"
#include "onnx/model_builder.hpp"
#include "serve_test_util.hpp"
#include "serving/inference.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kBatchedConfig =
    R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching":
        {"max_queue_delay_us": 2000}})";
constexpr const char* kAloneConfig = R"({"backends": ["CpuRef"]})";

// Writes `model` as models/`name` with `config`.
void WriteModel(const ServeHome& home, const std::string& name, const std::string& model,
                const std::string& config) {
  home.Write("models/" + name + "/1/model.onnx", model);
  home.Write("models/" + name + "/config.json", config);
}

// Softmax over axis 0 of x [N, M], both symbolic: each output row is normalised over every row
// of the execution, other clients' rows included.
std::string SoftmaxOverTheBatchModel() {
  ModelBuilder model;
  model.Input("x", {-1, -1}).Output("y", {-1, -1});
  model.NameDimension("x", 1, "M").NameDimension("y", 1, "M");
  SetInt(model.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", 0);
  return model.Serialize();
}

server::InferenceRequestParser RequestParserOf(std::vector<Tensor> inputs) {
  return [inputs = std::move(inputs)](const Network& network) -> Result<server::InferenceRequest> {
    server::InferenceRequest request;
    request.inputs = inputs;
    for (std::size_t o = 0; o < network.outputs.size(); ++o) {
      request.outputs.push_back(o);
      request.binary_outputs.push_back(false);
    }
    return request;
  };
}

// One inference through the serving core, as a transport starts it.
std::future<Result<server::InferenceOutcome>> StartInferenceOf(const server::ServeContext& context,
                                                               const std::string& model,
                                                               std::vector<Tensor> inputs) {
  return StartInference(context.inference, model, RequestParserOf(std::move(inputs)));
}

// The inputs of a request of `rows` rows to `batch_case`, values in [-1, 1).
std::vector<Tensor> RandomInputs(const BatchCase& batch_case, int64_t rows,
                                 std::mt19937_64& random) {
  std::vector<Tensor> inputs;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const auto& [name, dims] : batch_case.inputs) {
    Shape shape = dims;
    shape[0] = rows;
    Tensor tensor(TensorInfo{DataType::kFloat32, shape});
    for (float& element : tensor.Elements<float>())
      element = value(random);
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

std::vector<float> ElementsOf(const Tensor& tensor) {
  const auto elements = tensor.Elements<float>();
  return {elements.begin(), elements.end()};
}

// Fails the test when `batched` is not exactly `alone`.
void ExpectSameAnswer(const Result<server::InferenceOutcome>& batched,
                      const Result<server::InferenceOutcome>& alone, const std::string& what) {
  ASSERT_TRUE(alone.ok()) << what << ": alone: " << alone.error().ToString();
  ASSERT_TRUE(batched.ok()) << what << ": batched: " << batched.error().ToString();
  ASSERT_EQ(batched->outputs.size(), alone->outputs.size()) << what;
  for (std::size_t o = 0; o < batched->outputs.size(); ++o) {
    EXPECT_EQ(batched->outputs[o].info().shape, alone->outputs[o].info().shape) << what;
    EXPECT_EQ(ElementsOf(batched->outputs[o]), ElementsOf(alone->outputs[o]))
        << what << ", output " << o;
  }
}

// Fails before the rule: the model loaded and 8 clients got one another's rows.
TEST(BatchIndependenceTest, ASoftmaxOverTheBatchIsRefusedAtLoad) {
  ServeHome home;
  WriteModel(home, "softmax_rows", SoftmaxOverTheBatchModel(), kBatchedConfig);
  WriteModel(home, "softmax_rows_alone", SoftmaxOverTheBatchModel(), kAloneConfig);
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto reason = running.core->context().repository.Unavailable("softmax_rows");
  ASSERT_TRUE(reason.has_value()) << "a model that mixes rows was batched";
  EXPECT_THAT(*reason,
              HasSubstr("model 'softmax_rows' version 1: cannot batch (max_batch_size in "
                        "config.json) because node 'sm' (Softmax) normalises over axis 0, the "
                        "batch dimension: rows of different requests would mix. Only a model "
                        "whose rows stay apart can be batched"));
  EXPECT_THAT(*reason, HasSubstr("remove max_batch_size and dynamic_batching from its "
                                 "config.json to serve it unbatched"));
  // A load asked for over REST says the same; unbatched, the model serves.
  httplib::Client client("127.0.0.1", running.http.port);
  const auto load = Post(client, "/v2/repository/models/softmax_rows/load", "");
  EXPECT_EQ(load.status, 400) << load.text;
  EXPECT_THAT(load.text, HasSubstr("node 'sm' (Softmax) normalises over axis 0"));
  EXPECT_EQ(Get(client, "/v2/models/softmax_rows_alone/ready").status, 200);
}

// Every unsafe model of a generated catalogue is refused at load, naming its node (or, for one
// whose output has a fixed first dimension, that): none is ever batched.
TEST(BatchIndependenceTest, EveryUnsafeCatalogueModelIsRefusedAtLoad) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  ServeHome home;
  const auto catalogue = GenerateBatchCatalogue(seed);
  for (const BatchCase& batch_case : catalogue) {
    if (!batch_case.safe())
      WriteModel(home, batch_case.name, batch_case.model, kBatchedConfig);
  }
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  int by_node = 0;
  for (const BatchCase& batch_case : catalogue) {
    if (batch_case.safe())
      continue;
    SCOPED_TRACE(batch_case.name);
    const auto reason = running.core->context().repository.Unavailable(batch_case.name);
    ASSERT_TRUE(reason.has_value()) << "batched";
    EXPECT_THAT(*reason, HasSubstr("model '" + batch_case.name +
                                   "' version 1: cannot batch (max_batch_size in config.json) "
                                   "because "));
    if (reason->find("whose first dimension is fixed") == std::string::npos) {
      EXPECT_THAT(*reason, HasSubstr(batch_case.refused + " "));
      EXPECT_THAT(*reason, HasSubstr(batch_case.reason));
      ++by_node;
    }
  }
  EXPECT_GT(by_node, 20);
}

// Every safe model of a generated catalogue, served batched (max_batch_size 8) beside the same
// model unbatched: 8 clients send requests of 1 to 3 rows to random models at once, and each
// answer is exactly the answer to the same request alone. Then, per model, a lone request of 3
// rows, which executes padded with a zero row to 4 (ExecutionBatchSizes): the same again.
TEST(BatchIndependenceTest, EverySafeCatalogueModelAnswersConcurrentClientsAsAlone) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  ServeHome home;
  std::vector<BatchCase> safe;
  for (BatchCase& batch_case : GenerateBatchCatalogue(seed)) {
    if (batch_case.safe())
      safe.push_back(std::move(batch_case));
  }
  for (const BatchCase& batch_case : safe) {
    WriteModel(home, batch_case.name, batch_case.model, kBatchedConfig);
    WriteModel(home, batch_case.name + "_alone", batch_case.model, kAloneConfig);
  }
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto& context = running.core->context();
  for (const BatchCase& batch_case : safe) {
    ASSERT_FALSE(context.repository.Unavailable(batch_case.name).has_value())
        << batch_case.name << ": " << *context.repository.Unavailable(batch_case.name);
  }

  constexpr int kClients = 8;
  constexpr int kRequestsPerClient = 40;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 random(seed + static_cast<uint64_t>(c) + 1);
      struct Sent {
        const BatchCase* model;
        std::vector<Tensor> inputs;
        std::future<Result<server::InferenceOutcome>> answer;
      };
      // Four requests in flight at once per client, to the models every client sends its burst
      // of that number to (the clients go at about the same pace): requests of several clients
      // meet in one batch, and a client's own requests too.
      for (int burst = 0; burst < kRequestsPerClient / 4; ++burst) {
        std::vector<Sent> sent;
        for (int i = 0; i < 4; ++i) {
          std::mt19937_64 pick(seed + static_cast<uint64_t>(burst) * 4 + static_cast<uint64_t>(i));
          const BatchCase& model = safe[pick() % safe.size()];
          auto inputs = RandomInputs(model, 1 + static_cast<int64_t>(random() % 3), random);
          auto answer = StartInferenceOf(context, model.name, inputs);
          sent.push_back({&model, std::move(inputs), std::move(answer)});
        }
        for (std::size_t i = 0; i < sent.size(); ++i) {
          const auto batched = sent[i].answer.get();
          const auto alone = InferNow(context.inference, sent[i].model->name + "_alone",
                                      RequestParserOf(sent[i].inputs));
          ExpectSameAnswer(batched, alone,
                           "client " + std::to_string(c) + " burst " + std::to_string(burst) +
                               ", " + sent[i].model->name);
        }
      }
    });
  }
  for (auto& client : clients)
    client.join();
  // The answers above prove something only if requests really shared executions: a batch of
  // more than 4 rows holds at least two requests (each has at most 3). Counted from the batch
  // size histogram, not by executions against requests, which depends on how busy the machine is.
  uint64_t shared_batches = 0;
  for (const BatchCase& batch_case : safe) {
    const auto sizes = context.metrics.ForModel(batch_case.name).batching.batch_size.Read();
    const auto four = std::find(sizes.upper_bounds.begin(), sizes.upper_bounds.end(), 4.0);
    ASSERT_NE(four, sizes.upper_bounds.end());
    shared_batches += sizes.count - sizes.cumulative_counts[four - sizes.upper_bounds.begin()];
  }
  EXPECT_GT(shared_batches, 0u) << "no execution held two requests";

  std::mt19937_64 random(seed);
  for (const BatchCase& batch_case : safe) {
    auto inputs = RandomInputs(batch_case, 3, random);
    const auto batched = StartInferenceOf(context, batch_case.name, inputs).get();
    const auto alone =
        InferNow(context.inference, batch_case.name + "_alone", RequestParserOf(inputs));
    ExpectSameAnswer(batched, alone, "lone 3 rows, " + batch_case.name);
    if (batched.ok()) {
      for (const Tensor& output : batched->outputs)
        EXPECT_EQ(output.info().shape[0], 3) << batch_case.name << ": a padding row came back";
    }
  }
}

// A REST infer body with one FP32 input `features` of `shape`, its values all 0.25.
std::string ZeroRowsBody(const Shape& shape) {
  const std::size_t count = static_cast<std::size_t>(ElementCount(shape));
  return json({{"inputs",
                {{{"name", "features"},
                  {"shape", shape},
                  {"datatype", "FP32"},
                  {"data", std::vector<float>(count, 0.25f)}}}}})
      .dump();
}

// The same over gRPC: its status code and message.
std::pair<grpc::StatusCode, std::string> GrpcZeroRows(inference::GRPCInferenceService::Stub& stub,
                                                      const std::string& model,
                                                      const Shape& shape) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("features");
  input->set_datatype("FP32");
  for (int64_t dim : shape)
    input->add_shape(dim);
  for (int64_t i = 0; i < ElementCount(shape); ++i)
    input->mutable_contents()->add_fp32_contents(0.25f);
  inference::ModelInferResponse response;
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  const grpc::Status status = stub.ModelInfer(&call, request, &response);
  std::string answer = status.error_message();
  if (status.ok()) {
    for (const auto& output : response.outputs()) {
      answer += output.name() + " [";
      for (int64_t dim : output.shape())
        answer += std::to_string(dim) + ",";
      answer += "] " + std::to_string(output.contents().fp32_contents_size()) + " values; ";
    }
  }
  return {status.error_code(), answer};
}

// `text` with the batched model's name written as the unbatched one's wherever it stands quoted
// ('m', "m") or in a path (/m/): answers and messages name the model.
std::string AsAlone(std::string text, const std::string& batched, const std::string& alone) {
  for (const auto& [open, close] : {std::pair{'\'', '\''}, {'"', '"'}, {'/', '/'}}) {
    const std::string from = open + batched + close;
    const std::string to = open + alone + close;
    for (std::size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  }
  return text;
}

// A request of zero rows gets the answer the model gives it unbatched: status and message, over
// REST and gRPC, alone and while other requests fill batches around it, with the shape the
// model expects ([0,4]) and a wrong one ([0,3]); on CpuRef (which runs an empty batch) and on
// CpuAcc (which does not: 501).
TEST(BatchIndependenceTest, AZeroRowRequestGetsTheSameAnswerBatchedAndUnbatched) {
  BACKPLANE_REQUIRE_PATH(fs::path(BACKPLANE_CPU_ACC));
  ServeHome home;
  CopyFile(BACKPLANE_CPU_ACC, home.backends() / "Backplane_CpuAcc_backend.so");
  const std::string mlp = (home.models() / "mlp" / "1" / "model.onnx").string();
  std::string model_bytes;
  {
    std::ifstream file(mlp, std::ios::binary);
    model_bytes.assign(std::istreambuf_iterator<char>(file), {});
  }
  ASSERT_FALSE(model_bytes.empty());
  for (const std::string backend : {"CpuRef", "CpuAcc"}) {
    const std::string name = "mlp_" + backend;
    WriteModel(
        home, name, model_bytes,
        R"({"backends": [")" + backend +
            R"("], "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_us": 20000}})");
    WriteModel(home, name + "_alone", model_bytes, R"({"backends": [")" + backend + R"("]})");
  }
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto& context = running.core->context();
  httplib::Client rest("127.0.0.1", running.http.port);
  auto channel = grpc::CreateChannel(running.grpc->ToString(), grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  std::mt19937_64 random(7);
  for (const std::string backend : {"CpuRef", "CpuAcc"}) {
    const std::string batched = "mlp_" + backend;
    const std::string alone = batched + "_alone";
    const BatchCase company{.name = batched, .inputs = {{"features", {-1, 4}}}};
    for (const Shape& shape : {Shape{0, 4}, Shape{0, 3}}) {
      for (const bool with_company : {false, true}) {
        const std::string what =
            batched + " " + ToString(shape) + (with_company ? ", among other requests" : ", alone");
        // Others in the batcher meanwhile: with a delay of 20 ms they wait for company, and
        // the zero-row request arrives among them.
        std::vector<std::future<Result<server::InferenceOutcome>>> others;
        const auto send_company = [&] {
          others.clear();
          if (with_company) {
            for (int i = 0; i < 3; ++i)
              others.push_back(
                  StartInferenceOf(context, batched, RandomInputs(company, 1, random)));
          }
        };
        send_company();
        const auto rest_batched =
            Post(rest, "/v2/models/" + batched + "/infer", ZeroRowsBody(shape));
        const auto rest_alone = Post(rest, "/v2/models/" + alone + "/infer", ZeroRowsBody(shape));
        EXPECT_EQ(rest_batched.status, rest_alone.status) << what << ": " << rest_batched.text;
        EXPECT_EQ(AsAlone(rest_batched.text, batched, alone), rest_alone.text) << what;
        send_company();
        const auto grpc_batched = GrpcZeroRows(*stub, batched, shape);
        const auto grpc_alone = GrpcZeroRows(*stub, alone, shape);
        EXPECT_EQ(grpc_batched.first, grpc_alone.first) << what << ": " << grpc_batched.second;
        EXPECT_EQ(AsAlone(grpc_batched.second, batched, alone), grpc_alone.second) << what;
        for (auto& other : others) {
          const auto answer = other.get();
          EXPECT_TRUE(answer.ok()) << what << ": " << answer.error().ToString();
        }
        if (backend == "CpuAcc" && shape == Shape{0, 4}) {
          EXPECT_EQ(rest_alone.status, 501) << rest_alone.text;
          EXPECT_EQ(grpc_alone.first, grpc::StatusCode::UNIMPLEMENTED) << grpc_alone.second;
        }
      }
    }
  }
}

}  // namespace
}  // namespace backplane::testing
