// Runtime: one backend instance per runtime, shared libraries, everything unloaded at the end.
#include "backplane/runtime/runtime.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::IsCodeMapped;
using ::testing::Not;
using testing::TempDir;

// A backend directory holding the fixtures named.
class BackendDir {
 public:
  explicit BackendDir(std::initializer_list<const char*> fixtures) {
    for (const char* name : fixtures) {
      fs::create_symlink(Fixture(name), dir_ / ("Test_" + std::string(name) + "_backend.so"));
    }
  }
  std::vector<fs::path> paths() const { return {dir_.path()}; }

 private:
  TempDir dir_;
};

int64_t OptionInt(const loader::BackendInstance& instance, std::string_view key) {
  return std::get<int64_t>(instance.GetOption(key).value());
}

TEST(RuntimeTest, CannotStartWithNoBackends) {
  BackendDir empty({});
  auto runtime = Runtime::Create({.backend_paths = empty.paths()});
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(runtime.error().message(), HasSubstr("no backend is available"));

  BackendDir only_broken({"Unique"});
  auto broken = Runtime::Create({.backend_paths = only_broken.paths()});
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.error().message(), HasSubstr("NOT_UNLOADABLE"));
}

TEST(RuntimeTest, EachRuntimeGetsItsOwnInstanceAndSharesTheLibrary) {
  BackendDir dir({"Valid", "Other"});
  auto first = Runtime::Create({.backend_paths = dir.paths()});
  auto second = Runtime::Create({.backend_paths = dir.paths()});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_THAT(first.value()->BackendIds(), ElementsAre("TestOther", "TestValid"));
  auto a = first.value()->Backend("TestValid");
  auto b = second.value()->Backend("TestValid");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a.get(), b.get()) << "one factory call per runtime";
  EXPECT_EQ(a->generation(), b->generation()) << "one mapped library for both";
  // Library-global count: the load-time probe, then one instance per runtime.
  EXPECT_EQ(OptionInt(*a, "factory_calls"), 3);
}

TEST(RuntimeTest, RuntimesCanShareOneRegistry) {
  BackendDir dir({"Valid"});
  auto registry = BackendRegistry::Create({.backend_paths = dir.paths()}).value();
  auto first = Runtime::Create({.registry = registry}).value();
  auto second = Runtime::Create({.registry = registry}).value();
  EXPECT_EQ(&first->registry(), &second->registry());
  EXPECT_NE(first->Backend("TestValid"), second->Backend("TestValid"));
}

// "keeps what it was serving" is said of an id that serves, never of a brand-new id refused when
// a runtime makes its instance (here: a backend whose second instance fails, as one that
// registers a named spdlog logger does: the SharedLogger fixture is not used, its logger would
// outlive its code in spdlog's registry); there it sent operators looking for a generation that
// never existed.
TEST(RuntimeTest, ARejectionSaysTheIdKeepsServingOnlyWhenItServes) {
  TempDir dir;
  fs::create_symlink(Fixture("Valid"), dir / "Test_Valid_backend.so");
  auto runtime = Runtime::Create({.backend_paths = std::vector{dir.path()}}).value();
  const testing::LogCapture log("backplane.registry", spdlog::level::err);
  fs::create_symlink(Fixture("OneInstanceOnly"), dir / "Test_OneInstanceOnly_backend.so");
  (void)runtime->registry().Rescan();
  fs::remove(dir / "Test_Valid_backend.so");
  fs::create_symlink(Fixture("ValidThrowing"), dir / "Test_Valid_backend.so");
  (void)runtime->registry().Rescan();
  const std::vector<std::string> lines = log.Lines();
  std::string never_served;
  std::string serving;
  for (const std::string& line : lines) {
    if (line.find(" rejected: ") == std::string::npos)
      continue;
    if (line.find("Test_OneInstanceOnly_backend.so") != std::string::npos)
      never_served = line;
    if (line.find("Test_Valid_backend.so") != std::string::npos)
      serving = line;
  }
  EXPECT_THAT(never_served, HasSubstr("(backend TestOneInstanceOnly)"));
  EXPECT_THAT(never_served, Not(HasSubstr("keeps what it was serving")));
  EXPECT_THAT(serving, HasSubstr("; backend TestValid keeps what it was serving"));
}

TEST(RuntimeTest, EverythingIsUnloadedWhenTheLastRuntimeGoes) {
  BackendDir dir({"Valid", "Other", "Tbb"});
  auto loader = loader::Loader::Shared().value();  // held to observe; runtimes share it
  std::vector<fs::path> shadows;
  {
    auto first = Runtime::Create({.backend_paths = dir.paths()}).value();
    auto second = Runtime::Create({.backend_paths = dir.paths()}).value();
    for (const auto& id : first->BackendIds()) {
      shadows.push_back(first->Backend(id)->generation()->info().mapped_as);
      EXPECT_TRUE(IsCodeMapped(shadows.back().string()));
    }
    first.reset();
    loader->WaitForUnloads();
    for (const auto& shadow : shadows)
      EXPECT_TRUE(IsCodeMapped(shadow.string())) << "second uses it";
  }
  loader->WaitForUnloads();
  ASSERT_EQ(shadows.size(), 3u);
  for (const auto& shadow : shadows) {
    EXPECT_FALSE(IsCodeMapped(shadow.string())) << shadow;
    EXPECT_FALSE(fs::exists(shadow)) << shadow;
  }
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
}

TEST(RuntimeTest, EveryBackendMethodCanBeCalled) {
  BackendDir dir({"Valid"});
  auto runtime = Runtime::Create({.backend_paths = dir.paths()}).value();
  auto backend = runtime->Backend("TestValid");
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->id(), "TestValid");

  const OperatorDesc identity{.op_type = "Identity",
                              .name = "n0",
                              .inputs = {{DataType::kFloat32, {2}}},
                              .outputs = {{DataType::kFloat32, {2}}}};
  EXPECT_TRUE(backend->IsSupported(identity).ok());
  OperatorDesc conv = identity;
  conv.op_type = "Conv";
  EXPECT_EQ(backend->IsSupported(conv).code(), StatusCode::kUnimplemented);
  EXPECT_FALSE(backend->CreateWorkload(conv).ok());

  auto workload = backend->CreateWorkload(identity);
  ASSERT_TRUE(workload.ok());
  float in[2] = {1.5f, -2.0f}, out[2] = {};
  const ConstTensorView input{identity.inputs[0], in};
  const TensorView output{identity.outputs[0], out};
  ASSERT_TRUE(workload.value()->Execute({&input, 1}, {&output, 1}).ok());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);

  EXPECT_EQ(backend->DescribeOptions().size(), 8u);
  EXPECT_TRUE(backend->UpdateOptions({{"limit", int64_t{3}}, {"label", std::string("x")}}).ok());
  EXPECT_EQ(OptionInt(*backend, "limit"), 3);
  EXPECT_EQ(std::get<std::string>(backend->GetOption("label").value()), "x");
}

TEST(RuntimeTest, OptionUpdatesAreValidatedAndAllOrNothing) {
  BackendDir dir({"Valid"});
  auto runtime = Runtime::Create({.backend_paths = dir.paths()}).value();
  Status unknown =
      runtime->UpdateBackendOptions("TestValid", {{"limit", int64_t{5}}, {"nope", true}});
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("has no option 'nope'"));
  Status wrong_type = runtime->UpdateBackendOptions("TestValid", {{"limit", 2.5}});
  EXPECT_EQ(wrong_type.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OptionInt(*runtime->Backend("TestValid"), "limit"), 10) << "nothing applied";
  EXPECT_EQ(runtime->UpdateBackendOptions("Nope", {}).code(), StatusCode::kNotFound);
}

TEST(RuntimeTest, CreationOptionsAreAppliedAndValidated) {
  BackendDir dir({"Valid"});
  auto runtime = Runtime::Create(
      {.backend_paths = dir.paths(), .backend_options = {{"TestValid", {{"limit", int64_t{7}}}}}});
  ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
  EXPECT_EQ(OptionInt(*runtime.value()->Backend("TestValid"), "limit"), 7);

  auto unknown_backend = Runtime::Create(
      {.backend_paths = dir.paths(), .backend_options = {{"Nope", {{"limit", int64_t{7}}}}}});
  ASSERT_FALSE(unknown_backend.ok());
  EXPECT_THAT(unknown_backend.error().message(), HasSubstr("backend Nope"));
  auto wrong_type = Runtime::Create(
      {.backend_paths = dir.paths(), .backend_options = {{"TestValid", {{"limit", true}}}}});
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_EQ(wrong_type.error().code(), StatusCode::kInvalidArgument);
}

TEST(RuntimeTest, BackendContextHooksAreCallable) {
  BackendDir dir({"Valid"});
  auto runtime = Runtime::Create({.backend_paths = dir.paths()}).value();
  auto backend = runtime->Backend("TestValid");
  auto context = backend->CreateBackendContext();
  ASSERT_TRUE(context.ok());
  ASSERT_NE(context.value(), nullptr);
  EXPECT_TRUE(context.value()->BeforeLoadNetwork(1).ok());
  EXPECT_TRUE(context.value()->AfterLoadNetwork(1).ok());
  EXPECT_FALSE(context.value()->BeforeUnloadNetwork(13).ok());
  EXPECT_EQ(OptionInt(*backend, "hook_calls"), 2);
}

TEST(RuntimeTest, CpuRefRunsAddWithBroadcastingAndRelu) {
  TempDir dir;
  fs::create_symlink(testing::CpuRefBackend(), dir / "Backplane_CpuRef_backend.so");
  auto runtime = Runtime::Create({.backend_paths = std::vector{dir.path()}}).value();
  auto cpu_ref = runtime->Backend("CpuRef");
  ASSERT_NE(cpu_ref, nullptr);

  const OperatorDesc add{.op_type = "Add",
                         .name = "add",
                         .inputs = {{DataType::kFloat32, {2, 3}}, {DataType::kFloat32, {3}}},
                         .outputs = {{DataType::kFloat32, {2, 3}}}};
  auto add_workload = cpu_ref->CreateWorkload(add);
  ASSERT_TRUE(add_workload.ok()) << add_workload.error().ToString();
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30};
  float sum[6] = {};
  const ConstTensorView add_in[2] = {{add.inputs[0], a}, {add.inputs[1], b}};
  const TensorView add_out{add.outputs[0], sum};
  ASSERT_TRUE(add_workload.value()->Execute(add_in, {&add_out, 1}).ok());
  EXPECT_THAT(sum, ElementsAre(11, 22, 33, 14, 25, 36));

  const OperatorDesc relu{.op_type = "Relu",
                          .name = "relu",
                          .inputs = {{DataType::kFloat32, {4}}},
                          .outputs = {{DataType::kFloat32, {4}}}};
  auto relu_workload = cpu_ref->CreateWorkload(relu);
  ASSERT_TRUE(relu_workload.ok());
  const float x[4] = {-1.0f, 0.0f, 2.5f, -0.0f};
  float y[4] = {};
  const ConstTensorView relu_in{relu.inputs[0], x};
  const TensorView relu_out{relu.outputs[0], y};
  ASSERT_TRUE(relu_workload.value()->Execute({&relu_in, 1}, {&relu_out, 1}).ok());
  EXPECT_THAT(y, ElementsAre(0.0f, 0.0f, 2.5f, 0.0f));

  OperatorDesc bad = add;
  bad.inputs[1].shape = {4};
  Status mismatch = cpu_ref->IsSupported(bad);
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.message(), HasSubstr("shapes [2,3] and [4] do not broadcast"));
  OperatorDesc lstm = relu;
  lstm.op_type = "LSTM";
  EXPECT_EQ(cpu_ref->IsSupported(lstm).code(), StatusCode::kUnimplemented);
  EXPECT_THAT(cpu_ref->IsSupported(lstm).message(), HasSubstr("LSTM"));
}

}  // namespace
}  // namespace backplane
