// Dynamic batching (issue 21): the config keys and their refusals, the dispatch rule on seeded
// random queues, and whole servers in this process whose batched answers are compared with the
// same requests run alone, over the serving core, REST and gRPC, with mixed shapes, deadlines,
// an execution error, overload and ordering.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <random>
#include <regex>
#include <set>

#include "cli/serve_command.hpp"
#include "grpc_service.grpc.pb.h"
#include "onnx/model_builder.hpp"
#include "sanitizer_build.hpp"
#include "serve_test_util.hpp"
#include "serving/dynamic_batcher.hpp"
#include "serving/inference.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using server::ServeConfig;
using ::testing::HasSubstr;

// ---- Config ---------------------------------------------------------------------------------

TEST(BatchingConfigTest, ParsesTritonsKeys) {
  auto config = server::ParseModelConfigText(
      R"({"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_us": 2000,
          "preferred_batch_sizes": [64, 16], "preserve_ordering": true}})",
      "m/config.json");
  ASSERT_TRUE(config.ok()) << config.error().ToString();
  EXPECT_EQ(config->max_batch_size, 64);
  ASSERT_TRUE(config->dynamic_batching.has_value());
  EXPECT_EQ(config->dynamic_batching->max_queue_delay_us, 2000);
  EXPECT_EQ(config->dynamic_batching->preferred_batch_sizes, (std::vector<int64_t>{16, 64}));
  EXPECT_TRUE(config->dynamic_batching->preserve_ordering);

  // Off unless dynamic_batching is present; its keys default as Triton's do.
  auto plain = server::ParseModelConfigText(R"({"max_batch_size": 8})", "m/config.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->dynamic_batching.has_value());
  auto defaults = server::ParseModelConfigText(R"({"max_batch_size": 8, "dynamic_batching": {}})",
                                               "m/config.json");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->dynamic_batching, server::DynamicBatching{});
}

TEST(BatchingConfigTest, RefusesEveryBadValueNamingTheKeyAndWhy) {
  struct Case {
    const char* config;
    const char* message;
  };
  const Case cases[] = {
      {R"({"max_batch_size": -1})", "'max_batch_size' must be an integer from 1 to 65536"},
      {R"({"max_batch_size": 65537})", "'max_batch_size' must be an integer from 1 to 65536"},
      {R"({"max_batch_size": "8"})", "or 0 for a model that does not batch; got \"8\""},
      {R"({"max_batch_size": 2.5})", "'max_batch_size' must be an integer"},
      {R"({"dynamic_batching": {}})", "'dynamic_batching' needs 'max_batch_size' from 1"},
      {R"({"max_batch_size": 0, "dynamic_batching": {}})", "needs 'max_batch_size' from 1"},
      {R"({"max_batch_size": 8, "dynamic_batching": []})", "'dynamic_batching' must be an object"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_us": -1}})",
       "'dynamic_batching.max_queue_delay_us' must be an integer from 0 to 1000000"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_us": 1000001}})",
       "'dynamic_batching.max_queue_delay_us' must be an integer from 0 to 1000000"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_us": "2000"}})",
       "got \"2000\""},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [0]}})",
       "'dynamic_batching.preferred_batch_sizes' holds 0, which is not a positive integer"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [-4]}})",
       "holds -4, which is not a positive integer batch size"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [2.5]}})",
       "holds 2.5, which is not a positive integer batch size"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [4, 16]}})",
       "holds 16, more than max_batch_size 8: no batch can reach it"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": [4, 4]}})",
       "holds 4 twice"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_sizes": 4}})",
       "'dynamic_batching.preferred_batch_sizes' must be an array of batch sizes; got 4"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"preserve_ordering": 1}})",
       "'dynamic_batching.preserve_ordering' must be true or false; got 1"},
      {R"({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay": 10}})",
       "'dynamic_batching' has unknown key 'max_queue_delay' (known: max_queue_delay_us, "
       "preferred_batch_sizes, preserve_ordering)"},
      {R"({"max_batch": 8})",
       "unknown key 'max_batch' (known: backends, max_in_flight, "
       "instances, version_policy, max_batch_size, dynamic_batching, backend_options)"},
  };
  for (const auto& [text, message] : cases) {
    auto config = server::ParseModelConfigText(text, "repo/m/config.json");
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_EQ(config.error().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(config.error().message(), HasSubstr("repo/m/config.json")) << text;
    EXPECT_THAT(config.error().message(), HasSubstr(message)) << text;
  }
}

// ---- The dispatch rule ----------------------------------------------------------------------

// docs/operators.md's rule, stated independently over prefix sums: at least max_batch_size rows
// waiting → the most requests from the oldest whose rows fit in it; else the most requests from
// the oldest whose rows add up exactly to a preferred size; else everything once the delay has
// passed; else nothing.
std::size_t ExpectedDispatch(const std::vector<int64_t>& rows, int64_t max_batch_size,
                             const std::vector<int64_t>& preferred, bool delay_passed) {
  std::vector<int64_t> prefix{0};
  for (int64_t row_count : rows)
    prefix.push_back(prefix.back() + row_count);
  if (prefix.back() >= max_batch_size) {
    std::size_t count = 0;
    while (count + 1 < prefix.size() && prefix[count + 1] <= max_batch_size)
      ++count;
    return count;
  }
  for (std::size_t count = rows.size(); count >= 1; --count) {
    if (std::find(preferred.begin(), preferred.end(), prefix[count]) != preferred.end())
      return count;
  }
  return delay_passed ? rows.size() : 0;
}

TEST(BatchingPolicyTest, TheDispatchRuleHoldsOnSeededRandomQueues) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  std::mt19937_64 random(seed);
  const auto uniform = [&random](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random);
  };
  for (int round = 0; round < 20000; ++round) {
    const int64_t max_batch_size = uniform(1, 64);
    std::vector<int64_t> rows(static_cast<std::size_t>(uniform(0, 20)));
    for (auto& row_count : rows)
      row_count = uniform(0, 9) == 0 ? 0 : uniform(1, std::min<int64_t>(max_batch_size, 8));
    std::vector<int64_t> preferred;
    for (int64_t i = uniform(0, 3); i > 0; --i)
      preferred.push_back(uniform(1, max_batch_size));
    std::sort(preferred.begin(), preferred.end());
    preferred.erase(std::unique(preferred.begin(), preferred.end()), preferred.end());
    const bool delay_passed = uniform(0, 1) == 1;

    const std::size_t count =
        server::RequestsToDispatch(rows, max_batch_size, preferred, delay_passed);
    const std::size_t expected = ExpectedDispatch(rows, max_batch_size, preferred, delay_passed);
    int64_t taken = 0;
    for (std::size_t i = 0; i < count && i < rows.size(); ++i)
      taken += rows[i];
    ASSERT_EQ(count, expected) << "round " << round << ", max " << max_batch_size << ", rows "
                               << ::testing::PrintToString(rows) << ", preferred "
                               << ::testing::PrintToString(preferred) << ", delay passed "
                               << delay_passed;
    ASSERT_LE(taken, max_batch_size) << "round " << round;
  }
}

// The execution sizes (a batch's rows rounded up to one of them) on seeded random configs: exactly
// the powers of two below max_batch_size, the preferred sizes and max_batch_size, ascending, and
// so a size for every batch of 1..max_batch_size rows.
TEST(BatchingPolicyTest, ExecutionBatchSizesArePowersOfTwoPreferredSizesAndTheMaximum) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  for (int round = 0; round < 500; ++round) {
    const int64_t max_batch_size = std::uniform_int_distribution<int64_t>(1, 300)(random);
    std::set<int64_t> preferred;
    for (int64_t size = 1; size <= max_batch_size; ++size) {
      if (std::uniform_int_distribution<int>(0, 9)(random) == 0)
        preferred.insert(size);
    }
    const std::vector<int64_t> preferred_sizes(preferred.begin(), preferred.end());
    const auto sizes = server::ExecutionBatchSizes(max_batch_size, preferred_sizes);
    const auto trace = [&] {
      return "round " + std::to_string(round) + ", max " + std::to_string(max_batch_size) +
             ", preferred " + ::testing::PrintToString(preferred_sizes) + ", got " +
             ::testing::PrintToString(sizes);
    };
    std::set<int64_t> expected(preferred);
    expected.insert(max_batch_size);
    for (int64_t power = 1; power < max_batch_size; power *= 2)
      expected.insert(power);
    ASSERT_EQ(sizes, std::vector<int64_t>(expected.begin(), expected.end())) << trace();
    for (int64_t rows = 1; rows <= max_batch_size; ++rows) {
      const auto fits = std::lower_bound(sizes.begin(), sizes.end(), rows);
      ASSERT_NE(fits, sizes.end()) << trace() << ", rows " << rows;
      ASSERT_LT(*fits, 2 * rows) << trace() << ": padding of at most rows - 1";
    }
  }
}

// The rule of skipped waits (docs/operators.md, "Dynamic batching"), restated from the docs
// and held against CompanyOutlook on seeded random histories: after 8 waits in a row that
// gathered no company, a lone request skips its wait except every 16th; a batch of two or more
// requests restores waiting; a lone request that did not wait (it filled a batch) changes
// nothing.
TEST(BatchingPolicyTest, LoneRequestsSkipWaitsOnlyAfterEightVainOnesOnSeededHistories) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED=" + std::to_string(seed) +
               " replays it)");
  std::mt19937_64 random(seed);
  for (int history = 0; history < 200; ++history) {
    server::CompanyOutlook outlook;
    int vain_since_company = 0;   // uncapped
    int asks_while_skipping = 0;  // SkipWait calls since company, once 8 waits were vain
    for (int step = 0; step < 400; ++step) {
      const int event = std::uniform_int_distribution<int>(0, 99)(random);
      // Company is rare, as under one client: long vain runs happen.
      if (event < 3) {
        outlook.Record(std::uniform_int_distribution<std::size_t>(2, 64)(random), event == 0);
        vain_since_company = asks_while_skipping = 0;
      } else if (event < 10) {
        outlook.Record(1, /*waited=*/false);
      } else if (event < 50) {
        outlook.Record(1, /*waited=*/true);
        ++vain_since_company;
      } else {
        bool expected = false;
        if (vain_since_company >= 8)
          expected = ++asks_while_skipping % 16 != 0;
        ASSERT_EQ(outlook.SkipWait(), expected)
            << "history " << history << " step " << step << ": " << vain_since_company
            << " vain waits since company, ask " << asks_while_skipping << " while skipping";
      }
    }
  }
}

// ---- Servers in this process ----------------------------------------------------------------

// Relu over x [N, M] (both symbolic): requests of different M must never share a batch.
std::string ReluModel() {
  ModelBuilder builder;
  builder.Input("x", {-1, -1}).Output("y", {-1, -1});
  builder.NameDimension("x", 1, "M").NameDimension("y", 1, "M");
  builder.Node("Relu", {"x"}, {"y"});
  return builder.Serialize();
}

// A server home (ServeHome: mlp, mnist and CpuRef) with more models: "relu" and "identity"
// written from the builders above, and "mlp_alone", a copy of mlp without batching.
void AddBatchingModels(const ServeHome& home) {
  home.Write("models/relu/1/model.onnx", ReluModel());
  home.Write("models/relu_alone/1/model.onnx", ReluModel());
  home.Write("models/identity/1/model.onnx", RowIdentityModel());
  fs::copy(home.models() / "mlp", home.models() / "mlp_alone", fs::copy_options::recursive);
  home.Write("models/mlp_alone/config.json", R"({"backends": ["CpuRef"]})");
  home.Write("models/identity/config.json", R"({"backends": ["TestFailOnNegative"]})");
  CopyFile(Fixture("FailOnNegative"), home.backends() / "Test_FailOnNegative_backend.so");
}

// A server with AddBatchingModels' models and `relu` configured by `relu_config` (its
// config.json), not watching the backend directory.
class ReluBatchingServer {
 public:
  explicit ReluBatchingServer(const std::string& relu_config) {
    AddBatchingModels(home_);
    home_.Write("models/relu/config.json", relu_config);
    running_.emplace(StartInProcess(InProcessConfig(home_, /*grpc=*/true)));
  }
  const server::ServeContext& context() const { return running_->core->context(); }

 private:
  ServeHome home_;  // outlives the server
  std::optional<server::RunningServer> running_;
};

// FP32 values in [-1, 1).
Tensor RandomTensor(std::mt19937_64& random, Shape shape) {
  Tensor tensor(TensorInfo{DataType::kFloat32, std::move(shape)});
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (float& element : tensor.Elements<float>())
    element = value(random);
  return tensor;
}

Tensor RandomRows(std::mt19937_64& random, int64_t rows, int64_t columns) {
  return RandomTensor(random, {rows, columns});
}

// A parser that hands over `inputs` as the request (every output asked for), or fails with
// `parse_error` when it is not empty: a request that fails validation.
server::InferenceRequestParser ParserOf(std::vector<Tensor> inputs, std::string parse_error = {}) {
  return [inputs = std::move(inputs), parse_error = std::move(parse_error)](
             const Network& network) -> Result<server::InferenceRequest> {
    if (!parse_error.empty())
      return InvalidArgument(parse_error);
    server::InferenceRequest request;
    request.inputs = inputs;
    for (std::size_t o = 0; o < network.outputs.size(); ++o) {
      request.outputs.push_back(o);
      request.binary_outputs.push_back(false);
    }
    return request;
  };
}

// One inference through the serving core, as a transport starts it; the future has the outputs.
std::future<Result<std::vector<Tensor>>> StartBatchedInference(
    const server::ServeContext& context, const std::string& model,
    server::InferenceRequestParser parse,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt,
    server::RunOn run_on = server::RunOn::kQueue) {
  auto answer = std::make_shared<std::promise<Result<std::vector<Tensor>>>>();
  auto future = answer->get_future();
  context.inference.Infer(
      server::InferenceCall{.model = model,
                            .parse = std::move(parse),
                            .run_on = run_on,
                            .deadline = deadline,
                            .done = [answer](Result<server::InferenceOutcome> outcome) {
                              if (!outcome.ok())
                                answer->set_value(outcome.error());
                              else
                                answer->set_value(std::move(outcome->outputs));
                            }});
  return future;
}

std::vector<float> Floats(const Tensor& tensor) {
  const auto elements = tensor.Elements<float>();
  return {elements.begin(), elements.end()};
}

TEST(DynamicBatchingTest, BatchedAnswersEqualTheSameRequestsRunAlone) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ReluBatchingServer served(
      R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching":
                 {"max_queue_delay_us": 3000, "preferred_batch_sizes": [4, 8]}})");
  const auto& context = served.context();

  // Mixed shapes (M of 2, 3 or 5: never joined), 1-3 rows each; a tenth fail their parse and a
  // tenth come with a deadline that has passed: neither may reach a batch or spoil one.
  struct Sent {
    Tensor input;
    enum class Kind { kValid, kInvalid, kExpired } kind = Kind::kValid;
    std::future<Result<std::vector<Tensor>>> answer;
  };
  std::mt19937_64 random(seed);
  const auto uniform = [&random](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random);
  };
  std::vector<Sent> sent(240);
  for (auto& request : sent) {
    const int64_t columns = std::array<int64_t, 3>{2, 3, 5}[uniform(0, 2)];
    request.input = RandomRows(random, uniform(1, 3), columns);
    const int64_t kind = uniform(0, 9);
    request.kind =
        kind == 0 ? Sent::Kind::kInvalid : (kind == 1 ? Sent::Kind::kExpired : Sent::Kind::kValid);
  }
  // From four threads at once, as many clients would; two parse on their own thread (as gRPC
  // does), two on the batcher's parser threads (as REST does), into the same batches.
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    const auto run_on = c % 2 == 0 ? server::RunOn::kCaller : server::RunOn::kQueue;
    clients.emplace_back([&, c, run_on] {
      for (std::size_t i = c; i < sent.size(); i += 4) {
        Sent& request = sent[i];
        std::optional<std::chrono::steady_clock::time_point> deadline;
        if (request.kind == Sent::Kind::kExpired)
          deadline = std::chrono::steady_clock::now() - 1ms;
        request.answer = StartBatchedInference(
            context, "relu",
            ParserOf({request.input}, request.kind == Sent::Kind::kInvalid
                                          ? "request " + std::to_string(i) + " is invalid"
                                          : ""),
            deadline, run_on);
      }
    });
  }
  for (auto& client : clients)
    client.join();

  int valid = 0;
  for (std::size_t i = 0; i < sent.size(); ++i) {
    auto answer = sent[i].answer.get();
    switch (sent[i].kind) {
      case Sent::Kind::kInvalid:
        ASSERT_FALSE(answer.ok()) << "request " << i;
        EXPECT_EQ(answer.error().code(), StatusCode::kInvalidArgument);
        EXPECT_THAT(answer.error().message(),
                    HasSubstr("model 'relu' version 1: request " + std::to_string(i)));
        break;
      case Sent::Kind::kExpired:
        ASSERT_FALSE(answer.ok()) << "request " << i;
        EXPECT_EQ(answer.error().code(), StatusCode::kDeadlineExceeded)
            << answer.error().ToString();
        break;
      case Sent::Kind::kValid: {
        ++valid;
        ASSERT_TRUE(answer.ok()) << "request " << i << ": " << answer.error().ToString();
        auto alone = InferNow(context.inference, "relu_alone", ParserOf({sent[i].input}));
        ASSERT_TRUE(alone.ok()) << alone.error().ToString();
        ASSERT_EQ(answer->size(), 1u);
        EXPECT_EQ(answer->front().info(), alone->outputs.front().info()) << "request " << i;
        EXPECT_EQ(Floats(answer->front()), Floats(alone->outputs.front())) << "request " << i;
        break;
      }
    }
  }
  // Joined: fewer executions than requests answered, every batch within max_batch_size.
  const auto& batching = context.metrics.ForModel("relu").batching;
  const auto sizes = batching.batch_size.Read();
  EXPECT_LT(batching.executions.load(), static_cast<uint64_t>(valid));
  EXPECT_EQ(sizes.count, batching.executions.load());
  EXPECT_EQ(sizes.cumulative_counts[3], sizes.count) << "a batch of more than 8 rows";  // le=8
  EXPECT_GT(sizes.sum, 0);
}

// RunOn is a promise about threads: kCaller parses before Infer returns, on the caller's thread
// (a failed parse is answered there too), and an unbatched model's request is executed and
// answered there as well; kQueue never parses on the caller's thread (REST's I/O threads must
// not parse). Batched and unbatched models alike.
TEST(DynamicBatchingTest, RunOnSaysWhichThreadParsesAndRuns) {
  const ReluBatchingServer served(R"({"backends": ["CpuRef"], "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_us": 1000}})");
  const auto& context = served.context();
  std::mt19937_64 random(3);
  for (const std::string model : {"relu", "relu_alone"}) {
    for (const auto run_on : {server::RunOn::kCaller, server::RunOn::kQueue}) {
      const bool on_caller = run_on == server::RunOn::kCaller;
      SCOPED_TRACE(model + (on_caller ? ", kCaller" : ", kQueue"));
      for (const bool valid : {true, false}) {
        auto parsed_on = std::make_shared<std::promise<std::thread::id>>();
        auto thread = parsed_on->get_future();
        server::InferenceRequestParser inner =
            ParserOf({RandomRows(random, 1, 3)}, valid ? "" : "this request is invalid");
        auto answer = StartBatchedInference(
            context, model,
            [parsed_on, inner](const Network& network) {
              parsed_on->set_value(std::this_thread::get_id());
              return inner(network);
            },
            std::nullopt, run_on);
        if (on_caller) {
          ASSERT_EQ(thread.wait_for(0s), std::future_status::ready) << "parsed after the return";
          EXPECT_EQ(thread.get(), std::this_thread::get_id());
        } else {
          EXPECT_NE(thread.get(), std::this_thread::get_id());
        }
        if (!valid && on_caller && model == "relu") {
          EXPECT_EQ(answer.wait_for(0s), std::future_status::ready)
              << "a batched request that fails its parse on the caller is answered there";
        }
        if (on_caller && model == "relu_alone") {
          EXPECT_EQ(answer.wait_for(0s), std::future_status::ready)
              << "an unbatched request on the caller is executed and answered before the return";
        }
        auto result = answer.get();
        EXPECT_EQ(result.ok(), valid) << (result.ok() ? "" : result.error().ToString());
        if (!valid) {
          EXPECT_THAT(result.error().message(), HasSubstr("this request is invalid"));
        }
      }
    }
  }
  // Unbatched, a request counts as an execution when it runs, wherever it was parsed: the two
  // valid ones, not the two that failed their parse.
  EXPECT_EQ(context.metrics.ForModel("relu_alone").batching.executions.load(), 2u);
}

// The caller whose request completes a batch (RunOn::kCaller: gRPC's threads) executes it and
// answers every request of it before its call returns, on its own thread: a batch's answers
// take no hand-off to a worker and back. kQueue callers never do (REST's I/O threads).
TEST(DynamicBatchingTest, TheCallerThatCompletesABatchRunsItAndAnswersItsRequests) {
  // Only a preferred size sends a batch in time: the wait is a second (the most allowed).
  const ReluBatchingServer served(R"({"backends": ["CpuRef"], "max_batch_size": 8,
      "dynamic_batching": {"max_queue_delay_us": 1000000, "preferred_batch_sizes": [4]}})");
  const auto& context = served.context();
  std::mt19937_64 random(4);
  for (const auto run_on : {server::RunOn::kCaller, server::RunOn::kQueue}) {
    const bool on_caller = run_on == server::RunOn::kCaller;
    SCOPED_TRACE(on_caller ? "kCaller" : "kQueue");
    std::vector<Tensor> inputs;
    std::vector<std::future<Result<std::vector<Tensor>>>> answers;
    std::vector<std::future<std::thread::id>> answered_on;
    for (int i = 0; i < 4; ++i) {
      inputs.push_back(RandomRows(random, 1, 3));
      auto on = std::make_shared<std::promise<std::thread::id>>();
      answered_on.push_back(on->get_future());
      auto answer = std::make_shared<std::promise<Result<std::vector<Tensor>>>>();
      answers.push_back(answer->get_future());
      context.inference.Infer(
          server::InferenceCall{.model = "relu",
                                .parse = ParserOf({inputs.back()}),
                                .run_on = run_on,
                                .done = [on, answer](Result<server::InferenceOutcome> outcome) {
                                  on->set_value(std::this_thread::get_id());
                                  if (!outcome.ok())
                                    answer->set_value(outcome.error());
                                  else
                                    answer->set_value(std::move(outcome->outputs));
                                }});
      if (i < 3) {
        EXPECT_EQ(answers.back().wait_for(0s), std::future_status::timeout)
            << "request " << i << " left before its batch was complete";
      }
    }
    for (int i = 0; i < 4; ++i) {
      if (on_caller) {
        ASSERT_EQ(answers[i].wait_for(0s), std::future_status::ready)
            << "request " << i << " was not answered before the completing call returned";
        EXPECT_EQ(answered_on[i].get(), std::this_thread::get_id()) << "request " << i;
      } else {
        EXPECT_NE(answered_on[i].get(), std::this_thread::get_id()) << "request " << i;
      }
      auto answer = answers[i].get();
      ASSERT_TRUE(answer.ok()) << answer.error().ToString();
      auto alone = InferNow(context.inference, "relu_alone", ParserOf({inputs[i]}));
      ASSERT_TRUE(alone.ok()) << alone.error().ToString();
      EXPECT_EQ(Floats(answer->front()), Floats(alone->outputs.front())) << "request " << i;
    }
  }
  // One execution of four rows each time.
  const auto& batching = context.metrics.ForModel("relu").batching;
  EXPECT_EQ(batching.executions.load(), 2u);
  EXPECT_EQ(batching.batch_size.Read().sum, 8);
}

// A request whose deadline has passed is answered DEADLINE_EXCEEDED without being parsed or run,
// batched or not, wherever it runs (gRPC's unbatched calls ran past theirs before RunOn::kCaller
// honoured it); it is not counted as an execution.
TEST(DynamicBatchingTest, APassedDeadlineIsNeverRunBatchedOrNot) {
  const ReluBatchingServer served(R"({"backends": ["CpuRef"], "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_us": 1000}})");
  const auto& context = served.context();
  std::mt19937_64 random(5);
  for (const std::string model : {"relu", "relu_alone"}) {
    for (const auto run_on : {server::RunOn::kCaller, server::RunOn::kQueue}) {
      SCOPED_TRACE(model + (run_on == server::RunOn::kCaller ? ", kCaller" : ", kQueue"));
      const uint64_t executions = context.metrics.ForModel(model).batching.executions.load();
      auto parsed = std::make_shared<std::atomic<bool>>(false);
      server::InferenceRequestParser inner = ParserOf({RandomRows(random, 1, 3)});
      auto answer = StartBatchedInference(
          context, model,
          [parsed, inner](const Network& network) {
            parsed->store(true);
            return inner(network);
          },
          std::chrono::steady_clock::now() - 1ms, run_on);
      auto result = answer.get();
      ASSERT_FALSE(result.ok());
      EXPECT_EQ(result.error().code(), StatusCode::kDeadlineExceeded) << result.error().ToString();
      EXPECT_FALSE(parsed->load()) << "parsed after its deadline";
      EXPECT_EQ(context.metrics.ForModel(model).batching.executions.load(), executions);
    }
  }
}

// Batches of every size from 1 to max_batch_size execute at a few padded sizes, so the network
// compiles one shape program per execution size and never evicts one (it compiled and evicted
// them without end when every batch size was its own shape); the answers stay each request's own.
TEST(DynamicBatchingTest, BatchesOfEverySizeCompileOneProgramPerExecutionSize) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ServeHome home;
  AddBatchingModels(home);
  home.Write("models/mlp/config.json",
             R"({"backends": ["CpuRef"], "max_batch_size": 16, "dynamic_batching":
                 {"max_queue_delay_us": 2000}})");
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto& context = running.core->context();
  std::mt19937_64 random(seed);
  std::vector<Tensor> inputs;
  std::vector<std::future<Result<std::vector<Tensor>>>> answers;
  for (int wave = 0; wave < 40; ++wave) {
    // A wave of 1-6 requests of 1-3 rows each: batches of 1 to 16 rows.
    const int requests = static_cast<int>(std::uniform_int_distribution<int>(1, 6)(random));
    for (int r = 0; r < requests; ++r) {
      inputs.push_back(RandomRows(random, std::uniform_int_distribution<int64_t>(1, 3)(random), 4));
      answers.push_back(StartBatchedInference(context, "mlp", ParserOf({inputs.back()})));
    }
    answers.back().wait();
  }
  for (std::size_t i = 0; i < answers.size(); ++i) {
    auto answer = answers[i].get();
    ASSERT_TRUE(answer.ok()) << "request " << i << ": " << answer.error().ToString();
    auto alone = InferNow(context.inference, "mlp_alone", ParserOf({inputs[i]}));
    ASSERT_TRUE(alone.ok()) << alone.error().ToString();
    ASSERT_EQ(answer->front().info(), alone->outputs.front().info()) << "request " << i;
    EXPECT_EQ(Floats(answer->front()), Floats(alone->outputs.front())) << "request " << i;
  }
  const auto& batching = context.metrics.ForModel("mlp").batching;
  const auto sizes = batching.batch_size.Read();
  EXPECT_GT(sizes.sum / static_cast<double>(sizes.count), 1.5) << "requests were not joined";
  // Every batch is timed at the size it executed at: here the powers of two, which are also the
  // batch-size histogram's bounds, so each size's count is the batches of rows in (size/2, size].
  const auto executions = batching.ExecutionSeconds();
  uint64_t timed = 0;
  for (const auto& [rows, seconds] : executions) {
    SCOPED_TRACE("execution size " + std::to_string(rows));
    const auto bound =
        std::find(sizes.upper_bounds.begin(), sizes.upper_bounds.end(), static_cast<double>(rows));
    ASSERT_NE(bound, sizes.upper_bounds.end()) << "not an execution size";
    const auto i = static_cast<std::size_t>(bound - sizes.upper_bounds.begin());
    EXPECT_EQ(seconds.count,
              sizes.cumulative_counts[i] - (i == 0 ? 0 : sizes.cumulative_counts[i - 1]));
    EXPECT_GT(seconds.sum, 0.0);
    timed += seconds.count;
  }
  EXPECT_EQ(timed, sizes.count);
  EXPECT_GE(executions.size(), 3u) << "waves of 1-18 rows ran at only a size or two";
  auto resolved = server::ResolveModel(context.repository, "mlp", "");
  ASSERT_TRUE(resolved.ok()) << resolved.error().ToString();
  auto programs = context.runtime.GetShapePrograms(resolved->version->network_id());
  ASSERT_TRUE(programs.ok()) << programs.error().ToString();
  const std::size_t execution_sizes = server::ExecutionBatchSizes(16, {}).size();  // 1 2 4 8 16
  EXPECT_LE(programs->compiles, execution_sizes);
  EXPECT_EQ(programs->evictions, 0u);
  for (const auto& program : programs->programs) {
    const int64_t rows = program.input_shapes.front().front();
    EXPECT_TRUE(rows == 1 || rows == 2 || rows == 4 || rows == 8 || rows == 16)
        << "a program for a batch of " << rows << " rows";
  }
}

TEST(DynamicBatchingTest, AnExecutionErrorFailsExactlyTheRequestsOfItsBatch) {
  ServeHome home;
  AddBatchingModels(home);
  // Batches of exactly 4 one-row requests: the first four submitted share one, the next four
  // the next (a long delay and a preferred size of 4 and max 4 leave no other way).
  home.Write("models/identity/config.json",
             R"({"backends": ["TestFailOnNegative"], "max_batch_size": 4, "dynamic_batching":
                 {"max_queue_delay_us": 1000000, "preferred_batch_sizes": [4]}})");
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto& context = running.core->context();

  std::vector<std::future<Result<std::vector<Tensor>>>> answers;
  for (int i = 0; i < 8; ++i) {
    Tensor row(TensorInfo{DataType::kFloat32, {1, 4}});
    for (float& element : row.Elements<float>())
      element = i == 1 ? -1.0f : static_cast<float>(i);  // request 1 poisons its batch
    answers.push_back(StartBatchedInference(context, "identity", ParserOf({row})));
  }
  for (int i = 0; i < 8; ++i) {
    auto answer = answers[i].get();
    if (i < 4) {
      ASSERT_FALSE(answer.ok()) << "request " << i << " shared a batch with the bad one";
      EXPECT_THAT(answer.error().message(), HasSubstr("FailOnNegative refuses the negative input"));
    } else {
      ASSERT_TRUE(answer.ok()) << "request " << i << ": " << answer.error().ToString();
      EXPECT_EQ(Floats(answer->front()), std::vector<float>(4, static_cast<float>(i)));
    }
  }
  EXPECT_EQ(context.metrics.ForModel("identity").batching.executions.load(), 2u);
}

TEST(DynamicBatchingTest, ARequestWhoseDeadlinePassesWhileItWaitsLeavesTheBatch) {
  const ReluBatchingServer served(R"({"backends": ["CpuRef"], "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_us": 400000}})");
  const auto& context = served.context();
  std::mt19937_64 random(1);
  const auto start = std::chrono::steady_clock::now();
  auto hurried =
      StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}), start + 30ms);
  auto patient = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));

  auto hurried_answer = hurried.get();
  const auto hurried_after = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(hurried_answer.ok());
  EXPECT_EQ(hurried_answer.error().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(hurried_answer.error().message(), HasSubstr("waited for a batch"));
  EXPECT_LT(hurried_after, 300ms) << "answered at the batch's delay, not at its deadline";
  auto patient_answer = patient.get();
  ASSERT_TRUE(patient_answer.ok()) << patient_answer.error().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 400ms);
  // It ran alone: the hurried one left the batch.
  const auto sizes = context.metrics.ForModel("relu").batching.batch_size.Read();
  EXPECT_EQ(sizes.count, 1u);
  EXPECT_EQ(sizes.sum, 1.0);
}

// One client that waits for each answer never brings company: after eight vain waits its
// requests leave at once, but for a probe every sixteenth; company that joins a probe restores
// the wait. Whole server, serving core, a 100 ms delay so that a wait is unmistakable.
TEST(DynamicBatchingTest, ALoneClientStopsWaitingAfterEightVainWaitsAndCompanyRestoresIt) {
  const ReluBatchingServer served(R"({"backends": ["CpuRef"], "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_us": 100000}})");
  const auto& context = served.context();
  std::mt19937_64 random(7);
  const auto timed_request = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto answer = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
    EXPECT_TRUE(answer.get().ok());
    return std::chrono::steady_clock::now() - start;
  };
  for (int i = 0; i < server::CompanyOutlook::kVainWaits; ++i)
    EXPECT_GE(timed_request(), 100ms) << "request " << i << " waits: waits have not proved vain";
  const auto& batching = context.metrics.ForModel("relu").batching;
  EXPECT_EQ(batching.waits_skipped.load(), 0u);
  for (int i = 1; i < server::CompanyOutlook::kProbeEvery; ++i)
    EXPECT_LT(timed_request(), 80ms) << "lone request " << i << " after eight vain waits";
  EXPECT_EQ(batching.waits_skipped.load(),
            static_cast<uint64_t>(server::CompanyOutlook::kProbeEvery - 1));

  // The probe waits; a second request joins it, and the two leave together at its delay.
  const auto start = std::chrono::steady_clock::now();
  auto probe = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
  std::this_thread::sleep_for(20ms);
  auto company = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
  EXPECT_TRUE(probe.get().ok());
  EXPECT_TRUE(company.get().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  const auto sizes = batching.batch_size.Read();
  EXPECT_EQ(sizes.sum - sizes.count, 1.0) << "one batch of two rows, the rest of one";
  // Waiting paid: the next lone request waits again.
  EXPECT_GE(timed_request(), 100ms);
  EXPECT_EQ(batching.waits_skipped.load(),
            static_cast<uint64_t>(server::CompanyOutlook::kProbeEvery - 1));
}

TEST(DynamicBatchingTest, OverloadIsRefusedNotQueued) {
  ServeHome home;
  AddBatchingModels(home);
  home.Write("models/relu/config.json",
             R"({"backends": ["CpuRef"], "max_batch_size": 8,
                 "dynamic_batching": {"max_queue_delay_us": 300000}})");
  ServeConfig config = InProcessConfig(home, /*grpc=*/true);
  config.max_in_flight = 2;  // the batcher holds no more waiting requests than this
  auto running = StartInProcess(config);
  const auto& context = running.core->context();
  std::mt19937_64 random(2);
  auto first = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
  auto second = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
  auto third = StartBatchedInference(context, "relu", ParserOf({RandomRows(random, 1, 3)}));
  // Refused at once, while the other two still wait for company.
  ASSERT_EQ(third.wait_for(0s), std::future_status::ready);
  auto refused = third.get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.error().message(),
              HasSubstr("model 'relu' version 1 has 2 requests waiting for a batch"));
  EXPECT_EQ(first.wait_for(0s), std::future_status::timeout);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
}

TEST(DynamicBatchingTest, PreserveOrderingAnswersInArrivalOrder) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ReluBatchingServer served(
      R"({"backends": ["CpuRef"], "max_batch_size": 4, "dynamic_batching":
                 {"max_queue_delay_us": 2000, "preserve_ordering": true}})");
  const auto& context = served.context();
  std::mt19937_64 random(seed);
  std::mutex order_mutex;
  std::vector<int> order;
  std::vector<std::future<void>> done;
  for (int i = 0; i < 60; ++i) {
    auto answered = std::make_shared<std::promise<void>>();
    done.push_back(answered->get_future());
    const int64_t columns = 2 + static_cast<int64_t>(random() % 2);  // two groups, interleaved
    context.inference.Infer(
        server::InferenceCall{.model = "relu",
                              .parse = ParserOf({RandomRows(random, 1, columns)}),
                              .done = [&, i, answered](Result<server::InferenceOutcome> outcome) {
                                EXPECT_TRUE(outcome.ok()) << outcome.error().ToString();
                                {
                                  std::lock_guard lock(order_mutex);
                                  order.push_back(i);
                                }
                                answered->set_value();
                              }});
  }
  for (auto& answer : done)
    answer.get();
  std::vector<int> arrival(60);
  std::iota(arrival.begin(), arrival.end(), 0);
  EXPECT_EQ(order, arrival);
}

TEST(DynamicBatchingTest, BatchingIsRefusedAtLoadForAModelWithAFixedBatch) {
  ServeHome home;
  home.Write("models/mnist/config.json",
             R"({"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_us": 1000}})");
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  const auto reason = running.core->context().repository.Unavailable("mnist");
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(*reason, HasSubstr("model 'mnist' version 1: cannot batch (max_batch_size in "
                                 "config.json) because input 'Input3' has shape [1,1,28,28], "
                                 "whose first dimension is fixed at 1"));
  EXPECT_THAT(*reason, HasSubstr("dim_param"));
  httplib::Client client("127.0.0.1", running.http.port);
  auto load = Post(client, "/v2/repository/models/mnist/load", "");
  EXPECT_EQ(load.status, 400) << load.text;
  EXPECT_THAT(load.text, HasSubstr("whose first dimension is fixed at 1"));
  // The other models serve.
  EXPECT_EQ(Get(client, "/v2/models/mlp/ready").status, 200);
}

TEST(DynamicBatchingTest, ALoadAppliesAChangedBatchingConfig) {
  ServeHome home;
  AddBatchingModels(home);
  home.Write("models/relu/config.json",
             R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching": {}})");
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  auto& repository = running.core->context().repository;
  ASSERT_NE(repository.Find("relu"), nullptr);
  EXPECT_NE(dynamic_cast<server::DynamicBatcher*>(&repository.Find("relu")->Latest().queue()),
            nullptr);
  // The same file and backends, batching off: a load must not keep the batched version.
  home.Write("models/relu/config.json", R"({"backends": ["CpuRef"]})");
  ASSERT_TRUE(repository.Load("relu").ok());
  EXPECT_EQ(dynamic_cast<server::DynamicBatcher*>(&repository.Find("relu")->Latest().queue()),
            nullptr);
  EXPECT_EQ(repository.Find("relu")->config.max_batch_size, 0);
}

// ---- REST and gRPC --------------------------------------------------------------------------

// A REST request with one FP32 input `input` (the mlp's is "features").
std::string JsonBody(const Tensor& values, const std::string& input = "features") {
  json body = {{"inputs",
                {{{"name", input},
                  {"shape", values.info().shape},
                  {"datatype", "FP32"},
                  {"data", Floats(values)}}}}};
  return body.dump();
}

std::string MlpJsonBody(const Tensor& features) {
  return JsonBody(features);
}

std::vector<float> RestOutput(const JsonReply& reply) {
  return reply.body["outputs"][0]["data"].get<std::vector<float>>();
}

// The same request over gRPC, with one FP32 input `input` and a deadline `timeout` from now; its
// status code and first output.
std::pair<grpc::StatusCode, std::vector<float>> GrpcInfer(
    inference::GRPCInferenceService::Stub& stub, const std::string& model, const Tensor& features,
    const std::string& input_name = "features",
    std::chrono::microseconds timeout = std::chrono::seconds(20)) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name(input_name);
  input->set_datatype("FP32");
  for (int64_t dim : features.info().shape)
    input->add_shape(dim);
  for (float value : features.Elements<float>())
    input->mutable_contents()->add_fp32_contents(value);
  inference::ModelInferResponse response;
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status status = stub.ModelInfer(&call, request, &response);
  if (!status.ok() || response.outputs_size() == 0)
    return {status.error_code(), {}};
  const auto& contents = response.outputs(0).contents().fp32_contents();
  return {status.error_code(), {contents.begin(), contents.end()}};
}

void ExpectNear(const std::vector<float>& batched, const std::vector<float>& alone,
                const std::string& what) {
  ASSERT_EQ(batched.size(), alone.size()) << what;
  for (std::size_t i = 0; i < batched.size(); ++i)
    EXPECT_NEAR(batched[i], alone[i], 1e-5) << what << ", element " << i;
}

TEST(DynamicBatchingTest, RestAndGrpcClientsGetWhatTheSameRequestsGetAlone) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ServeHome home;
  AddBatchingModels(home);
  home.Write("models/mlp/config.json",
             R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching":
                 {"max_queue_delay_us": 2000, "preferred_batch_sizes": [4, 8]}})");
  auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
  auto channel = grpc::CreateChannel(running.grpc->ToString(), grpc::InsecureChannelCredentials());

  std::atomic<int> compared{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 12; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 random(seed + static_cast<uint64_t>(c));
      httplib::Client rest("127.0.0.1", running.http.port);
      auto stub = inference::GRPCInferenceService::NewStub(channel);
      for (int i = 0; i < 25; ++i) {
        const Tensor features = RandomRows(random, 1 + static_cast<int64_t>(random() % 3), 4);
        const std::string what = "client " + std::to_string(c) + " request " + std::to_string(i);
        if (c % 3 == 2) {  // a third over gRPC
          const auto batched = GrpcInfer(*stub, "mlp", features);
          const auto alone = GrpcInfer(*stub, "mlp_alone", features);
          ASSERT_EQ(batched.first, grpc::StatusCode::OK) << what;
          ASSERT_EQ(alone.first, grpc::StatusCode::OK) << what;
          ExpectNear(batched.second, alone.second, what);
        } else {
          const auto batched = Post(rest, "/v2/models/mlp/infer", MlpJsonBody(features));
          const auto alone = Post(rest, "/v2/models/mlp_alone/infer", MlpJsonBody(features));
          ASSERT_EQ(batched.status, 200) << what << ": " << batched.text;
          ASSERT_EQ(alone.status, 200) << what << ": " << alone.text << alone.error;
          ExpectNear(RestOutput(batched), RestOutput(alone), what);
        }
        ++compared;
        // Now and then a request that fails validation: answered alone, spoiling no batch.
        if (i % 7 == 3) {
          const auto wrong =
              Post(rest, "/v2/models/mlp/infer", MlpJsonBody(RandomRows(random, 1, 5)));
          EXPECT_EQ(wrong.status, 400) << wrong.text;
        }
      }
    });
  }
  for (auto& client : clients)
    client.join();
  EXPECT_EQ(compared.load(), 12 * 25);

  httplib::Client client("127.0.0.1", running.http.port);
  // More rows than max_batch_size: refused naming both numbers.
  std::mt19937_64 random(seed);
  const auto too_big = Post(client, "/v2/models/mlp/infer", MlpJsonBody(RandomRows(random, 9, 4)));
  EXPECT_EQ(too_big.status, 400);
  EXPECT_THAT(too_big.text, HasSubstr("the request has 9 rows (first dimension), more than the "
                                      "model's max_batch_size 8"));
  // The metadata says the batch dimension and its maximum.
  const auto metadata = Get(client, "/v2/models/mlp");
  EXPECT_EQ(metadata.body["parameters"],
            json({{"batch_dimension", 0}, {"max_batch_size", 8}, {"dynamic_batching", true}}));
  EXPECT_FALSE(Get(client, "/v2/models/mlp_alone").body.contains("parameters"));
  // The admin view and /metrics count executions against requests.
  const auto view = Get(client, "/v2/models/mlp/placement");
  const auto& batching = view.body["batching"];
  EXPECT_EQ(batching["max_batch_size"], 8);
  EXPECT_EQ(batching["dynamic_batching"]["max_queue_delay_us"], 2000);
  EXPECT_GT(batching["requests"].get<uint64_t>(), batching["executions"].get<uint64_t>());
  EXPECT_EQ(batching["batches"], batching["executions"]);
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE backplane_inference_batch_size histogram\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("backplane_inference_batch_size_bucket{model=\"mlp\",le=\"+Inf\"} " +
                        std::to_string(batching["batches"].get<uint64_t>()) + "\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("# TYPE backplane_inference_queue_delay_seconds histogram\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("backplane_inference_queue_delay_seconds_count{model=\"mlp\"}"));
  EXPECT_THAT(metrics->body,
              HasSubstr("backplane_inference_executions_total{model=\"mlp\"} " +
                        std::to_string(batching["executions"].get<uint64_t>()) + "\n"));
  // Batches' execution times by the size they ran at (4 or 8 here, 1 and 2 for stragglers), in
  // the admin view and in /metrics alike.
  uint64_t timed = 0;
  for (const auto& size : batching["batch_executions"]) {
    const auto rows = size["batch_size"].get<int64_t>();
    EXPECT_TRUE(rows == 1 || rows == 2 || rows == 4 || rows == 8) << size;
    EXPECT_GT(size["seconds_sum"].get<double>(), 0.0) << size;
    timed += size["count"].get<uint64_t>();
    EXPECT_THAT(metrics->body,
                HasSubstr("backplane_inference_batch_execution_seconds_count{model=\"mlp\","
                          "batch_size=\"" +
                          std::to_string(rows) + "\"} " + size["count"].dump() + "\n"));
  }
  EXPECT_EQ(timed, batching["executions"].get<uint64_t>());
  EXPECT_THAT(metrics->body,
              HasSubstr("# TYPE backplane_inference_batch_execution_seconds histogram\n"));
}

// A whole server stopped while REST and gRPC clients keep batches executing, at seeded moments:
// every answer a client gets is its own request's (checked against the same row run alone before
// the stop), the others fail as a stopped server fails them (no response, 503, UNAVAILABLE or
// CANCELLED), and the sanitizer builds see the stop's every order of teardown (the transports
// while batches answer them, the batcher while requests wait in it).
TEST(DynamicBatchingTest, AStopWhileBatchesRunAnswersOnlyWithEachRequestsOwnAnswer) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ServeHome home;
    AddBatchingModels(home);
    home.Write("models/mlp/config.json",
               R"({"backends": ["CpuRef"], "max_batch_size": 8, "dynamic_batching":
                   {"max_queue_delay_us": 1000, "preferred_batch_sizes": [4, 8]}})");
    auto running = StartInProcess(InProcessConfig(home, /*grpc=*/true));
    const auto& context = running.core->context();
    // Each client's rows and what they give alone.
    constexpr int kClients = 6;
    std::vector<Tensor> rows;
    std::vector<std::vector<float>> alone;
    for (int c = 0; c < kClients; ++c) {
      rows.push_back(RandomRows(random, 1 + static_cast<int64_t>(random() % 2), 4));
      auto outcome = InferNow(context.inference, "mlp_alone", ParserOf({rows.back()}));
      ASSERT_TRUE(outcome.ok()) << outcome.error().ToString();
      alone.push_back(Floats(outcome->outputs.front()));
    }
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0};
    std::vector<std::thread> clients;
    JoinAll join{stop, clients};
    auto channel =
        grpc::CreateChannel(running.grpc->ToString(), grpc::InsecureChannelCredentials());
    for (int c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        const std::string what = "client " + std::to_string(c);
        if (c % 3 == 2) {
          auto stub = inference::GRPCInferenceService::NewStub(channel);
          while (!stop.load()) {
            const auto [code, outputs] = GrpcInfer(*stub, "mlp", rows[c]);
            if (code != grpc::StatusCode::OK) {
              EXPECT_TRUE(code == grpc::StatusCode::UNAVAILABLE ||
                          code == grpc::StatusCode::CANCELLED)
                  << what << ": gRPC code " << code;
              return;
            }
            ExpectNear(outputs, alone[c], what);
            ++answered;
          }
          return;
        }
        httplib::Client rest("127.0.0.1", running.http.port);
        while (!stop.load()) {
          const auto reply = Post(rest, "/v2/models/mlp/infer", MlpJsonBody(rows[c]));
          if (reply.status != 200) {
            EXPECT_TRUE(reply.status == 0 || reply.status == 503)
                << what << ": " << reply.status << " " << reply.text;
            return;
          }
          ExpectNear(RestOutput(reply), alone[c], what);
          ++answered;
        }
      });
    }
    ASSERT_TRUE(Eventually([&] { return answered.load() >= 20; }, 30s));
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 20000));
    running.core->Stop();  // while the clients still send
    stop.store(true);
    for (auto& client : clients)
      client.join();
  }
}

// A convolution over x [N, 3, H, W], all three symbolic (a model as exported, not in the
// repository): 3x3, 8 maps, Relu, global average pool, Flatten, Gemm to y [N, 5]. Seeded weights.
std::string ConvModel(std::mt19937_64& random) {
  const auto draw = [&](std::size_t count) { return UniformFloats(random, count, 0.5f); };
  ModelBuilder builder;
  builder.Input("x", {-1, 3, -1, -1}).Output("y", {-1, 5});
  builder.NameDimension("x", 2, "H").NameDimension("x", 3, "W");
  builder.FloatInitializer("w", {8, 3, 3, 3}, draw(8 * 3 * 3 * 3));
  builder.FloatInitializer("b", {8}, draw(8));
  builder.FloatInitializer("fc", {8, 5}, draw(8 * 5));
  builder.FloatInitializer("fc_bias", {5}, draw(5));
  SetInts(builder.Node("Conv", {"x", "w", "b"}, {"conv"}), "pads", {1, 1, 1, 1});
  builder.Node("Relu", {"conv"}, {"relu"});
  builder.Node("GlobalAveragePool", {"relu"}, {"pooled"});
  builder.Node("Flatten", {"pooled"}, {"flat"});
  builder.Node("Gemm", {"flat", "fc", "fc_bias"}, {"y"});
  return builder.Serialize();
}

// Issue 21 the way it is checked: a model outside the repository batched on CpuAcc, REST and
// gRPC clients sending 1 to 3 rows of one of four shapes (different heights and widths never
// share a batch), some gRPC calls with deadlines a batch may outlive and some requests that fail
// validation, while CpuAcc is hot-swapped five times. Every answer equals the same request run
// alone, unbatched, on the same server; a deadline that passes is answered DEADLINE_EXCEEDED; a
// wrong request is refused naming what is wrong; nothing else fails; every swap becomes active
// and the model ends on the newest generation; requests were really joined.
TEST(DynamicBatchingTest, MixedShapesAndDeadlinesWhileCpuAccIsSwappedAnswerAsAlone) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  ServeHome home;
  CopyFile(BACKPLANE_CPU_ACC, home.backends() / "Backplane_CpuAcc_backend.so");
  const std::string model = ConvModel(random);
  home.Write("models/conv/1/model.onnx", model);
  home.Write("models/conv/config.json",
             R"({"backends": ["CpuAcc"], "max_batch_size": 8, "dynamic_batching":
                 {"max_queue_delay_us": 2000, "preferred_batch_sizes": [4, 8]}})");
  home.Write("models/conv_alone/1/model.onnx", model);
  home.Write("models/conv_alone/config.json", R"({"backends": ["CpuAcc"]})");
  ServeConfig config = InProcessConfig(home, /*grpc=*/true);
  config.watch_backends = true;
  config.watch_debounce = 50ms;
  auto running = StartInProcess(config);
  httplib::Client admin("127.0.0.1", running.http.port);
  const auto active_generation = [&] {
    const auto reply = Get(admin, "/v2/backends/CpuAcc");
    return reply.status == 200 ? reply.body["active_generation"].get<uint64_t>() : 0;
  };
  const uint64_t initial = active_generation();
  ASSERT_GT(initial, 0u);
  auto channel = grpc::CreateChannel(running.grpc->ToString(), grpc::InsecureChannelCredentials());

  constexpr int kClients = 8, kSwaps = 5;
#if defined(BACKPLANE_ASAN_BUILD) || defined(BACKPLANE_TSAN_BUILD)
  constexpr int kAnswersPerSwap = 16;  // 19 s under TSan with 40
#else
  constexpr int kAnswersPerSwap = 40;
#endif
  std::atomic<int> sent{0}, compared{0}, expired{0}, refused{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  JoinAll join{stop, clients};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 own(seed * 1000 + static_cast<uint64_t>(c));
      httplib::Client rest("127.0.0.1", running.http.port);
      // A swap's compile under a sanitizer on a busy machine can outlast httplib's 5 s default;
      // what is checked here is the answer, not its latency.
      rest.set_read_timeout(std::chrono::seconds(60));
      auto stub = inference::GRPCInferenceService::NewStub(channel);
      const bool grpc_client = c % 2 == 1;
      for (int i = 0; !stop.load(); ++i) {
        ++sent;
        const std::string what = "client " + std::to_string(c) + " request " + std::to_string(i) +
                                 (grpc_client ? " (gRPC)" : " (REST)");
        const int64_t rows = 1 + static_cast<int64_t>(own() % 3);
        const int64_t height = own() % 2 == 0 ? 4 : 6, width = own() % 2 == 0 ? 5 : 7;
        const Tensor x = RandomTensor(own, {rows, 3, height, width});
        if (i % 9 == 4) {  // a wrong request: 4 channels where the model takes 3
          Tensor wrong(TensorInfo{DataType::kFloat32, {rows, 4, height, width}});
          const auto reply = Post(rest, "/v2/models/conv/infer", JsonBody(wrong, "x"));
          EXPECT_EQ(reply.status, 400) << what << ": " << reply.text;
          EXPECT_THAT(reply.text, HasSubstr("'x'")) << what;
          EXPECT_THAT(reply.text, HasSubstr("does not match the model's [-1,3,-1,-1]")) << what;
          ++refused;
        }
        std::vector<float> batched;
        if (grpc_client) {
          // One call in four with a deadline of 0.2 to 3 ms: it may pass while the call waits.
          const auto timeout = own() % 4 == 0 ? std::chrono::microseconds(200 + own() % 2800)
                                              : std::chrono::microseconds(std::chrono::seconds(30));
          const auto [code, outputs] = GrpcInfer(*stub, "conv", x, "x", timeout);
          if (code == grpc::StatusCode::DEADLINE_EXCEEDED && timeout < std::chrono::seconds(1)) {
            ++expired;
            continue;
          }
          ASSERT_EQ(code, grpc::StatusCode::OK) << what;
          batched = outputs;
        } else {
          const auto reply = Post(rest, "/v2/models/conv/infer", JsonBody(x, "x"));
          ASSERT_EQ(reply.status, 200) << what << ": " << reply.text << reply.error;
          batched = RestOutput(reply);
        }
        const auto alone = Post(rest, "/v2/models/conv_alone/infer", JsonBody(x, "x"));
        ASSERT_EQ(alone.status, 200) << what << ": " << alone.text;
        ASSERT_EQ(batched.size(), static_cast<std::size_t>(rows * 5)) << what;
        ExpectNear(batched, RestOutput(alone), what);
        ++compared;
      }
    });
  }
  uint64_t generation = initial;
  for (int swap = 0; swap < kSwaps; ++swap) {
    const int compared_before = compared.load();
    home.Publish(BACKPLANE_CPU_ACC, "Backplane_CpuAcc_backend.so");
    ASSERT_TRUE(Eventually([&] { return active_generation() > generation; }, 30s))
        << "swap " << swap << " never became active";
    generation = active_generation();
    // Batches keep being answered on the new generation before the next swap.
    EXPECT_TRUE(
        Eventually([&] { return compared.load() > compared_before + kAnswersPerSwap; }, 30s))
        << "swap " << swap;
  }
  stop.store(true);
  for (auto& client : clients)
    client.join();
  clients.clear();

  // Each request was answered as alone, or its deadline passed: nothing else.
  EXPECT_EQ(compared.load() + expired.load(), sent.load());
  EXPECT_GT(refused.load(), 0);
  EXPECT_GE(generation, initial + kSwaps);
  const auto view = Get(admin, "/v2/models/conv/placement");
  for (const auto& layer : view.body["versions"][0]["layers"])
    EXPECT_EQ(layer["generation"], generation) << view.body.dump();
  EXPECT_GT(view.body["batching"]["requests"].get<uint64_t>(),
            view.body["batching"]["executions"].get<uint64_t>())
      << view.body["batching"].dump();
}

}  // namespace
}  // namespace backplane::testing
