// Per-model backend options (issue 41; the ExecuTorch RFC's per-program options) as an operator
// sees them: a model's config.json "backend_options", the admin API's
// /v2/models/{m}[/versions/{v}]/options, the placement view, and what a wrong value does. The
// fixture backend TestValid's Identity adds its option "prepared_offset", read when a workload is
// prepared, so an answer says which value a model runs with.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "backplane/sdk/thread_limits.hpp"
#include "onnx/model_builder.hpp"
#include "serve_test_util.hpp"

namespace backplane::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

class ModelOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CopyFile(Fixture("Valid"), home_.backends() / "Test_Valid_backend.so");
    // An integer for a double option: typed by what the backend declares.
    WriteModel("offset", R"({"backends": ["TestValid"],
                             "backend_options": {"TestValid": {"prepared_offset": 5}}})");
    WriteModel("plain", R"({"backends": ["TestValid"]})");
  }

  void WriteModel(const std::string& name, const std::string& config) {
    home_.Write("models/" + name + "/1/model.onnx", RowIdentityModel());
    home_.Write("models/" + name + "/config.json", config);
  }

  void Start() {
    running_.emplace(StartInProcess(InProcessConfig(home_)));
    client_.emplace("127.0.0.1", running_->http.port);
  }

  // What the model answers for the row [1, 2, 3, 4], less 1: the offset its layer adds. NaN when
  // the request fails.
  double Offset(const std::string& model) {
    const auto reply = Post(*client_, "/v2/models/" + model + "/infer", RowRequest(1));
    EXPECT_EQ(reply.status, 200) << model << ": " << reply.text;
    return reply.status == 200 ? reply.body["outputs"][0]["data"][0].get<double>() - 1 : NAN;
  }

  // Why a model of the repository is not serving, from the repository index.
  std::string WhyUnavailable(const std::string& model) {
    const auto index = Post(*client_, "/v2/repository/index", "");
    for (const auto& entry : index.body) {
      if (entry["name"] == model && entry["state"] == "UNAVAILABLE")
        return entry["reason"];
    }
    return "";
  }

  ServeHome home_;  // outlives the server
  std::optional<server::RunningServer> running_;
  std::optional<httplib::Client> client_;
};

TEST_F(ModelOptionsTest, AModelsOwnOptionsPrepareItsLayersAndTheAdminApiShowsAndChangesThem) {
  Start();
  EXPECT_EQ(Offset("offset"), 5.0) << "the model's own value";
  EXPECT_EQ(Offset("plain"), 0.0) << "the declared default";

  // The placement says every option of the backend at the value the layer was prepared with.
  const auto placement = Get(*client_, "/v2/models/offset/placement");
  ASSERT_EQ(placement.status, 200) << placement.text;
  const json& layer = placement.body["versions"][0]["layers"][0];
  EXPECT_EQ(layer["options"]["prepared_offset"], 5.0);
  EXPECT_EQ(layer["options"]["limit"], 10) << "a declared default";

  const auto options = Get(*client_, "/v2/models/offset/options");
  ASSERT_EQ(options.status, 200) << options.text;
  EXPECT_EQ(options.body["name"], "offset");
  EXPECT_EQ(options.body["versions"][0]["version"], "1");
  EXPECT_EQ(options.body["versions"][0]["backend_options"],
            json({{"TestValid", {{"prepared_offset", 5.0}}}}));
  EXPECT_EQ(options.body["versions"][0]["effective"]["TestValid"]["prepared_offset"], 5.0);
  EXPECT_EQ(Get(*client_, "/v2/models/plain/options").body["versions"][0]["backend_options"],
            json::object());

  // The RFC's update: one model version re-prepared, the other model untouched.
  const auto updated = Put(*client_, "/v2/models/offset/versions/1/options",
                           R"({"TestValid": {"prepared_offset": 7.5}})");
  ASSERT_EQ(updated.status, 200) << updated.text;
  EXPECT_EQ(updated.body["versions"][0]["effective"]["TestValid"]["prepared_offset"], 7.5);
  EXPECT_EQ(Offset("offset"), 7.5);
  EXPECT_EQ(Offset("plain"), 0.0);

  // The server-wide value reaches the model without a value of its own only.
  ASSERT_EQ(Put(*client_, "/v2/backends/TestValid/options", R"({"prepared_offset": 2})").status,
            200);
  EXPECT_EQ(Offset("offset"), 7.5);
  EXPECT_EQ(Offset("plain"), 2.0);

  // A hot swap prepares the new generation with both (ValidNext adds 1000 of its own).
  CopyFile(Fixture("ValidNext"), home_.backends() / ".next");
  fs::rename(home_.backends() / ".next", home_.backends() / "Test_Valid_backend.so");
  const auto reload = Post(*client_, "/v2/backends/TestValid/reload", "");
  ASSERT_EQ(reload.status, 200) << reload.text;
  EXPECT_EQ(Offset("offset"), 1007.5);
  EXPECT_EQ(Offset("plain"), 1002.0);
}

TEST_F(ModelOptionsTest, AWrongUpdateIsRefusedNamingWhatAndChangesNothing) {
  Start();
  const auto refused = [&](const std::string& path, const std::string& body, int status) {
    const auto reply = Put(*client_, path, body);
    EXPECT_EQ(reply.status, status) << path << " " << body << ": " << reply.text;
    return reply.body.is_object() && reply.body.contains("error")
               ? reply.body["error"].get<std::string>()
               : reply.text;
  };
  const std::string path = "/v2/models/offset/options";
  EXPECT_THAT(refused(path, R"({"TestValid": {"nope": 1}})", 400),
              HasSubstr("nothing applied: backend TestValid has no option 'nope' (known: "));
  EXPECT_THAT(refused(path, R"({"TestValid": {"prepared_offset": "5"}})", 400),
              HasSubstr("option 'prepared_offset' is double, got \"5\""));
  EXPECT_THAT(refused(path, R"({"TestValid": {"limit": -1}})", 400),
              HasSubstr("'limit' must be 0 or more, got -1"));
  // A later backend's refusal applies nothing of an earlier one's.
  EXPECT_THAT(
      refused(path, R"({"CpuRef": {"deterministic": false}, "TestValid": {"nope": 1}})", 400),
      HasSubstr("'nope'"));
  EXPECT_THAT(refused(path, R"({"GpuAcc": {"threads": 1}})", 404),
              HasSubstr("this server has no backend 'GpuAcc'"));
  EXPECT_EQ(refused(path, R"([1])", 400).empty(), false);
  EXPECT_EQ(refused(path, R"({})", 400).empty(), false);
  EXPECT_EQ(refused("/v2/models/absent/options", R"({"TestValid": {"limit": 1}})", 404).empty(),
            false);
  EXPECT_EQ(refused("/v2/models/offset/versions/9/options", R"({"TestValid": {"limit": 1}})", 404)
                .empty(),
            false);
  EXPECT_EQ(Offset("offset"), 5.0) << "nothing applied";
  EXPECT_EQ(Get(*client_, "/v2/models/offset/options").body["versions"][0]["backend_options"],
            json({{"TestValid", {{"prepared_offset", 5.0}}}}));
}

TEST_F(ModelOptionsTest, AWrongValueInConfigJsonRefusesThatModelNamingModelBackendAndKey) {
  WriteModel("unknown_key", R"({"backend_options": {"TestValid": {"nope": true}},
                                "backends": ["TestValid"]})");
  WriteModel("wrong_type", R"({"backend_options": {"TestValid": {"prepared_offset": "x"}},
                               "backends": ["TestValid"]})");
  WriteModel("out_of_range", R"({"backend_options": {"TestValid": {"limit": -3}},
                                 "backends": ["TestValid"]})");
  WriteModel("not_an_object", R"({"backend_options": {"TestValid": 3}})");
  WriteModel("nested", R"({"backend_options": {"TestValid": {"limit": {"value": 3}}}})");
  Start();
  EXPECT_THAT(WhyUnavailable("unknown_key"),
              HasSubstr("model 'unknown_key': backend_options: backend TestValid has no option "
                        "'nope'"));
  EXPECT_THAT(WhyUnavailable("wrong_type"),
              HasSubstr("backend TestValid option 'prepared_offset' is double, got \"x\""));
  EXPECT_THAT(WhyUnavailable("out_of_range"), HasSubstr("model 'out_of_range' version 1"));
  EXPECT_THAT(WhyUnavailable("out_of_range"),
              HasSubstr("its options for backend TestValid: backend TestValid option 'limit' must "
                        "be 0 or more, got -3"));
  EXPECT_THAT(WhyUnavailable("not_an_object"),
              HasSubstr("'backend_options' for backend TestValid must be an object"));
  EXPECT_THAT(WhyUnavailable("nested"),
              HasSubstr("option 'limit' must be a boolean, a number or a string"));
  // Nothing else is disturbed.
  EXPECT_EQ(Offset("offset"), 5.0);
  EXPECT_EQ(Offset("plain"), 0.0);

  // A changed config.json applies at the model's next load; the one serving keeps serving if
  // the new one is refused.
  home_.Write("models/offset/config.json", R"({"backends": ["TestValid"],
      "backend_options": {"TestValid": {"prepared_offset": 9}}})");
  ASSERT_EQ(Post(*client_, "/v2/repository/models/offset/load", "").status, 200);
  EXPECT_EQ(Offset("offset"), 9.0);
  home_.Write("models/offset/config.json", R"({"backends": ["TestValid"],
      "backend_options": {"TestValid": {"limit": -1}}})");
  EXPECT_NE(Post(*client_, "/v2/repository/models/offset/load", "").status, 200);
  EXPECT_EQ(Offset("offset"), 9.0);
}

// "instances" (Triton's instance_group count): how many executions of a model run at once. The
// Slow fixtures take 30 ms an execution and add to the output how many of their library's
// executions were running as it entered, so the answers' maximum is the most that overlapped.
class ModelInstancesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CopyFile(Fixture("Slow"), home_.backends() / "Test_Slow_backend.so");
    CopyFile(Fixture("SlowOther"), home_.backends() / "Test_SlowOther_backend.so");
    WriteModel("free", R"({"backends": ["TestSlow"]})");
    WriteModel("single", R"({"backends": ["TestSlow"], "instances": 1})");
    WriteModel("double", R"({"backends": ["TestSlowOther"], "instances": 2})");
    WriteModel("negative", R"({"backends": ["TestSlow"], "instances": -1})");
    server::ServeConfig config = InProcessConfig(home_);
    config.inference_threads = 6;  // the arena is no limit here: only a model's instances are
    running_.emplace(StartInProcess(config));
  }

  void WriteModel(const std::string& name, const std::string& config) {
    home_.Write("models/" + name + "/1/model.onnx", RowIdentityModel());
    home_.Write("models/" + name + "/config.json", config);
  }

  // Six clients send four rows each at once; the most executions that overlapped, as the answers
  // say (0 when any request failed, which the test reports).
  int MostOverlapping(const std::string& model) {
    std::atomic<int> most{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 6; ++c) {
      clients.emplace_back([&] {
        httplib::Client client("127.0.0.1", running_->http.port);
        client.set_read_timeout(std::chrono::seconds(60));
        for (int i = 0; i < 4; ++i) {
          const auto reply = Post(client, "/v2/models/" + model + "/infer", RowRequest(1));
          if (reply.status != 200) {
            ADD_FAILURE() << model << ": " << reply.status << " " << reply.text << reply.error;
            failed.store(true);
            return;
          }
          const int overlap =
              static_cast<int>(reply.body["outputs"][0]["data"][0].get<double>()) - 1;
          for (int seen = most.load();
               overlap > seen && !most.compare_exchange_weak(seen, overlap);) {
          }
        }
      });
    }
    for (auto& client : clients)
      client.join();
    return failed.load() ? 0 : most.load();
  }

  ServeHome home_;  // outlives the server
  std::optional<server::RunningServer> running_;
};

TEST_F(ModelInstancesTest, AModelsInstancesBoundItsExecutionsAtOnceAndALoadChangesThemInPlace) {
  EXPECT_GE(MostOverlapping("free"), 3) << "the harness saw no overlap where nothing limits it";
  EXPECT_EQ(MostOverlapping("single"), 1);
  EXPECT_EQ(MostOverlapping("double"), 2);

  httplib::Client admin("127.0.0.1", running_->http.port);
  const auto view = Get(admin, "/v2/models/double/options");
  ASSERT_EQ(view.status, 200) << view.text;
  EXPECT_EQ(view.body["versions"][0]["instances"],
            json({{"limit", 2}, {"running", 0}, {"waiting", 0}}));
  EXPECT_EQ(Get(admin, "/v2/models/free/options").body["versions"][0]["instances"]["limit"], 0);

  // A changed count applies at the model's next load without a new network.
  const auto placed = Get(admin, "/v2/models/single/placement").body;
  home_.Write("models/single/config.json", R"({"backends": ["TestSlow"], "instances": 3})");
  ASSERT_EQ(Post(admin, "/v2/repository/models/single/load", "").status, 200);
  EXPECT_EQ(Get(admin, "/v2/models/single/options").body["versions"][0]["instances"]["limit"], 3);
  EXPECT_EQ(Get(admin, "/v2/models/single/placement").body, placed) << "the same network";
  EXPECT_EQ(MostOverlapping("single"), 3);

  const auto index = Post(admin, "/v2/repository/index", "");
  bool refused = false;
  for (const auto& entry : index.body) {
    if (entry["name"] == "negative") {
      EXPECT_EQ(entry["state"], "UNAVAILABLE");
      EXPECT_THAT(entry["reason"].get<std::string>(),
                  HasSubstr("'instances' must be an integer from 0 (no limit) to 1024, got -1"));
      refused = true;
    }
  }
  EXPECT_TRUE(refused) << index.text;
}

// Issue 41's check with CpuAcc itself: two models on it at once, one as 1 instance of 2 intra-op
// threads, one as 2 instances of 1, each seen in the placement view (the values, and the
// backend's own note of the threads a compiled run uses), both answering alike, and nothing lost
// when CpuAcc is hot-swapped under them.
std::string WideGemmModel() {  // x [1, 784] -> Gemm 784x1024 -> Relu -> Gemm 1024x10 -> y
  std::mt19937_64 random(20261206);
  const auto draw = [&](std::size_t count) { return UniformFloats(random, count, 0.05f); };
  ModelBuilder builder;
  builder.Input("x", {1, 784}).Output("y", {1, 10});
  builder.FloatInitializer("w0", {784, 1024}, draw(784 * 1024));
  builder.FloatInitializer("b0", {1024}, draw(1024));
  builder.FloatInitializer("w1", {1024, 10}, draw(1024 * 10));
  builder.FloatInitializer("b1", {10}, draw(10));
  builder.Node("Gemm", {"x", "w0", "b0"}, {"h"});
  builder.Node("Relu", {"h"}, {"r"});
  builder.Node("Gemm", {"r", "w1", "b1"}, {"y"});
  return builder.Serialize();
}

TEST(CpuAccModelOptionsTest, TwoModelsKeepTheirThreadsAndInstancesAcrossAHotSwap) {
  if (FindUsableCpus().count < 2)
    GTEST_SKIP() << "needs 2 usable CPUs for a model with 2 intra-op threads";
  ServeHome home;
  CopyFile(BACKPLANE_CPU_ACC, home.backends() / "Backplane_CpuAcc_backend.so");
  const std::string model = WideGemmModel();
  home.Write("models/two_threads/1/model.onnx", model);
  home.Write("models/two_threads/config.json", R"({"backends": ["CpuAcc"], "instances": 1,
      "backend_options": {"CpuAcc": {"intra_op_threads": 2}}})");
  home.Write("models/one_thread/1/model.onnx", model);
  home.Write("models/one_thread/config.json", R"({"backends": ["CpuAcc"], "instances": 2})");
  auto running = StartInProcess(InProcessConfig(home));
  httplib::Client client("127.0.0.1", running.http.port);
  client.set_read_timeout(std::chrono::seconds(60));

  std::string row;
  {
    json data = json::array();
    for (int i = 0; i < 784; ++i)
      data.push_back(static_cast<float>(i % 17) / 17.0f);
    row = json{{"inputs",
                {{{"name", "x"}, {"shape", {1, 784}}, {"datatype", "FP32"}, {"data", data}}}}}
              .dump();
  }
  // Sets `generation` to the one the model's layers run on.
  const auto check = [&](const std::string& when, uint64_t& generation) {
    SCOPED_TRACE(when);
    const auto two = Get(client, "/v2/models/two_threads/placement");
    const auto one = Get(client, "/v2/models/one_thread/placement");
    ASSERT_EQ(two.status, 200) << two.text;
    std::string two_notes, one_notes;
    for (const auto& layer : two.body["versions"][0]["layers"]) {
      EXPECT_EQ(layer["options"]["intra_op_threads"], 2) << layer;
      two_notes += layer["note"].get<std::string>() + ";";
    }
    for (const auto& layer : one.body["versions"][0]["layers"]) {
      EXPECT_EQ(layer["options"]["intra_op_threads"], 1) << layer;
      one_notes += layer["note"].get<std::string>() + ";";
    }
    // CpuAcc's own word on the threads its compiled run uses (compiler.cpp).
    EXPECT_THAT(two_notes, HasSubstr("on 2 threads"));
    EXPECT_THAT(one_notes, ::testing::Not(HasSubstr("threads")));
    EXPECT_EQ(
        Get(client, "/v2/models/two_threads/options").body["versions"][0]["instances"]["limit"], 1);
    EXPECT_EQ(
        Get(client, "/v2/models/one_thread/options").body["versions"][0]["instances"]["limit"], 2);
    const auto a = Post(client, "/v2/models/two_threads/infer", row);
    const auto b = Post(client, "/v2/models/one_thread/infer", row);
    ASSERT_EQ(a.status, 200) << a.text;
    ASSERT_EQ(b.status, 200) << b.text;
    const auto values = [](const JsonReply& reply) {
      return reply.body["outputs"][0]["data"].get<std::vector<float>>();
    };
    const std::vector<float> on_two = values(a), on_one = values(b);
    ASSERT_EQ(on_two.size(), 10u);
    ASSERT_EQ(on_one.size(), 10u);
    for (std::size_t i = 0; i < on_two.size(); ++i)
      EXPECT_NEAR(on_two[i], on_one[i], 1e-4f * (1 + std::abs(on_one[i]))) << "element " << i;
    generation = two.body["versions"][0]["layers"][0]["generation"].get<uint64_t>();
  };
  uint64_t before = 0, after = 0;
  check("at load", before);
  home.Publish(BACKPLANE_CPU_ACC, "Backplane_CpuAcc_backend.so");
  const auto reload = Post(client, "/v2/backends/CpuAcc/reload", "");
  ASSERT_EQ(reload.status, 200) << reload.text;
  check("after a hot swap", after);
  EXPECT_GT(after, before);
}

}  // namespace
}  // namespace backplane::testing
