// Runtime's network API on fixture backends: placement by preference, hooks, bad requests,
// concurrency, overload, asynchronous execution.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <latch>
#include <memory>
#include <thread>

#include "backplane/runtime/runtime.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// x -> Identity -> y, with a shape that may have a dynamic (negative) dimension.
Network IdentityNetwork(Shape shape) {
  const TensorInfo info{DataType::kFloat32, shape};
  Network network{.name = "identity"};
  network.inputs = {{"x", info}};
  network.outputs = {{"y", info}};
  network.nodes = {{.name = "copy", .op_type = "Identity", .inputs = {"x"}, .outputs = {"y"}}};
  network.values = {{"x", info}, {"y", info}};
  return network;
}

class RuntimeNetworkTest : public ::testing::Test {
 protected:
  std::unique_ptr<Runtime> MakeRuntime(RuntimeOptions options = {}) {
    options.backend_paths = std::vector{dir_.path()};
    auto runtime = Runtime::Create(std::move(options));
    EXPECT_TRUE(runtime.ok()) << runtime.error().ToString();
    return std::move(runtime).value();
  }
  void SetUp() override {
    for (const char* name : {"Valid", "Offset"}) {
      fs::create_symlink(testing::Fixture(name),
                         dir_ / ("Test_" + std::string(name) + "_backend.so"));
    }
    fs::create_symlink(testing::CpuRefBackend(), dir_ / "Backplane_CpuRef_backend.so");
  }
  testing::TempDir dir_;
};

std::vector<float> RunOnce(Runtime& runtime, NetworkId id, std::vector<float> values, Shape shape) {
  const ConstTensorView input{{DataType::kFloat32, shape}, values.data()};
  auto outputs = runtime.Execute(id, {&input, 1});
  EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
  if (!outputs.ok())
    return {};
  const auto out = (*outputs)[0].Elements<float>();
  return {out.begin(), out.end()};
}

TEST_F(RuntimeNetworkTest, EachLayerGoesToTheFirstPreferredBackendThatSupportsIt) {
  auto runtime = MakeRuntime();
  // TestOffset (a build that adds 1000) first: it runs the Identity.
  auto offset_first = runtime->LoadNetwork(IdentityNetwork({2}),
                                           {.backend_preferences = {"TestOffset", "TestValid"}});
  ASSERT_TRUE(offset_first.ok()) << offset_first.error().ToString();
  EXPECT_THAT(RunOnce(*runtime, offset_first.value(), {1, 2}, {2}), ElementsAre(1001, 1002));
  auto placement = runtime->GetPlacement(offset_first.value()).value();
  ASSERT_EQ(placement.size(), 1u);
  EXPECT_EQ(placement[0].node, "copy");
  EXPECT_EQ(placement[0].backend_id, "TestOffset");
  EXPECT_GT(placement[0].generation, 0u);

  // CpuRef first: it runs Identity too.
  auto cpu_ref_first =
      runtime->LoadNetwork(IdentityNetwork({2}), {.backend_preferences = {"CpuRef", "TestOffset"}});
  ASSERT_TRUE(cpu_ref_first.ok()) << cpu_ref_first.error().ToString();
  EXPECT_THAT(RunOnce(*runtime, cpu_ref_first.value(), {1, 2}, {2}), ElementsAre(1, 2));
  EXPECT_EQ(runtime->GetPlacement(cpu_ref_first.value()).value()[0].backend_id, "CpuRef");
}

TEST_F(RuntimeNetworkTest, ALayerNoBackendSupportsFailsTheLoadNamingLayerAndBackends) {
  auto runtime = MakeRuntime();
  Network network = IdentityNetwork({2});
  network.nodes[0].op_type = "Gemm";  // neither fixture runs Gemm; CpuRef needs more inputs
  auto loaded = runtime->LoadNetwork(std::move(network),
                                     {.backend_preferences = {"TestValid", "TestOffset"}});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(loaded.error().message(), HasSubstr("node 'copy' (Gemm) is supported by no backend"));
  EXPECT_THAT(loaded.error().message(), HasSubstr("TestValid: TestValid runs Identity only"));
  EXPECT_THAT(loaded.error().message(), HasSubstr("TestOffset: "));

  auto unknown = runtime->LoadNetwork(IdentityNetwork({2}), {.backend_preferences = {"GpuAcc"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.error().message(), HasSubstr("GpuAcc names no backend of this runtime"));
  // An unavailable backend among available ones is skipped (ArmNN's Optimize does the same).
  auto skipped =
      runtime->LoadNetwork(IdentityNetwork({2}), {.backend_preferences = {"GpuAcc", "TestValid"}});
  ASSERT_TRUE(skipped.ok()) << skipped.error().ToString();
  EXPECT_EQ(runtime->GetPlacement(skipped.value()).value()[0].backend_id, "TestValid");
}

TEST_F(RuntimeNetworkTest, BadRequestsGetClearErrorsAndTheNetworkKeepsServing) {
  auto runtime = MakeRuntime({.default_preferences = {"TestValid"}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({2, 3})).value();
  std::vector<float> six(6, 1.0f);
  const ConstTensorView wrong_shape{{DataType::kFloat32, {3, 2}}, six.data()};
  auto shape_error = runtime->Execute(id, {&wrong_shape, 1});
  ASSERT_FALSE(shape_error.ok());
  EXPECT_THAT(shape_error.error().message(),
              HasSubstr("input 'x' must have shape [2,3] (negative: any size), got [3,2]"));
  const ConstTensorView wrong_type{{DataType::kInt32, {2, 3}}, six.data()};
  EXPECT_THAT(runtime->Execute(id, {&wrong_type, 1}).error().message(),
              HasSubstr("input 'x' must be FP32, got INT32"));
  EXPECT_THAT(runtime->Execute(id, {}).error().message(), HasSubstr("takes 1 input(s) (x), got 0"));
  EXPECT_EQ(runtime->Execute(id + 100, {}).error().code(), StatusCode::kNotFound);
  EXPECT_THAT(RunOnce(*runtime, id, {1, 2, 3, 4, 5, 6}, {2, 3}), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(RuntimeNetworkTest, InputsByNameAreCheckedAgainstTheNetwork) {
  auto runtime = MakeRuntime({.default_preferences = {"TestValid"}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({2})).value();
  float values[2] = {3, 4};
  const ConstTensorView view{{DataType::kFloat32, {2}}, values};
  auto ok = runtime->ExecuteByName(id, Runtime::NamedInputs{{"x", view}});
  ASSERT_TRUE(ok.ok()) << ok.error().ToString();
  EXPECT_EQ((*ok)[0].Elements<float>()[1], 4.0f);
  auto unknown = runtime->ExecuteByName(id, Runtime::NamedInputs{{"x", view}, {"z", view}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.error().message(), HasSubstr("has no input 'z' (inputs: x)"));
  auto missing = runtime->ExecuteByName(id, Runtime::NamedInputs{});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message(), HasSubstr("input 'x' is missing"));
}

TEST_F(RuntimeNetworkTest, DynamicBatchIsResolvedPerRequest) {
  auto runtime = MakeRuntime({.default_preferences = {"CpuRef"}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({-1, 2})).value();
  EXPECT_THAT(RunOnce(*runtime, id, {1, 2}, {1, 2}), ElementsAre(1, 2));
  EXPECT_THAT(RunOnce(*runtime, id, {1, 2, 3, 4, 5, 6}, {3, 2}), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(RuntimeNetworkTest, BackendContextHooksRunAroundLoadAndUnload) {
  auto runtime = MakeRuntime({.default_preferences = {"TestValid"}});
  auto hooks = [&] {
    return std::get<int64_t>(runtime->Backend("TestValid")->GetOption("hook_calls").value());
  };
  const int64_t before = hooks();
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({2})).value();
  // TestValid and TestOffset share no library, so only TestValid's context counts here.
  EXPECT_EQ(hooks(), before + 2);
  ASSERT_TRUE(runtime->UnloadNetwork(id).ok());
  EXPECT_EQ(hooks(), before + 4);
  EXPECT_EQ(runtime->UnloadNetwork(id).code(), StatusCode::kNotFound);
}

TEST_F(RuntimeNetworkTest, AFailingBeforeUnloadNetworkKeepsTheNetworkLoaded) {
  auto runtime = MakeRuntime({.default_preferences = {"TestValid"}});
  // The fixture's context refuses to unload network 13.
  NetworkId id = 0;
  while (id < 13)
    id = runtime->LoadNetwork(IdentityNetwork({2})).value();
  Status refused = runtime->UnloadNetwork(13);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("network 13 stays loaded"));
  EXPECT_THAT(refused.message(), HasSubstr("network 13 is never unloaded"));
  EXPECT_THAT(RunOnce(*runtime, 13, {4, 5}, {2}), ElementsAre(4, 5));
}

TEST_F(RuntimeNetworkTest, ManyThreadsExecuteOneNetworkAtOnce) {
  auto runtime =
      MakeRuntime({.default_preferences = {"CpuRef"}, .scheduler = {.max_in_flight = 64}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({-1, 4})).value();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int64_t rows = 1 + (t + i) % 5;
        std::vector<float> values(rows * 4, static_cast<float>(t * 1000 + i));
        const ConstTensorView input{{DataType::kFloat32, {rows, 4}}, values.data()};
        auto outputs = runtime->Execute(id, {&input, 1});
        if (!outputs.ok() || (*outputs)[0].info().shape != Shape{rows, 4} ||
            (*outputs)[0].Elements<float>()[rows * 4 - 1] != values.back()) {
          ++wrong;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(RuntimeNetworkTest, BeyondTheLimitRequestsAreRefusedNotQueued) {
  auto runtime =
      MakeRuntime({.default_preferences = {"TestValid"}, .scheduler = {.max_in_flight = 1}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({1})).value();
  std::latch release(1);
  std::latch entered(1);
  std::promise<void> finished;
  Tensor input({DataType::kFloat32, {1}});
  runtime->ExecuteAsync(id, {input}, [&](Result<std::vector<Tensor>> result) {
    EXPECT_TRUE(result.ok());
    entered.count_down();
    release.wait();  // holds the only slot
    finished.set_value();
  });
  entered.wait();
  auto refused = runtime->Execute(id, std::vector{input.View()});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.error().message(), HasSubstr("overloaded"));
  release.count_down();
  finished.get_future().wait();
}

TEST_F(RuntimeNetworkTest, AsyncExecutionDeliversOutputsAndHonoursDeadlines) {
  auto runtime = MakeRuntime({.default_preferences = {"TestOffset"}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({2})).value();
  Tensor input({DataType::kFloat32, {2}});
  input.Elements<float>()[0] = 1;
  input.Elements<float>()[1] = 2;
  auto result = runtime->ExecuteAsync(id, {input}).get();
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_THAT(std::vector<float>((*result)[0].Elements<float>().begin(),
                                 (*result)[0].Elements<float>().end()),
              ElementsAre(1001, 1002));
  auto late = runtime->ExecuteAsync(id, {input}, scheduler::Clock::now() - std::chrono::seconds(1));
  EXPECT_EQ(late.get().error().code(), StatusCode::kDeadlineExceeded);
}

TEST_F(RuntimeNetworkTest, AsyncExecutionMakesItsInputsOnTheWorkerAndReportsTheirError) {
  auto runtime = MakeRuntime({.default_preferences = {"TestOffset"}});
  const NetworkId id = runtime->LoadNetwork(IdentityNetwork({1})).value();
  const auto caller = std::this_thread::get_id();

  std::promise<std::pair<std::thread::id, Result<std::vector<Tensor>>>> made;
  auto made_on = std::make_shared<std::thread::id>();
  runtime->ExecuteAsync(
      id,
      [made_on]() -> Result<std::vector<Tensor>> {
        *made_on = std::this_thread::get_id();
        Tensor input({DataType::kFloat32, {1}});
        input.Elements<float>()[0] = 7;
        return std::vector<Tensor>{std::move(input)};
      },
      [&](Result<std::vector<Tensor>> result) {
        made.set_value({*made_on, std::move(result)});
      });
  auto [thread, result] = made.get_future().get();
  EXPECT_NE(thread, caller);
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->at(0).Elements<float>()[0], 1007);

  std::promise<Result<std::vector<Tensor>>> refused;
  bool executed = false;
  runtime->ExecuteAsync(
      id, []() -> Result<std::vector<Tensor>> { return InvalidArgument("input 'x': bad shape"); },
      [&](Result<std::vector<Tensor>> outcome) {
        executed = outcome.ok();
        refused.set_value(std::move(outcome));
      });
  auto error = refused.get_future().get();
  ASSERT_FALSE(error.ok());
  EXPECT_FALSE(executed);
  EXPECT_EQ(error.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(error.error().message(), "input 'x': bad shape");
}

}  // namespace
}  // namespace backplane
