// Hot reload through the real watcher: every way of putting a new version of a backend into its
// directory yields exactly one new generation, never a load of a partial file, while a client
// keeps executing. Deadlines instead of sleeps.
#include "backplane/registry/backend_reloader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using backplane::testing::Fixture;
using backplane::testing::kNextOffset;
using backplane::testing::TempDir;
using ::testing::HasSubstr;

using backplane::testing::WaitFor;  // 20 s deadlines

// A backend directory holding TestValid, a runtime serving a network on it, a watcher applying
// what lands in the directory, and a client executing all along.
class BackendReloaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backends_ = dir_ / "backends";
    fs::create_directory(backends_);
    testing::CopyFile(Fixture("Valid"), File());
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    ASSERT_TRUE(loader.ok());
    loader_ = std::move(loader).value();
    registry_ =
        BackendRegistry::Create({.backend_paths = std::vector{backends_}, .loader = loader_})
            .value();
    observer_ = registry_->AddObserver([this](const GenerationEvent& event) {
      if (event.kind == GenerationEvent::Kind::kActivated)
        ++activated_;
      if (event.kind == GenerationEvent::Kind::kRejected)
        ++rejected_;
      if (event.kind == GenerationEvent::Kind::kWithdrawn)
        ++withdrawn_;
    });
    runtime_ = Runtime::Create({.registry = registry_}).value();
    network_ = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork()).value();
    auto reloader = BackendReloader::Start(
        registry_, {.debounce = 50ms, .rescan_interval = 0ms, .poll_interval = 100ms});
    ASSERT_TRUE(reloader.ok()) << reloader.error().ToString();
    reloader_ = std::move(reloader).value();
    client_ = std::thread([this] {
      while (!stop_) {
        const float offset = Offset();
        if (offset != 0.0f && offset != 2 * kNextOffset)
          ++bad_responses_;
      }
    });
  }

  void TearDown() override {
    stop_ = true;
    if (client_.joinable())
      client_.join();
    if (registry_ != nullptr)  // the reaper reports unloads after the test body
      registry_->RemoveObserver(observer_);
    EXPECT_EQ(bad_responses_.load(), 0) << "a request failed or mixed generations";
  }

  fs::path File() const { return backends_ / "Test_Valid_backend.so"; }

  float Offset() { return testing::ExecuteOffset(*runtime_, network_); }

  // Waits until the new version serves, then makes sure that nothing else follows: one more
  // scan of the settled directory changes nothing.
  void ExpectExactlyOneNewGeneration() {
    EXPECT_TRUE(WaitFor([&] { return Offset() == 2 * kNextOffset; }))
        << "the new version never served";
    Settle();
    EXPECT_EQ(activated_.load(), 1) << "exactly one new generation";
    EXPECT_EQ(rejected_.load(), 0) << "a partial file must never be tried";
  }

  // Two scans asked for in turn: the second one certainly started after the directory settled.
  void Settle() {
    for (int round = 0; round < 2; ++round) {
      const uint64_t before = reloader_->stats().scans.load();
      reloader_->RescanNow();
      EXPECT_TRUE(WaitFor([&] { return reloader_->stats().scans.load() > before; }));
    }
  }

  TempDir dir_;
  TempDir shadow_root_;
  fs::path backends_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
  std::unique_ptr<Runtime> runtime_;
  NetworkId network_ = 0;
  std::unique_ptr<BackendReloader> reloader_;
  std::atomic<int> activated_{0}, rejected_{0}, withdrawn_{0}, bad_responses_{0};
  std::atomic<bool> stop_{false};
  std::thread client_;
  uint64_t observer_ = 0;
};

TEST_F(BackendReloaderTest, RenameOfAFinishedTempFile) {
  testing::CopyFile(Fixture("ValidNext"), backends_ / ".Test_Valid_backend.so.tmp");
  ASSERT_EQ(testing::RunCommand("mv " + (backends_ / ".Test_Valid_backend.so.tmp").string() + " " +
                                File().string())
                .exit_code,
            0);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, CopyOverTheExistingFile) {
  ASSERT_EQ(
      testing::RunCommand("cp " + Fixture("ValidNext").string() + " " + File().string()).exit_code,
      0);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, Install) {
  ASSERT_EQ(
      testing::RunCommand("install -m 755 " + Fixture("ValidNext").string() + " " + File().string())
          .exit_code,
      0);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, RetargetedVersionedSymlink) {
  // Start over with the layout operators use: name -> versions/<version>/name.
  const fs::path v1 = backends_ / "versions" / "1";
  const fs::path v2 = backends_ / "versions" / "2";
  fs::create_directories(v1);
  fs::create_directories(v2);
  fs::rename(File(), v1 / "Test_Valid_backend.so");
  fs::create_symlink(v1 / "Test_Valid_backend.so", File());
  Settle();  // same code under a new name: reloaded once as the symlink's target
  activated_ = 0;
  rejected_ = 0;

  testing::CopyFile(Fixture("ValidNext"), v2 / "Test_Valid_backend.so");
  ASSERT_EQ(testing::RunCommand("ln -sfn " + (v2 / "Test_Valid_backend.so").string() + " " +
                                File().string())
                .exit_code,
            0);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, SlowWriterInChunks) {
  const std::string content = testing::ReadFile(Fixture("ValidNext"));
  const int fd = open(File().c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  // Pauses longer than the debounce: scans happen while the file is half written.
  const std::size_t chunk = content.size() / 6 + 1;
  for (std::size_t at = 0; at < content.size(); at += chunk) {
    ASSERT_GT(write(fd, content.data() + at, std::min(chunk, content.size() - at)), 0);
    std::this_thread::sleep_for(120ms);
  }
  close(fd);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, PreallocatingWriterThatWritesTheTailFirst) {
  const std::string content = testing::ReadFile(Fixture("ValidNext"));
  const int fd = open(File().c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(posix_fallocate(fd, 0, static_cast<off_t>(content.size())), 0);
  const std::size_t half = content.size() / 2;
  ASSERT_GT(pwrite(fd, content.data() + half, content.size() - half, static_cast<off_t>(half)), 0);
  std::this_thread::sleep_for(200ms);  // full size, zeros at the front: must not be loaded
  ASSERT_GT(pwrite(fd, content.data(), half, 0), 0);
  close(fd);
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, DeletedFileIsWithdrawn) {
  fs::remove(File());
  EXPECT_TRUE(WaitFor([&] { return withdrawn_.load() == 1; }));
  EXPECT_FALSE(registry_->Find("TestValid").has_value());
  EXPECT_EQ(Offset(), 0.0f) << "loaded networks keep serving on the withdrawn generation";
}

TEST_F(BackendReloaderTest, DirectoryDeletedAndRecreated) {
  fs::remove_all(backends_);
  EXPECT_TRUE(WaitFor([&] { return withdrawn_.load() == 1; }));
  fs::create_directory(backends_);
  fs::permissions(backends_, fs::perms::owner_all);
  testing::CopyFile(Fixture("ValidNext"), backends_ / ".incoming");
  fs::rename(backends_ / ".incoming", File());
  ExpectExactlyOneNewGeneration();
  // Re-armed: a later change in the new directory is seen too.
  testing::CopyFile(Fixture("Valid"), backends_ / ".incoming");
  fs::rename(backends_ / ".incoming", File());
  EXPECT_TRUE(WaitFor([&] { return Offset() == 0.0f && activated_.load() == 2; }));
}

TEST_F(BackendReloaderTest, ThousandFilesAtOnce) {
  for (int i = 0; i < 1000; ++i)
    testing::WriteFile(backends_ / ("data-" + std::to_string(i) + ".bin"), "x");
  testing::CopyFile(Fixture("ValidNext"), backends_ / ".incoming");
  fs::rename(backends_ / ".incoming", File());
  ExpectExactlyOneNewGeneration();
}

TEST_F(BackendReloaderTest, BrokenDeployIsRejectedAndTheOldOneServes) {
  testing::WriteFile(backends_ / ".incoming",
                     "\x7f"
                     "ELF but not really");
  fs::rename(backends_ / ".incoming", File());
  // At least once: a scan that listed the old file and read the new one does not remember its
  // rejection (what it listed is gone), so the rename's own scan may report it again.
  EXPECT_TRUE(WaitFor([&] { return rejected_.load() >= 1; }));
  EXPECT_EQ(Offset(), 0.0f);
  const auto status = registry_->Describe("TestValid").value();
  ASSERT_FALSE(status.rejected.empty());
  EXPECT_EQ(status.rejected[0].file, File());
}

TEST_F(BackendReloaderTest, RegistryWithoutDirectoriesCannotBeWatched) {
  auto empty = BackendRegistry::Create({.dynamic_backends = false, .loader = loader_}).value();
  auto reloader = BackendReloader::Start(empty);
  ASSERT_FALSE(reloader.ok());
  EXPECT_EQ(reloader.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(reloader.error().message(), HasSubstr("at least one backend directory"));
}

}  // namespace
}  // namespace backplane
