// Per-call options (SDK 1.4, the ExecuTorch RFC's options at execute): Execute's CallOptions
// override, for that call alone, the network's, the runtime's and the declared default values of
// the options a backend declares per call. The fixture backends add "call_offset" to every output
// (fixture_backend.hpp), so the output says which level won.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backplane/isolation/worker_runner.hpp"
#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;

class CallOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Publish("Valid", "Test_Valid_backend.so");
    auto registry = BackendRegistry::Create(
        {.backend_paths = std::vector{dir_.path()}, .settle_time = std::chrono::milliseconds(0)});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
  }

  std::unique_ptr<Runtime> MakeRuntime(RuntimeOptions options = {}) {
    options.registry = registry_;
    auto runtime = Runtime::Create(std::move(options));
    EXPECT_TRUE(runtime.ok()) << runtime.error().ToString();
    return std::move(runtime).value();
  }

  void Publish(std::string_view fixture, const std::string& name) {
    testing::CopyFile(Fixture(fixture), dir_ / ".incoming");
    fs::rename(dir_ / ".incoming", dir_ / name);
  }

  TempDir dir_;
  std::shared_ptr<BackendRegistry> registry_;
};

// What the two-layer identity network adds to its input (every offset counts twice), or why
// the call failed.
Result<float> RunWith(Runtime& runtime, NetworkId network, const CallOptions& options = {}) {
  const std::vector<float> input(4, 5.0f);
  const ConstTensorView view{{DataType::kFloat32, {4}}, input.data()};
  auto outputs = runtime.Execute(network, std::span(&view, 1), {}, options);
  if (!outputs.ok())
    return std::move(outputs).error();
  return outputs->at(0).Elements<float>()[0] - 5.0f;
}

// The same for a call that must succeed: NaN (and a failure) when it does not.
float Offset(Runtime& runtime, NetworkId network, const CallOptions& options = {}) {
  auto offset = RunWith(runtime, network, options);
  if (!offset.ok()) {
    ADD_FAILURE() << offset.error().ToString();
    return NAN;
  }
  return offset.value();
}

CallOptions CallOffset(double value, std::string backend = "TestValid") {
  return {{std::move(backend), {{"call_offset", value}}}};
}

TEST_F(CallOptionsTest, PerCallOverPerNetworkOverPerRuntimeOverTheDefault) {
  auto runtime = MakeRuntime();
  auto plain = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(plain.ok()) << plain.error().ToString();
  auto own = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                  {.backend_options = {{"TestValid", {{"call_offset", 10.0}}}}});
  ASSERT_TRUE(own.ok()) << own.error().ToString();

  EXPECT_EQ(Offset(*runtime, plain.value()), 0.0f) << "the declared default";
  ASSERT_TRUE(runtime->UpdateBackendOptions("TestValid", {{"call_offset", 1.0}}).ok());
  EXPECT_EQ(Offset(*runtime, plain.value()), 2.0f) << "the runtime's value";
  EXPECT_EQ(Offset(*runtime, own.value()), 20.0f) << "the network's over the runtime's";
  EXPECT_EQ(Offset(*runtime, own.value(), CallOffset(100)), 200.0f)
      << "the call's over the network's";
  EXPECT_EQ(Offset(*runtime, plain.value(), CallOffset(100)), 200.0f)
      << "the call's over the runtime's";
  // For that call alone.
  EXPECT_EQ(Offset(*runtime, own.value()), 20.0f);
  EXPECT_EQ(Offset(*runtime, plain.value()), 2.0f);
  // The other options of the merged set keep their prepared values: the network's own
  // prepared_offset still counts.
  auto both =
      runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                           {.backend_options = {{"TestValid", {{"prepared_offset", 3.0}}}}});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(Offset(*runtime, both.value(), CallOffset(100)), 206.0f);
  // An integer for a double option is taken as that double (a JSON 1, gRPC's int64_param).
  EXPECT_EQ(Offset(*runtime, own.value(), {{"TestValid", {{"call_offset", int64_t{50}}}}}), 100.0f);
  // An empty set for a backend gives nothing, and options for a backend this network does not
  // run on are checked and otherwise ignored.
  EXPECT_EQ(Offset(*runtime, own.value(), {{"TestValid", {}}}), 20.0f);
}

TEST_F(CallOptionsTest, ExecuteAsyncRunsWithTheCallsOptions) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  std::vector<Tensor> inputs;
  inputs.emplace_back(TensorInfo{DataType::kFloat32, {4}});
  auto outputs = runtime->ExecuteAsync(network.value(), inputs, std::nullopt, CallOffset(7)).get();
  ASSERT_TRUE(outputs.ok()) << outputs.error().ToString();
  EXPECT_EQ(outputs->at(0).Elements<float>()[0], 14.0f);

  auto refused =
      runtime->ExecuteAsync(network.value(), inputs, std::nullopt, {{"TestValid", {{"nope", 1.0}}}})
          .get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.error().message(), HasSubstr("backend TestValid has no option 'nope'"));
}

TEST_F(CallOptionsTest, WrongCallOptionsAreRefusedNamingBackendAndKeyBeforeAnythingRuns) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  const struct {
    CallOptions options;
    std::string message;
  } cases[] = {
      {{{"TestValid", {{"nope", 1.0}}}}, "backend TestValid has no option 'nope'"},
      {{{"TestValid", {{"call_offset", std::string("x")}}}},
       "backend TestValid option 'call_offset' is double, got string \"x\""},
      {{{"TestValid", {{"prepared_offset", 1.0}}}},
       "backend TestValid option 'prepared_offset' is not taken per call, only per network or "
       "per runtime (per call: call_offset, worker_threads)"},
      {{{"TestValid", {{"worker_threads", int64_t{1} << 20}}}},
       "backend TestValid option 'worker_threads' must be 1 to"},
      {{{"GpuAcc", {{"threads", int64_t{2}}}}},
       "the call's options name backend GpuAcc, which this runtime does not have (backends: "
       "TestValid)"},
  };
  for (const auto& wrong : cases) {
    auto refused = RunWith(*runtime, network.value(), wrong.options);
    ASSERT_FALSE(refused.ok()) << wrong.message;
    EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument) << wrong.message;
    EXPECT_THAT(refused.error().message(), HasSubstr(wrong.message));
  }
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f) << "nothing changed";
}

TEST_F(CallOptionsTest, OptionsForABackendTheNetworkDoesNotRunOnAreCheckedThenIgnored) {
  Publish("Other", "Test_Other_backend.so");
  (void)registry_->Rescan();
  auto runtime = MakeRuntime();
  ASSERT_NE(runtime->Backend("TestOther"), nullptr);
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestValid"}});
  ASSERT_TRUE(network.ok());
  EXPECT_EQ(Offset(*runtime, network.value(), CallOffset(100, "TestOther")), 0.0f);
  auto refused = RunWith(*runtime, network.value(), {{"TestOther", {{"limit", int64_t{1}}}}});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message(),
              HasSubstr("backend TestOther option 'limit' is not taken per call"));
}

// A backend built against SDK 1.3 has no ExecuteWithOptions slot: it takes no option per call,
// whatever it would name (the fixture's code names call_offset, but reports 1.3).
TEST_F(CallOptionsTest, ABackendBuiltAgainstSdk13TakesNoOptionsPerCall) {
  Publish("Api13", "Test_Api13_backend.so");
  (void)registry_->Rescan();
  auto runtime = MakeRuntime();
  ASSERT_NE(runtime->Backend("TestApi13"), nullptr);
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestApi13"}});
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  auto refused = RunWith(*runtime, network.value(), CallOffset(1, "TestApi13"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.error().message(),
              HasSubstr("backend TestApi13 option 'call_offset' is not taken per call, only per "
                        "network or per runtime (per call: none)"));
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
}

// Per call, so nothing to carry over: a hot swap's new binding runs the next call with the
// call's values as the old one did.
TEST_F(CallOptionsTest, CallOptionsReachTheNetworkAfterAHotSwap) {
  auto runtime = MakeRuntime();
  auto network =
      runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                           {.backend_options = {{"TestValid", {{"call_offset", 10.0}}}}});
  ASSERT_TRUE(network.ok());
  EXPECT_EQ(Offset(*runtime, network.value(), CallOffset(1)), 2.0f);
  Publish("ValidNext", "Test_Valid_backend.so");
  auto outcome = registry_->Reload("TestValid");
  ASSERT_TRUE(outcome.ok()) << outcome.error().ToString();
  EXPECT_EQ(Offset(*runtime, network.value(), CallOffset(1)), 2.0f + 2 * testing::kNextOffset);
  EXPECT_EQ(Offset(*runtime, network.value()), 20.0f + 2 * testing::kNextOffset);
}

// A backend run in a worker process: the call's merged values cross with the request
// (kExecuteWithOptions) and the refusals are the host's, before anything crosses.
TEST_F(CallOptionsTest, CallOptionsReachABackendInAWorkerProcess) {
  loader::LoaderOptions loader_options;
  loader_options.out_of_process = isolation::MakeWorkerRunner({.by_default = true});
  auto loader = loader::Loader::Create(std::move(loader_options));
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                           .loader = std::move(loader).value(),
                                           .settle_time = std::chrono::milliseconds(0)});
  ASSERT_TRUE(registry.ok()) << registry.error().ToString();
  registry_ = std::move(registry).value();
  ASSERT_NE(registry_->Find("TestValid")->generation->out_of_process(), nullptr);
  auto runtime = MakeRuntime();
  auto network =
      runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                           {.backend_options = {{"TestValid", {{"call_offset", 10.0}}}}});
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(Offset(*runtime, network.value()), 20.0f);
  EXPECT_EQ(Offset(*runtime, network.value(), CallOffset(3)), 6.0f);
  EXPECT_EQ(Offset(*runtime, network.value()), 20.0f);
  auto refused = RunWith(*runtime, network.value(), {{"TestValid", {{"limit", int64_t{1}}}}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.error().message(),
              HasSubstr("backend TestValid option 'limit' is not taken per call"));
}

}  // namespace
}  // namespace backplane
