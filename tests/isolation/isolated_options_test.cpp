// SDK 1.3 per-network options on a backend run in a worker process, through the host's
// BackendInstance as a runtime uses it: the options one network is prepared with cross to the
// worker with each workload, the backend's own CheckOptions runs there, and a library built
// against 1.2 gets the calls it has (the instance reports the library's API, not the host's).
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

}  // namespace
}  // namespace backplane::isolation
