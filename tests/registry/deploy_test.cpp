// What a file in a backend directory means for the id it provides: versioned names, names that
// fail before opening, files still being written. A registry on a real directory with real
// fixture backends, no runtime.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "backplane/registry/backend_registry.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Action = DeployOutcome::Action;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    loader_ = std::move(loader).value();
  }

  void CreateRegistry(std::chrono::milliseconds settle_time = 0ms) {
    auto registry = BackendRegistry::Create(
        {.backend_paths = std::vector{dir_.path()}, .loader = loader_, .settle_time = settle_time});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
  }

  // The safe publish: a finished file under a temporary name, renamed over `as`.
  void Publish(std::string_view fixture, std::string_view as) {
    const fs::path temporary = dir_ / ".incoming";
    testing::CopyFile(Fixture(fixture), temporary);
    fs::rename(temporary, dir_ / as);
  }
  // `ln -sfn target name`: a new symlink renamed over the old one, atomically.
  void Retarget(std::string_view name, std::string_view target) {
    const fs::path temporary = dir_ / ".incoming-link";
    fs::create_symlink(target, temporary);
    fs::rename(temporary, dir_ / name);
  }

  BackendStatus Describe(std::string_view id = "TestValid") {
    return registry_->Describe(id).value();
  }
  std::string ActiveRelease(std::string_view id = "TestValid") {
    const BackendStatus status = Describe(id);
    for (const auto& generation : status.generations) {
      if (generation.generation == status.active_generation)
        return generation.release;
    }
    return "";
  }

  TempDir shadow_root_;
  TempDir dir_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
};

// Issue 10: writing X.so.2.0.N and then `ln -sfn X.so.2.0.N X.so` activated the new generation
// and, in the same scan, rejected the versioned file itself as DUPLICATE_ID.
TEST_F(DeployTest, VersionedSymlinkDeployIsOneBackendNeverADuplicate) {
  Publish("Valid", "Test_Valid_backend.so.2.0.1");
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.2.0.1");
  CreateRegistry();
  const uint64_t first = Describe().active_generation;
  ASSERT_NE(first, 0u);

  // The next version lands beside the served one: another version of the same backend.
  Publish("ValidNext", "Test_Valid_backend.so.2.0.2");
  RescanResult landed = registry_->Rescan();
  EXPECT_TRUE(landed.outcomes.empty())
      << ToString(landed.outcomes.at(0).action) << ": " << landed.outcomes.at(0).message;
  EXPECT_EQ(Describe().active_generation, first);

  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.2.0.2");
  RescanResult switched = registry_->Rescan();
  ASSERT_EQ(switched.outcomes.size(), 1u);
  EXPECT_EQ(switched.outcomes[0].action, Action::kActivated) << switched.outcomes[0].message;
  EXPECT_EQ(ActiveRelease(), "1.2.4");

  // And back, the old versioned file still on disk.
  Retarget("Test_Valid_backend.so", "Test_Valid_backend.so.2.0.1");
  ASSERT_EQ(registry_->Rescan().outcomes.size(), 1u);
  EXPECT_EQ(ActiveRelease(), "1.2.3");
  EXPECT_TRUE(registry_->Rejected().empty()) << registry_->Rejected().at(0).error.ToString();
  EXPECT_EQ(registry_->BackendIds(), std::vector<std::string>{"TestValid"});
}

// Issue 18: in the ldconfig layout (no unversioned name) re-pointing `.so.1` activated the file it
// was pointed away from, and a file designated again brought an old generation back to life under
// its old number, whose record then never reached `unloaded`.
TEST_F(DeployTest, RepointingTheSonameLinkServesItsTargetAsANewGenerationEachTime) {
  Publish("Valid", "Test_Valid_backend.so.1.0.0");
  Retarget("Test_Valid_backend.so.1", "Test_Valid_backend.so.1.0.0");
  CreateRegistry();
  ASSERT_EQ(ActiveRelease(), "1.2.3");
  Publish("ValidNext", "Test_Valid_backend.so.1.0.1");
  EXPECT_TRUE(registry_->Rescan().outcomes.empty()) << "a new version file alone changes nothing";

  std::vector<uint64_t> numbers{Describe().active_generation};
  // Held like a network or a request in flight holds it: every replaced generation drains while
  // the link is re-pointed back at its file.
  std::vector<loader::GenerationLease> draining{registry_->Find("TestValid")->generation};
  for (const auto& [target, release] : {std::pair{"Test_Valid_backend.so.1.0.1", "1.2.4"},
                                        {"Test_Valid_backend.so.1.0.0", "1.2.3"},
                                        {"Test_Valid_backend.so.1.0.1", "1.2.4"},
                                        {"Test_Valid_backend.so.1.0.0", "1.2.3"}}) {
    Retarget("Test_Valid_backend.so.1", target);
    const RescanResult result = registry_->Rescan();
    ASSERT_EQ(result.outcomes.size(), 1u) << "re-pointed at " << target;
    EXPECT_EQ(result.outcomes[0].action, Action::kActivated) << result.outcomes[0].message;
    EXPECT_EQ(ActiveRelease(), release) << "re-pointed at " << target;
    const GenerationStatus active = Describe().generations.front();
    EXPECT_EQ(active.resolved_file, fs::canonical(dir_ / target));
    EXPECT_EQ(active.sha256.size(), 64u);
    EXPECT_GT(active.generation, numbers.back()) << "a new generation, never an old one revived";
    numbers.push_back(active.generation);
    draining.push_back(registry_->Find("TestValid")->generation);
  }
  // Every replaced generation leaves the process once let go of, each recorded once.
  draining.clear();
  loader_->WaitForUnloads();
  const BackendStatus status = Describe();
  std::set<uint64_t> recorded;
  for (const auto& generation : status.generations) {
    EXPECT_TRUE(recorded.insert(generation.generation).second) << generation.generation;
    if (generation.generation != status.active_generation) {
      EXPECT_EQ(generation.state, GenerationState::kUnloaded) << generation.generation;
    }
  }
  EXPECT_EQ(recorded.size(), numbers.size());
  // The two builds are told apart by their digests, and equal builds share one.
  EXPECT_EQ(status.generations[0].sha256, status.generations[2].sha256);
  EXPECT_NE(status.generations[0].sha256, status.generations[1].sha256);
}

TEST_F(DeployTest, HighestVersionSpeaksWhenThereIsNoUnversionedName) {
  Publish("ValidNext", "Test_Valid_backend.so.1.10");  // 1.10 > 1.9: numbers, not text
  Publish("Valid", "Test_Valid_backend.so.1.9");
  CreateRegistry();
  EXPECT_EQ(ActiveRelease(), "1.2.4");
  EXPECT_TRUE(registry_->Rejected().empty());
  EXPECT_EQ(Describe().file, dir_ / "Test_Valid_backend.so");  // the family it follows
}

// Issue 10: renaming one of these over the served name withdrew the backend ("was deleted",
// active_generation 0); a deploy that fails any check must leave the serving generation as it
// was.
struct UnusableName {
  std::string name;
  std::function<void(const fs::path& at)> make;
  LoadReason reason;
  std::string message;
};

class UnusableNameTest : public DeployTest, public ::testing::WithParamInterface<UnusableName> {};

TEST_P(UnusableNameTest, KeepsTheServingGenerationAsItWas) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry();
  const uint64_t serving = Describe().active_generation;

  const fs::path incoming = dir_ / ".incoming";
  GetParam().make(incoming);
  fs::rename(incoming, dir_ / "Test_Valid_backend.so");
  RescanResult rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  const DeployOutcome& outcome = rescan.outcomes[0];
  EXPECT_EQ(outcome.action, Action::kRejected);
  EXPECT_EQ(outcome.backend_id, "TestValid");
  EXPECT_EQ(outcome.error.reason(), GetParam().reason);
  EXPECT_THAT(outcome.error.message(), HasSubstr(GetParam().message));

  const BackendStatus status = Describe();
  EXPECT_EQ(status.active_generation, serving);
  EXPECT_FALSE(status.withdrawn);
  EXPECT_TRUE(registry_->Find("TestValid").has_value());
  ASSERT_EQ(status.rejected.size(), 1u);
  EXPECT_EQ(status.rejected[0].error.reason(), GetParam().reason);
  EXPECT_TRUE(registry_->Rescan().outcomes.empty()) << "a rejection is said once";

  // A good file afterwards is deployed as usual.
  Publish("ValidNext", "Test_Valid_backend.so");
  RescanResult recovered = registry_->Rescan();
  ASSERT_EQ(recovered.outcomes.size(), 1u);
  EXPECT_EQ(recovered.outcomes[0].action, Action::kActivated) << recovered.outcomes[0].message;
}

INSTANTIATE_TEST_SUITE_P(
    Names, UnusableNameTest,
    ::testing::Values(
        UnusableName{"WorldWritable",
                     [](const fs::path& at) {
                       testing::CopyFile(Fixture("ValidNext"), at);
                       fs::permissions(at, fs::perms(0666));
                     },
                     LoadReason::kUnsafePermissions, "writable by others"},
        UnusableName{"OwnedByAnotherUser",
                     [](const fs::path& at) {
                       testing::CopyFile(Fixture("ValidNext"), at);
                       ASSERT_EQ(chown(at.c_str(), 4242, 4242), 0) << "the tests run as root";
                     },
                     LoadReason::kUnsafePermissions, "owned by"},
        UnusableName{"Fifo", [](const fs::path& at) { ASSERT_EQ(mkfifo(at.c_str(), 0644), 0); },
                     LoadReason::kNotRegular, "not a regular file"},
        UnusableName{"SymlinkToDevZero",
                     [](const fs::path& at) { fs::create_symlink("/dev/zero", at); },
                     LoadReason::kNotRegular, "not a regular file"},
        UnusableName{"DanglingSymlink",
                     [](const fs::path& at) { fs::create_symlink("nowhere.so", at); },
                     LoadReason::kNotFound, "dangling symlink"}),
    [](const auto& info) { return info.param.name; });

// Writes the first half of the Valid fixture to `file` in place, as a slow writer would.
void WriteHalf(const fs::path& file) {
  const std::string image = testing::ReadFile(Fixture("ValidNext"));
  testing::WriteFile(file, image.substr(0, image.size() / 2));
  fs::permissions(file, fs::perms(0755));
}

// Issue 10: a file still being written is a deferral, never a rejection, even when the writer
// closed it between chunks (which the lease probe cannot see).
TEST_F(DeployTest, IncompleteFileWrittenJustNowIsDeferredUntilItIsComplete) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry(/*settle_time=*/10s);
  const uint64_t serving = Describe().active_generation;

  WriteHalf(dir_ / "Test_Valid_backend.so");
  RescanResult partial = registry_->Rescan();
  ASSERT_EQ(partial.outcomes.size(), 1u);
  EXPECT_EQ(partial.outcomes[0].action, Action::kDeferred) << partial.outcomes[0].message;
  EXPECT_EQ(partial.outcomes[0].error.reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(partial.retry_soon);
  EXPECT_EQ(Describe().active_generation, serving);

  testing::WriteFile(dir_ / "Test_Valid_backend.so", testing::ReadFile(Fixture("ValidNext")));
  RescanResult complete = registry_->Rescan();
  ASSERT_EQ(complete.outcomes.size(), 1u);
  EXPECT_EQ(complete.outcomes[0].action, Action::kActivated) << complete.outcomes[0].message;
  EXPECT_TRUE(registry_->Rejected().empty()) << registry_->Rejected().at(0).error.ToString();
}

TEST_F(DeployTest, IncompleteFileLeftAloneIsRejectedOnceSettled) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry(/*settle_time=*/200ms);
  WriteHalf(dir_ / "Test_Valid_backend.so");
  EXPECT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kDeferred);

  std::this_thread::sleep_for(250ms);  // the settle time itself is what is tested
  RescanResult settled = registry_->Rescan();
  ASSERT_EQ(settled.outcomes.size(), 1u);
  EXPECT_EQ(settled.outcomes[0].action, Action::kRejected);
  EXPECT_EQ(settled.outcomes[0].error.reason(), LoadReason::kElfTruncated);
  EXPECT_NE(Describe().active_generation, 0u);
}

TEST_F(DeployTest, ExplicitReloadTakesTheFileAsItIs) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry(/*settle_time=*/10s);
  WriteHalf(dir_ / "Test_Valid_backend.so");
  auto reloaded = registry_->Reload("TestValid");
  ASSERT_TRUE(reloaded.ok()) << reloaded.error().ToString();
  EXPECT_EQ(reloaded->action, Action::kRejected);
  EXPECT_EQ(reloaded->error.reason(), LoadReason::kElfTruncated);
}

TEST_F(DeployTest, DeletedFileWithdrawsTheIdAndItsReturnRestoresIt) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry();
  fs::remove(dir_ / "Test_Valid_backend.so");
  RescanResult gone = registry_->Rescan();
  ASSERT_EQ(gone.outcomes.size(), 1u);
  EXPECT_EQ(gone.outcomes[0].action, Action::kWithdrawn);
  EXPECT_TRUE(Describe().withdrawn);
  EXPECT_FALSE(registry_->Find("TestValid").has_value());

  Publish("Valid", "Test_Valid_backend.so");
  EXPECT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  EXPECT_FALSE(Describe().withdrawn);
}

TEST_F(DeployTest, RollbackLoadsTheKeptCopyAsANewGenerationAndCleansUpAtTheEnd) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry();
  Publish("ValidNext", "Test_Valid_backend.so");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  const uint64_t next = Describe().active_generation;

  auto rolled_back = registry_->Rollback("TestValid");
  ASSERT_TRUE(rolled_back.ok()) << rolled_back.error().ToString();
  EXPECT_GT(*rolled_back, next);
  EXPECT_EQ(ActiveRelease(), "1.2.3");
  // The file on disk is still the one rolled back from: not loaded again until it changes.
  EXPECT_TRUE(registry_->Rescan().outcomes.empty());

  const fs::path shadows = loader_->shadow_directory().path();
  registry_.reset();
  loader_->WaitForUnloads();
  for (const auto& entry : fs::recursive_directory_iterator(shadows))
    ADD_FAILURE() << entry.path() << " is left in the shadow directory";
}

// The kept copy is judged again when it is loaded back, and must still be the build that served:
// a copy whose content changed since (another build of the same id, here) is refused, not served.
TEST_F(DeployTest, RollbackRefusesAKeptCopyWhoseContentChanged) {
  Publish("Valid", "Test_Valid_backend.so");
  CreateRegistry();
  Publish("ValidNext", "Test_Valid_backend.so");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  const uint64_t next = Describe().active_generation;

  std::vector<fs::path> kept;
  for (const auto& entry : fs::recursive_directory_iterator(loader_->shadow_directory().path())) {
    if (entry.is_regular_file() && entry.path().filename() == "Test_Valid_backend.so")
      kept.push_back(entry.path());
  }
  ASSERT_EQ(kept.size(), 1u) << "the copy kept for rollback";
  const fs::perms perms = fs::status(kept[0]).permissions();
  fs::remove(kept[0]);
  testing::CopyFile(Fixture("ValidNext"), kept[0]);
  fs::permissions(kept[0], perms);

  auto rolled_back = registry_->Rollback("TestValid");
  ASSERT_FALSE(rolled_back.ok()) << "rolled back to generation " << *rolled_back;
  EXPECT_EQ(rolled_back.error().code(), StatusCode::kInternal);
  EXPECT_THAT(rolled_back.error().message(),
              HasSubstr("the copy kept for rollback (" + kept[0].string() +
                        ") no longer has the content of "));
  EXPECT_EQ(Describe().active_generation, next);
  EXPECT_EQ(ActiveRelease(), "1.2.4");
}

}  // namespace
}  // namespace backplane
