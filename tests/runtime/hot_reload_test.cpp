// Hot reload without the watcher: the registry's Rescan, Reload, Rollback and Pin driving real
// generations of real fixture libraries, with a runtime serving through every change.
#include <fcntl.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

#include "backplane/core/backend_call_record.hpp"
#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using Action = DeployOutcome::Action;
using ::testing::ElementsAre;
using testing::Fixture;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::kNextOffset;
using testing::TempDir;

// These tests publish complete files: a broken one is rejected at once. The deferral of a file
// that may still be written is the registry's own test (RegistrySettleTest).
constexpr std::chrono::milliseconds kSettleTime{0};

class HotReloadTest : public ::testing::Test {
 public:  // the parameterised deploys below reach into it
  void SetUp() override {
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    loader_ = std::move(loader).value();
    Publish("Valid");
    auto registry = BackendRegistry::Create(
        {.backend_paths = std::vector{dir_.path()}, .loader = loader_, .settle_time = kSettleTime});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
    observer_ = registry_->AddObserver([this](const GenerationEvent& event) {
      std::lock_guard lock(events_mutex_);
      events_.push_back(event);
    });
  }

  // The reaper reports unloads after the test body; stop it from reaching members being destroyed.
  void TearDown() override {
    if (registry_ != nullptr)
      registry_->RemoveObserver(observer_);
  }

  std::unique_ptr<Runtime> MakeRuntime(RuntimeOptions options = {}) {
    options.registry = registry_;
    auto runtime = Runtime::Create(std::move(options));
    EXPECT_TRUE(runtime.ok()) << runtime.error().ToString();
    return std::move(runtime).value();
  }

  // The safe publish: a finished file under a temporary name, renamed over the backend's name.
  void Publish(std::string_view fixture, std::string_view as = "Test_Valid_backend.so") {
    const fs::path temporary = dir_ / ".incoming";
    testing::CopyFile(Fixture(fixture), temporary);
    fs::rename(temporary, dir_ / as);
  }

  float Offset(Runtime& runtime, NetworkId network) {
    return testing::ExecuteOffset(runtime, network);
  }

  uint64_t ActiveGeneration(std::string_view id = "TestValid") {
    return registry_->Describe(id).value().active_generation;
  }

  std::vector<GenerationEvent> Events(GenerationEvent::Kind kind) {
    std::lock_guard lock(events_mutex_);
    std::vector<GenerationEvent> matching;
    for (const auto& event : events_) {
      if (event.kind == kind)
        matching.push_back(event);
    }
    return matching;
  }

  TempDir shadow_root_;
  TempDir dir_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
  std::mutex events_mutex_;
  std::vector<GenerationEvent> events_;
  uint64_t observer_ = 0;
};

TEST_F(HotReloadTest, UnchangedDirectoryChangesNothing) {
  const uint64_t first = ActiveGeneration();
  auto rescan = registry_->Rescan();
  EXPECT_TRUE(rescan.outcomes.empty());
  EXPECT_FALSE(rescan.retry_soon);
  EXPECT_EQ(ActiveGeneration(), first);
  EXPECT_THAT(rescan.watch_directories, ::testing::Contains(dir_.path()));
}

TEST_F(HotReloadTest, NewFileBecomesActiveAndNetworksMigrate) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
  const uint64_t old_generation = ActiveGeneration();

  Publish("ValidNext");
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kActivated) << rescan.outcomes[0].message;
  EXPECT_EQ(rescan.outcomes[0].backend_id, "TestValid");
  const uint64_t new_generation = ActiveGeneration();
  EXPECT_GT(new_generation, old_generation);

  EXPECT_EQ(Offset(*runtime, network.value()), 2 * kNextOffset) << "both layers moved";
  for (const auto& layer : runtime->GetPlacement(network.value()).value())
    EXPECT_EQ(layer.generation, new_generation);
  EXPECT_EQ(runtime->Backend("TestValid")->generation_number(), new_generation);

  // The old generation drains and leaves the process with its shadow copy.
  loader_->WaitForUnloads();
  auto status = registry_->Describe("TestValid").value();
  ASSERT_GE(status.generations.size(), 2u);
  EXPECT_EQ(status.generations[0].generation, new_generation);
  EXPECT_EQ(status.generations[0].state, GenerationState::kActive);
  EXPECT_EQ(status.generations[0].release, "1.2.4");
  EXPECT_EQ(status.generations[1].generation, old_generation);
  EXPECT_EQ(status.generations[1].state, GenerationState::kUnloaded);
  ASSERT_TRUE(status.generations[1].drain_ms.has_value());
  EXPECT_GE(*status.generations[1].drain_ms, 0.0);
  EXPECT_EQ(
      testing::MappedGenerations("Test_Valid_backend.so"),
      std::set<std::string>{testing::GenerationMapping(new_generation, "Test_Valid_backend.so")});
  EXPECT_FALSE(
      testing::IsCodeMapped(testing::GenerationMapping(old_generation, "Test_Valid_backend.so")));
  EXPECT_EQ(Events(GenerationEvent::Kind::kActivated).size(), 1u);
  EXPECT_EQ(Events(GenerationEvent::Kind::kUnloaded).size(), 1u);
}

TEST_F(HotReloadTest, PinPolicyKeepsLoadedNetworksOnTheirGeneration) {
  auto runtime = MakeRuntime({.swap_policy = SwapPolicy::kPin});
  auto before = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(before.ok());
  Publish("ValidNext");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  auto after = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(Offset(*runtime, before.value()), 0.0f) << "loaded before the swap: stays";
  EXPECT_EQ(Offset(*runtime, after.value()), 2 * kNextOffset) << "loaded after: new generation";
  EXPECT_EQ(registry_->Describe("TestValid")->generations.at(1).state, GenerationState::kDraining)
      << "the pinned network holds the old generation";
  ASSERT_TRUE(runtime->UnloadNetwork(before.value()).ok());
  loader_->WaitForUnloads();
  EXPECT_EQ(registry_->Describe("TestValid")->generations.at(1).state, GenerationState::kUnloaded);
}

TEST_F(HotReloadTest, OptionsSurviveASwap) {
  auto runtime = MakeRuntime({.backend_options = {{"TestValid", {{"limit", int64_t{42}}}}}});
  ASSERT_TRUE(runtime->UpdateBackendOptions("TestValid", {{"label", std::string("kept")}}).ok());
  Publish("ValidNext");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  auto instance = runtime->Backend("TestValid");
  EXPECT_EQ(instance->generation_number(), ActiveGeneration());
  EXPECT_EQ(std::get<int64_t>(instance->GetOption("limit").value()), 42);
  EXPECT_EQ(std::get<std::string>(instance->GetOption("label").value()), "kept");
}

// The probes used to run on the registry's thread, neither admitted nor in the runtime's arena:
// they wait for a slot like any request (a while), then refuse the generation.
TEST_F(HotReloadTest, ValidationProbesAreAdmittedLikeRequests) {
  // A runtime that admits no request at all: its probes cannot run either.
  auto runtime = MakeRuntime(
      {.scheduler = {.max_in_flight = 0}, .swap_validation = {{"TestValid", {.tolerance = 0.5}}}});
  ASSERT_TRUE(runtime->LoadNetwork(testing::TwoLayerIdentityNetwork()).ok());
  const uint64_t serving = ActiveGeneration();

  Publish("Valid");
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kRejected);
  EXPECT_THAT(rescan.outcomes[0].message, HasSubstr("VALIDATION_FAILED"));
  EXPECT_THAT(rescan.outcomes[0].message,
              HasSubstr("found no free request slot for 2 s: overloaded: 0 requests in flight"));
  EXPECT_EQ(ActiveGeneration(), serving);
}

struct RejectedDeploy {
  std::string name;
  std::function<void(HotReloadTest&)> publish;
  LoadReason reason;
  std::string message;
};

class RejectedDeployTest : public HotReloadTest,
                           public ::testing::WithParamInterface<RejectedDeploy> {};

TEST_P(RejectedDeployTest, OldGenerationKeepsServing) {
  auto runtime = MakeRuntime({.swap_validation = {{"TestValid", {.tolerance = 0.5}}}});
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  const uint64_t serving = ActiveGeneration();

  GetParam().publish(*this);
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  const auto& outcome = rescan.outcomes[0];
  EXPECT_EQ(outcome.action, Action::kRejected);
  EXPECT_THAT(outcome.message, HasSubstr(std::string(ToString(GetParam().reason))));
  EXPECT_THAT(outcome.message, HasSubstr(GetParam().message));

  EXPECT_EQ(ActiveGeneration(), serving);
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
  auto status = registry_->Describe("TestValid").value();
  ASSERT_FALSE(status.rejected.empty());
  EXPECT_EQ(status.rejected[0].error.reason(), GetParam().reason);
  EXPECT_EQ(status.rejected[0].file, dir_ / "Test_Valid_backend.so");
  ASSERT_EQ(Events(GenerationEvent::Kind::kRejected).size(), 1u);
  EXPECT_EQ(Events(GenerationEvent::Kind::kRejected)[0].error.reason(), GetParam().reason);

  // An unchanged rejected file is not tried again at every rescan.
  EXPECT_TRUE(registry_->Rescan().outcomes.empty());
  EXPECT_EQ(Events(GenerationEvent::Kind::kRejected).size(), 1u);
  // A good file deployed afterwards is taken (one that passes validation: same results).
  Publish("Valid");
  EXPECT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    Deploys, RejectedDeployTest,
    ::testing::Values(RejectedDeploy{"BrokenFile",
                                     [](HotReloadTest& test) {
                                       testing::WriteFile(test.dir_ / ".incoming", "not a library");
                                       fs::rename(test.dir_ / ".incoming",
                                                  test.dir_ / "Test_Valid_backend.so");
                                     },
                                     LoadReason::kNotElf, "not an ELF"},
                      RejectedDeploy{"IncompatibleVersion",
                                     [](HotReloadTest& test) { test.Publish("ValidApi34"); },
                                     LoadReason::kApiIncompatible, "3.4"},
                      RejectedDeploy{"ThrowingFactory",
                                     [](HotReloadTest& test) { test.Publish("ValidThrowing"); },
                                     LoadReason::kFactoryFailed, "threw"},
                      RejectedDeploy{"NetworkPreparationFails",
                                     [](HotReloadTest& test) { test.Publish("ValidNoWorkloads"); },
                                     LoadReason::kPrepareFailed, "cannot create a workload"},
                      RejectedDeploy{"ValidationMismatch",
                                     [](HotReloadTest& test) { test.Publish("ValidNext"); },
                                     LoadReason::kValidationFailed, "differs by 2000"}),
    [](const auto& info) { return info.param.name; });

TEST_F(HotReloadTest, RollbackReturnsToThePreviousVersionAndBack) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  auto none = registry_->Rollback("TestValid");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.error().message(), HasSubstr("no previous generation"));

  Publish("ValidNext");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  loader_->WaitForUnloads();  // the old generation is gone from the process...
  EXPECT_EQ(Offset(*runtime, network.value()), 2 * kNextOffset);

  auto rolled_back = registry_->Rollback("TestValid");  // ...and still comes back
  ASSERT_TRUE(rolled_back.ok()) << rolled_back.error().ToString();
  EXPECT_EQ(ActiveGeneration(), rolled_back.value());
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
  EXPECT_TRUE(registry_->Rescan().outcomes.empty()) << "the newer file is not redeployed";

  auto forward = registry_->Rollback("TestValid");
  ASSERT_TRUE(forward.ok()) << forward.error().ToString();
  EXPECT_EQ(Offset(*runtime, network.value()), 2 * kNextOffset);

  EXPECT_EQ(registry_->Rollback("NoSuchBackend").error().code(), StatusCode::kNotFound);
}

TEST_F(HotReloadTest, PinnedIdIgnoresNewFilesUntilUnpinned) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  const uint64_t pinned = ActiveGeneration();
  ASSERT_TRUE(registry_->Pin("TestValid").ok());
  EXPECT_TRUE(registry_->Describe("TestValid")->pinned);

  Publish("ValidNext");
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kPinned);
  EXPECT_TRUE(registry_->Rescan().outcomes.empty()) << "said once per new file";
  auto reload = registry_->Reload("TestValid");
  ASSERT_TRUE(reload.ok());
  EXPECT_EQ(reload.value().action, Action::kPinned);
  EXPECT_EQ(ActiveGeneration(), pinned);
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);

  auto unpinned = registry_->Unpin("TestValid");
  ASSERT_TRUE(unpinned.ok());
  EXPECT_EQ(unpinned.value().action, Action::kActivated);
  EXPECT_EQ(Offset(*runtime, network.value()), 2 * kNextOffset);
  EXPECT_EQ(registry_->Pin("NoSuchBackend").code(), StatusCode::kNotFound);
}

TEST_F(HotReloadTest, ReloadSaysWhenNothingChanged) {
  auto unchanged = registry_->Reload("TestValid");
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(unchanged.value().action, Action::kUnchanged);
  Publish("ValidNext");
  auto reload = registry_->Reload("TestValid");
  ASSERT_TRUE(reload.ok());
  EXPECT_EQ(reload.value().action, Action::kActivated);
  EXPECT_EQ(registry_->Reload("Nope").error().code(), StatusCode::kNotFound);
}

TEST_F(HotReloadTest, DeletedFileMovesNetworksToTheNextPreference) {
  Publish("Other", "Test_Other_backend.so");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestValid", "TestOther"}});
  auto only_valid = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                         {.backend_preferences = {"TestValid"}});
  ASSERT_TRUE(network.ok() && only_valid.ok());
  EXPECT_EQ(runtime->GetPlacement(network.value()).value()[0].backend_id, "TestValid");

  fs::remove(dir_ / "Test_Valid_backend.so");
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kWithdrawn);
  EXPECT_EQ(runtime->GetPlacement(network.value()).value()[0].backend_id, "TestOther");
  EXPECT_EQ(Offset(*runtime, network.value()), 0.0f);
  // Nothing else supports it: it keeps serving on the withdrawn generation.
  EXPECT_EQ(runtime->GetPlacement(only_valid.value()).value()[0].backend_id, "TestValid");
  EXPECT_EQ(Offset(*runtime, only_valid.value()), 0.0f);
  EXPECT_EQ(runtime->Backend("TestValid"), nullptr) << "offered to no new load";
  EXPECT_FALSE(registry_->Find("TestValid").has_value());
  EXPECT_TRUE(registry_->Describe("TestValid")->withdrawn);
  auto refused = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestValid"}});
  EXPECT_EQ(refused.error().code(), StatusCode::kNotFound);

  Publish("ValidNext");  // the file comes back: what stayed on the withdrawn code moves to it
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  EXPECT_EQ(Offset(*runtime, only_valid.value()), 2 * kNextOffset);
  ASSERT_NE(runtime->Backend("TestValid"), nullptr);
  auto again = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                    {.backend_preferences = {"TestValid"}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Offset(*runtime, again.value()), 2 * kNextOffset);
}

TEST_F(HotReloadTest, FileOpenForWritingIsDeferredUntilClosed) {
  const fs::path file = dir_ / "Test_Valid_backend.so";
  testing::CopyFile(Fixture("ValidNext"), dir_ / ".incoming");
  fs::rename(dir_ / ".incoming", file);
  const int writer = open(file.c_str(), O_WRONLY | O_APPEND);  // a writer still at work
  ASSERT_GE(writer, 0);
  auto busy = registry_->Rescan();
  ASSERT_EQ(busy.outcomes.size(), 1u);
  EXPECT_EQ(busy.outcomes[0].action, Action::kDeferred);
  EXPECT_THAT(busy.outcomes[0].message, HasSubstr("open for writing"));
  EXPECT_TRUE(busy.retry_soon);
  EXPECT_TRUE(registry_->Describe("TestValid")->rejected.empty()) << "not a verdict on the file";
  close(writer);
  EXPECT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
}

TEST_F(HotReloadTest, NewBackendFileAddsAnIdToRunningRuntimes) {
  auto runtime = MakeRuntime();
  EXPECT_EQ(runtime->Backend("TestOther"), nullptr);
  Publish("Other", "Test_Other_backend.so");
  auto rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kActivated);
  ASSERT_NE(runtime->Backend("TestOther"), nullptr);
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestOther"}});
  ASSERT_TRUE(network.ok());
}

TEST_F(HotReloadTest, SwapsUnderLoadNeverFailOrMixGenerations) {
  auto runtime = MakeRuntime();
  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork());
  ASSERT_TRUE(network.ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> served{0}, failed{0}, mixed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&] {
      while (!stop.load()) {
        // NaN: the request failed or its elements disagree (layers on different generations).
        const float offset = testing::ExecuteOffset(*runtime, network.value());
        if (std::isnan(offset))
          ++failed;
        else if (offset != 0.0f && offset != 2 * kNextOffset)
          ++mixed;
        ++served;
      }
    });
  }
  constexpr int kSwaps = 200;
  for (int swap = 0; swap < kSwaps; ++swap) {
    Publish(swap % 2 == 0 ? "ValidNext" : "Valid");
    auto rescan = registry_->Rescan();
    ASSERT_EQ(rescan.outcomes.size(), 1u);
    ASSERT_EQ(rescan.outcomes[0].action, Action::kActivated) << rescan.outcomes[0].message;
  }
  stop = true;
  for (auto& client : clients)
    client.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_GT(served.load(), kSwaps);

  // All but the active generation left the process.
  loader_->WaitForUnloads();
  const uint64_t active = ActiveGeneration();
  EXPECT_EQ(testing::MappedGenerations("Test_Valid_backend.so"),
            std::set<std::string>{testing::GenerationMapping(active, "Test_Valid_backend.so")});
  EXPECT_EQ(loader_->stats().leaked.load(), 0u);
  auto status = registry_->Describe("TestValid").value();
  EXPECT_LE(status.generations.size(), 20u) << "history stays bounded";
}

// What the HookCallback fixture's hooks found when they asked the runtime calling them for its
// backend ids: a hook called under the runtime's lock (or under the coordinator's locks during a
// swap) waits for a lock its own caller holds.
struct HookProbes {
  Runtime* runtime = nullptr;
  std::mutex mutex;
  std::vector<std::string> calls;    // "AfterLoadNetwork 1", in order
  std::vector<std::string> blocked;  // the calls whose question got no answer in time
  std::atomic<int> pending{0};       // questions still waiting for their answer
  // What the thread's backend call record said in each hook: "IBackendContext::AfterLoadNetwork
  // TestHookCallback", and the generation.
  std::vector<std::string> recorded;
  std::vector<uint64_t> recorded_generations;
};
HookProbes* hook_probes = nullptr;

// Asks on another thread and waits at most 2 s, so that a hook called under the lock fails the
// test instead of deadlocking it; the question is answered once the hook returns.
void ProbeRuntimeFromHook(const char* hook, NetworkId network) {
  HookProbes& probes = *hook_probes;
  auto answered = std::make_shared<std::promise<void>>();
  std::future<void> answer = answered->get_future();
  probes.pending.fetch_add(1);
  std::thread([&probes, answered] {
    (void)probes.runtime->BackendIds();
    answered->set_value();
    probes.pending.fetch_sub(1);
  }).detach();
  const bool in_time = answer.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  const std::string call = std::string(hook) + " " + std::to_string(network);
  const BackendCallSite* site = CurrentBackendCall();
  std::lock_guard lock(probes.mutex);
  probes.calls.push_back(call);
  probes.recorded.push_back(site == nullptr ? "no record"
                                            : std::string(site->call) + " " + site->backend_id);
  probes.recorded_generations.push_back(site == nullptr ? 0 : site->generation);
  if (!in_time)
    probes.blocked.push_back(call);
}

// Backend code runs under no runtime lock: a hook may call the runtime's readers, whether the
// runtime calls it while loading or unloading a network or while a new generation takes over.
TEST_F(HotReloadTest, BackendHooksRunOutsideTheRuntimeLock) {
  Publish("HookCallback", "Test_HookCallback_backend.so");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  auto runtime = MakeRuntime();
  HookProbes probes;
  probes.runtime = runtime.get();
  hook_probes = &probes;
  const auto callback = reinterpret_cast<std::uintptr_t>(&ProbeRuntimeFromHook);
  ASSERT_EQ(setenv("FIXTURE_HOOK_CALLBACK", std::to_string(callback).c_str(), 1), 0);

  auto network = runtime->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                      {.backend_preferences = {"TestHookCallback"}});
  EXPECT_TRUE(network.ok()) << network.error().ToString();
  Publish("HookCallback", "Test_HookCallback_backend.so");  // a new generation takes over
  auto rescan = registry_->Rescan();
  EXPECT_EQ(rescan.outcomes.at(0).action, Action::kActivated);
  if (network.ok()) {
    EXPECT_TRUE(runtime->UnloadNetwork(network.value()).ok());
  }

  unsetenv("FIXTURE_HOOK_CALLBACK");
  EXPECT_TRUE(testing::WaitFor([&] { return probes.pending.load() == 0; }));
  hook_probes = nullptr;
  std::lock_guard lock(probes.mutex);
  EXPECT_THAT(probes.calls,
              ElementsAre("BeforeLoadNetwork 1", "AfterLoadNetwork 1",  // LoadNetwork
                          "BeforeLoadNetwork 1", "AfterLoadNetwork 1",  // the new generation
                          "BeforeUnloadNetwork 1", "AfterUnloadNetwork 1"));
  EXPECT_THAT(probes.blocked, IsEmpty()) << "hooks called under a lock the runtime needs";
  // A crash in a hook would name the hook and the generation whose context it is.
  EXPECT_THAT(probes.recorded, ElementsAre("IBackendContext::BeforeLoadNetwork TestHookCallback",
                                           "IBackendContext::AfterLoadNetwork TestHookCallback",
                                           "IBackendContext::BeforeLoadNetwork TestHookCallback",
                                           "IBackendContext::AfterLoadNetwork TestHookCallback",
                                           "IBackendContext::BeforeUnloadNetwork TestHookCallback",
                                           "IBackendContext::AfterUnloadNetwork TestHookCallback"));
  ASSERT_EQ(probes.recorded_generations.size(), 6u);
  EXPECT_GT(probes.recorded_generations[0], 0u);
  EXPECT_EQ(probes.recorded_generations[1], probes.recorded_generations[0]);
  EXPECT_GT(probes.recorded_generations[2], probes.recorded_generations[0]);  // the new one
  for (std::size_t i = 3; i < 6; ++i)
    EXPECT_EQ(probes.recorded_generations[i], probes.recorded_generations[2]) << i;
}

}  // namespace
}  // namespace backplane
