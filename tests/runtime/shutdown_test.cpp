// An embedder's orderly shutdown (issue 24, item 4): the generations a registry holds leave the
// process only after the registry and its runtimes are gone, on the reaper thread, where no
// observer hears of it any more. LiveGenerations, taken from the registry beforehand, waits for
// them; anything that still holds a generation keeps it from returning true.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

using testing::Fixture;
using testing::TempDir;

TEST(ShutdownTest, LiveGenerationsWaitsUntilEveryGenerationLeftTheProcess) {
  TempDir shadow_root, dir;
  testing::CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so");
  testing::CopyFile(Fixture("Other"), dir / "Test_Other_backend.so");
  // A loader of this test's own: the process-wide one counts other tests' generations too.
  auto loader = loader::Loader::Create({.shadow_root = shadow_root.path()});
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  auto created = BackendRegistry::Create(
      {.backend_paths = std::vector{dir.path()}, .loader = std::move(loader).value()});
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  std::shared_ptr<BackendRegistry> registry = std::move(created).value();
  const LiveGenerations live = registry->live_generations();
  EXPECT_EQ(live.count(), 2u);

  auto runtime = Runtime::Create({.registry = registry});
  ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
  auto network = runtime.value()->LoadNetwork(testing::TwoLayerIdentityNetwork(),
                                              {.backend_preferences = {"TestValid"}});
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  EXPECT_EQ(testing::ExecuteOffset(*runtime.value(), network.value()), 0.0f);
  // A handle kept by the embedder pins its generation past everything else.
  std::shared_ptr<loader::BackendInstance> kept = runtime.value()->Backend("TestValid");
  ASSERT_NE(kept, nullptr);

  std::unique_ptr<Runtime> owned = std::move(runtime).value();
  owned.reset();
  registry.reset();
  EXPECT_TRUE(testing::WaitFor([&] { return live.count() == 1; }))
      << "TestOther's leaves once its last owner, the registry, is gone; count " << live.count();
  EXPECT_FALSE(live.WaitForNone(std::chrono::milliseconds(200)))
      << "the kept instance holds TestValid's generation";
  EXPECT_EQ(live.count(), 1u);

  kept.reset();
  EXPECT_TRUE(live.WaitForNone(std::chrono::seconds(20)));
  EXPECT_EQ(live.count(), 0u);
}

}  // namespace
}  // namespace backplane
