// SDK 1.3 per-network options (and SDK 1.4 per-call options, below) on a backend run in a worker
// process, through the host's BackendInstance as a runtime uses it: the options one network is
// prepared with cross to the worker with each workload, the backend's own CheckOptions runs there,
// and a library built against 1.2 gets the calls it has (the instance reports the library's API,
// not the host's).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backplane/isolation/worker_runner.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::isolation {
namespace {

using testing::Fixture;
using ::testing::HasSubstr;
using testing::IdentityOp;
using testing::MakeLoader;
using testing::RunIdentity;

constexpr int64_t kElements = 4;

// An instance of fixture `name`, its generation run in a worker (isolated) or mapped here.
struct Loaded {
  std::shared_ptr<loader::Loader> loader;
  loader::GenerationLease generation;
  std::shared_ptr<loader::BackendInstance> instance;
};

Loaded Load(std::string_view name, bool isolated) {
  Loaded loaded;
  loader::LoaderOptions options;
  if (isolated)
    options.out_of_process = MakeWorkerRunner({.by_default = true});
  loaded.loader = MakeLoader(std::move(options));
  auto generation = loaded.loader->Load(Fixture(name));
  EXPECT_TRUE(generation.ok()) << generation.error().ToString();
  if (!generation.ok())
    return loaded;
  loaded.generation = std::move(generation).value();
  EXPECT_EQ(loaded.generation->out_of_process() != nullptr, isolated) << name;
  auto instance = loaded.loader->CreateInstance(loaded.generation);
  EXPECT_TRUE(instance.ok()) << instance.error().ToString();
  if (instance.ok())
    loaded.instance = std::move(instance).value();
  return loaded;
}

// i + offset for i = 0, 1, 2...: what RunIdentity gives from a fixture workload adding `offset`.
std::vector<float> Offset(float offset) {
  std::vector<float> expected(kElements);
  for (int64_t i = 0; i < kElements; ++i)
    expected[i] = static_cast<float>(i) + offset;
  return expected;
}

// The same assertions in process and isolated: an isolated backend behaves as in-process.
class NetworkOptionsTest : public ::testing::TestWithParam<bool> {};

TEST_P(NetworkOptionsTest, ANetworksOptionsReachOnlyItsOwnWorkloads) {
  Loaded loaded = Load("Valid", GetParam());
  ASSERT_NE(loaded.instance, nullptr);
  loader::BackendInstance& instance = *loaded.instance;
  EXPECT_EQ(instance.api_version(), kBackendApiVersion);
  ASSERT_TRUE(instance.Implements({1, 3}));
  // The instance's value, which a network without options of its own is prepared with.
  ASSERT_TRUE(instance.UpdateOptions({{"prepared_offset", 2.0}}).ok());

  const BackendOptions network_options{{"prepared_offset", 5.0}};
  ASSERT_TRUE(instance.CheckNetworkOptions(network_options).ok());
  auto with_options = instance.CreateWorkload(IdentityOp(kElements), network_options);
  ASSERT_TRUE(with_options.ok()) << with_options.error().ToString();
  auto without = instance.CreateWorkload(IdentityOp(kElements));
  ASSERT_TRUE(without.ok()) << without.error().ToString();

  EXPECT_EQ(RunIdentity(**with_options, kElements), Offset(5.0f));
  EXPECT_EQ(RunIdentity(**without, kElements), Offset(2.0f));
  // Neither network's values changed the instance's.
  EXPECT_EQ(std::get<double>(instance.GetOption("prepared_offset").value()), 2.0);
}

// "limit" must be 0 or more: a range only the backend's CheckOptions knows (the type is right),
// so the refusal proves the backend's own check ran, wherever it runs.
TEST_P(NetworkOptionsTest, TheBackendsCheckRefusesANegativeLimitNamingIt) {
  Loaded loaded = Load("Valid", GetParam());
  ASSERT_NE(loaded.instance, nullptr);
  const Status refused = loaded.instance->CheckNetworkOptions({{"limit", int64_t{-1}}});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("backend TestValid option 'limit' must be 0 or more, got -1"));
  EXPECT_TRUE(loaded.instance->CheckNetworkOptions({{"limit", int64_t{0}}}).ok());
  const Status wrong_type = loaded.instance->CheckNetworkOptions({{"limit", 1.5}});
  EXPECT_EQ(wrong_type.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_type.message(), HasSubstr("limit"));
}

// Built against 1.2: the instance says 1.2 (the library's version, from the worker), so the host
// prepares with the old calls, which take the instance's values, and refuses a network with
// options of its own. Had a 1.3 call been sent, the worker would have refused it
// (BackendWorkerTest.AWorkerNeverCallsAnSdk13MethodOnAnOlderLibrary): the workload would fail.
TEST_P(NetworkOptionsTest, ABackendBuiltAgainst12GetsTheOldCallsAndNoNetworkOptions) {
  Loaded loaded = Load("Api12", GetParam());
  ASSERT_NE(loaded.instance, nullptr);
  loader::BackendInstance& instance = *loaded.instance;
  EXPECT_EQ(loaded.generation->info().api_version, (BackendApiVersion{1, 2}));
  EXPECT_EQ(instance.api_version(), (BackendApiVersion{1, 2}));
  EXPECT_FALSE(instance.Implements({1, 3}));
  ASSERT_TRUE(instance.UpdateOptions({{"prepared_offset", 3.0}}).ok());

  auto workload = instance.CreateWorkload(IdentityOp(kElements));
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  EXPECT_EQ(RunIdentity(**workload, kElements), Offset(3.0f));

  const BackendOptions network_options{{"prepared_offset", 5.0}};
  auto prepared = instance.CreateWorkload(IdentityOp(kElements), network_options);
  ASSERT_FALSE(prepared.ok()) << "prepared with per-network options on a 1.2 backend";
  for (const Status& refused : {instance.CheckNetworkOptions(network_options), prepared.error()}) {
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("backend TestApi12 was built against API 1.2"));
    EXPECT_THAT(refused.message(), HasSubstr("takes options per runtime only"));
  }
}

INSTANTIATE_TEST_SUITE_P(InProcessAndIsolated, NetworkOptionsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Isolated" : "InProcess"; });

// SDK 1.4 per-call options, in process and across the worker protocol: the names a backend
// takes per call come from the worker, and one call's values cross with its tensors
// (kExecuteWithOptions) and reach that call alone.
using CallOptionsTest = NetworkOptionsTest;

// RunIdentity with the call's values for every declared option (ExecuteWithOptions).
std::vector<float> RunIdentityWith(loader::Workload& workload, const BackendOptions& options) {
  std::vector<float> in(kElements), out(kElements, -1.0f);
  for (int64_t i = 0; i < kElements; ++i)
    in[i] = static_cast<float>(i);
  const ConstTensorView input{{DataType::kFloat32, {kElements}}, in.data()};
  const TensorView output{{DataType::kFloat32, {kElements}}, out.data()};
  Status status = workload.Execute({&input, 1}, {&output, 1}, options);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return out;
}

TEST_P(CallOptionsTest, OneCallsValuesCrossWithItAndReachThatCallAlone) {
  Loaded loaded = Load("Valid", GetParam());
  ASSERT_NE(loaded.instance, nullptr);
  loader::BackendInstance& instance = *loaded.instance;
  ASSERT_TRUE(instance.Implements({1, 4}));
  EXPECT_EQ(instance.DescribeCallOptions(),
            (std::vector<std::string>{"call_offset", "worker_threads"}));
  // Prepared with the network's call_offset: what a call without values of its own adds.
  BackendOptions prepared = instance.EffectiveOptions({{"call_offset", 5.0}});
  auto workload = instance.CreateWorkload(IdentityOp(kElements), {{"call_offset", 5.0}});
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  EXPECT_EQ(RunIdentity(**workload, kElements), Offset(5.0f));
  BackendOptions call = prepared;
  call["call_offset"] = 7.0;
  EXPECT_EQ(RunIdentityWith(**workload, call), Offset(7.0f));
  EXPECT_EQ(RunIdentity(**workload, kElements), Offset(5.0f)) << "for that call alone";
}

// Built against 1.3: no per-call names are asked for (the worker would refuse the call), and a
// workload given values anyway runs as Execute, which its vtable has.
TEST_P(CallOptionsTest, ABackendBuiltAgainst13IsNeverSentThe14Calls) {
  Loaded loaded = Load("Api13", GetParam());
  ASSERT_NE(loaded.instance, nullptr);
  loader::BackendInstance& instance = *loaded.instance;
  EXPECT_EQ(instance.api_version(), (BackendApiVersion{1, 3}));
  EXPECT_TRUE(instance.DescribeCallOptions().empty());
  auto workload = instance.CreateWorkload(IdentityOp(kElements), {{"call_offset", 5.0}});
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();
  BackendOptions call = instance.EffectiveOptions({{"call_offset", 7.0}});
  EXPECT_EQ(RunIdentityWith(**workload, call), Offset(5.0f));
}

INSTANTIATE_TEST_SUITE_P(InProcessAndIsolated, CallOptionsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Isolated" : "InProcess"; });

}  // namespace
}  // namespace backplane::isolation
