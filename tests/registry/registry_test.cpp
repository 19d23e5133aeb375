// Registry: discovery, static and dynamic side by side, duplicates, rejected files kept.
#include "backplane/registry/backend_registry.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "backplane/core/logging.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;
using ::testing::UnorderedElementsAre;

class EchoBackend final : public IBackend {
 public:
  std::string_view GetId() const override { return "StaticEcho"; }
  Status IsSupported(const OperatorDesc&) const override { return Status::Ok(); }
  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc&) override {
    return Unimplemented("echo has no workloads");
  }
};

std::shared_ptr<BackendRegistry> MakeRegistry(std::vector<fs::path> paths) {
  auto registry = BackendRegistry::Create({.backend_paths = std::move(paths)});
  EXPECT_TRUE(registry.ok()) << registry.error().ToString();
  return std::move(registry).value();
}

std::vector<std::string> RejectedReasons(const BackendRegistry& registry) {
  std::vector<std::string> reasons;
  for (const auto& rejected : registry.Rejected()) {
    reasons.push_back(rejected.file.filename().string() + " " + std::string(rejected.error.name()));
  }
  return reasons;
}

TEST(RegistryTest, LoadsEveryGoodFileAndKeepsEveryRejectedOneWithItsReason) {
  TempDir dir;
  fs::create_symlink(Fixture("Valid"), dir / "Test_Valid_backend.so");
  fs::create_symlink(Fixture("Other"), dir / "Test_Other_backend.so");
  fs::create_symlink(Fixture("Unique"), dir / "Test_Unique_backend.so");
  fs::create_symlink(Fixture("Api34"), dir / "Test_Api34_backend.so");
  testing::WriteFile(dir / "Test_Text_backend.so", "text");
  fs::permissions(dir / "Test_Text_backend.so", fs::perms(0644));

  auto registry = MakeRegistry({dir.path()});
  EXPECT_THAT(registry->BackendIds(), UnorderedElementsAre("TestValid", "TestOther"));
  EXPECT_THAT(RejectedReasons(*registry),
              UnorderedElementsAre("Test_Unique_backend.so NOT_UNLOADABLE",
                                   "Test_Api34_backend.so API_INCOMPATIBLE",
                                   "Test_Text_backend.so NOT_ELF"));
  for (const auto& rejected : registry->Rejected())
    EXPECT_FALSE(rejected.error.message().empty());
}

TEST(RegistryTest, SecondFileWithAnIdAlreadyRegisteredIsRejectedFirstWins) {
  TempDir first, second;
  fs::create_symlink(Fixture("Valid"), first / "Test_Valid_backend.so");
  fs::create_symlink(Fixture("Duplicate"), second / "Test_Duplicate_backend.so");
  auto registry = MakeRegistry({first.path(), second.path()});
  EXPECT_THAT(registry->BackendIds(), ElementsAre("TestValid"));
  EXPECT_EQ(registry->Find("TestValid")->generation->info().file, first / "Test_Valid_backend.so");
  auto rejected = registry->Rejected();
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0].error.reason(), LoadReason::kDuplicateId);
  EXPECT_THAT(rejected[0].error.message(),
              HasSubstr("already registered from " + (first / "Test_Valid_backend.so").string()));
  registry->loader().WaitForUnloads();
  EXPECT_FALSE(testing::IsCodeMapped("-Test_Duplicate_backend.so")) << "the loser is unloaded";
}

TEST(RegistryTest, TheSameFileCannotBeLoadedTwice) {
  auto registry = MakeRegistry({});
  ASSERT_TRUE(registry->LoadFile(Fixture("Valid")).ok());
  auto again = registry->LoadFile(Fixture("Valid"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().reason(), LoadReason::kDuplicateId);
  EXPECT_THAT(again.error().message(), HasSubstr("from this very file already"));
}

TEST(RegistryTest, EmptyPathListDisablesDynamicLoading) {
  auto registry = MakeRegistry({});
  EXPECT_TRUE(registry->directories().empty());
  EXPECT_TRUE(registry->BackendIds().empty());

  TempDir dir;
  fs::create_symlink(Fixture("Valid"), dir / "Test_Valid_backend.so");
  auto disabled = BackendRegistry::Create(
      {.backend_paths = std::vector{dir.path()}, .dynamic_backends = false});
  ASSERT_TRUE(disabled.ok());
  EXPECT_TRUE(disabled->BackendIds().empty());
}

TEST(RegistryTest, InvalidPathsAreDroppedAndOrderKept) {
  TempDir first, second;
  auto registry = MakeRegistry({second.path(), "/no/such/dir", first.path()});
  EXPECT_THAT(registry->directories(), ElementsAre(second.path(), first.path()));
}

TEST(RegistryTest, RuntimeOverrideOfTheDefaultPaths) {
  TempDir dir;
  ASSERT_EQ(setenv("BACKPLANE_BACKEND_PATHS", (dir.path().string() + ":/x").c_str(), 1), 0);
  EXPECT_THAT(DefaultBackendPaths(), ElementsAre(dir.path(), "/x"));
  ASSERT_EQ(setenv("BACKPLANE_BACKEND_PATHS", "", 1), 0);
  EXPECT_TRUE(DefaultBackendPaths().empty()) << "set but empty disables dynamic loading";
  unsetenv("BACKPLANE_BACKEND_PATHS");
  // This test runs from the build tree's bin/: the build's backends, then the installation's.
  const std::vector<fs::path> defaults = DefaultBackendPaths();
  ASSERT_EQ(defaults.size(), 2u);
  EXPECT_TRUE(fs::equivalent(defaults[0], fs::path(BACKPLANE_CPU_REF).parent_path()));
  EXPECT_THAT(defaults[1].string(), ::testing::EndsWith("/backplane/backends"));
}

TEST(RegistryTest, StaticAndDynamicBackendsSideBySide) {
  auto registry = MakeRegistry({});
  auto factory = [] { return std::unique_ptr<IBackend>(std::make_unique<EchoBackend>()); };
  ASSERT_TRUE(registry->RegisterStatic("StaticEcho", factory).ok());
  ASSERT_TRUE(registry->LoadFile(Fixture("Valid")).ok());
  EXPECT_THAT(registry->BackendIds(), ElementsAre("StaticEcho", "TestValid"));
  EXPECT_TRUE(registry->Find("StaticEcho")->is_static());
  EXPECT_FALSE(registry->Find("TestValid")->is_static());

  auto instance = registry->CreateInstance("StaticEcho");
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ(instance->generation(), nullptr);
  EXPECT_EQ(instance->IsSupported({}).code(), StatusCode::kOk);
}

TEST(RegistryTest, RejectsEmptyAndDuplicateStaticIds) {
  auto registry = MakeRegistry({});
  auto factory = [] { return std::unique_ptr<IBackend>(std::make_unique<EchoBackend>()); };
  EXPECT_EQ(registry->RegisterStatic("", factory).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry->RegisterStatic("Echo", nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry->RegisterStatic("TestValid", factory).ok());
  EXPECT_EQ(registry->RegisterStatic("TestValid", factory).code(), StatusCode::kAlreadyExists);
  auto dynamic = registry->LoadFile(Fixture("Valid"));
  ASSERT_FALSE(dynamic.ok());
  EXPECT_EQ(dynamic.error().reason(), LoadReason::kDuplicateId);
  EXPECT_THAT(dynamic.error().message(), HasSubstr("a static (linked-in) backend"));
}

// A file that does not follow the naming scheme is said once, at info, naming the scheme; the
// deploy temporary names (hidden) are not.
TEST(RegistryTest, AMisnamedFileIsSaidOnceAtInfo) {
  const testing::LogCapture log("backplane.registry");
  TempDir dir;
  testing::CopyFile(Fixture("Valid"), dir / "acme-leaky.so");
  testing::WriteFile(dir / ".Acme_Leaky_backend.so.tmp", "a deploy in progress");
  auto registry = MakeRegistry({dir.path()});
  (void)registry->Rescan();
  (void)registry->Rescan();
  const std::vector<std::string> lines = log.Lines();
  std::vector<std::string> said;
  for (const std::string& line : lines) {
    if (line.find("acme-leaky.so") != std::string::npos || line.find(".tmp") != std::string::npos) {
      said.push_back(line);
    }
  }
  ASSERT_EQ(said.size(), 1u) << ::testing::PrintToString(said);
  EXPECT_THAT(said[0], HasSubstr("[info] ignoring " + (dir / "acme-leaky.so").string() +
                                 " in a backend directory: not named "
                                 "<vendor>_<name>_backend.so[.N...]"));
}

// `ln -sfn` makes its new link under a temporary name (coreutils: "CuXXXXXX") and renames it over
// the old one: a scan between the two sees a misnamed entry that no one chose. Said only when a
// second scan in a row still finds it, and the first asks for that second scan.
TEST(RegistryTest, AMisnamedNameGoneByTheNextScanIsNeverSaid) {
  const testing::LogCapture log("backplane.registry");
  TempDir dir;
  testing::CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1");
  fs::create_symlink("Test_Valid_backend.so.1", dir / "Test_Valid_backend.so");
  auto registry = MakeRegistry({dir.path()});
  EXPECT_FALSE(registry->Rescan().retry_soon);

  fs::create_symlink("Test_Valid_backend.so.1", dir / "CuK3xQ9a");
  EXPECT_TRUE(registry->Rescan().retry_soon);  // seen once: a second look is due
  fs::remove(dir / "CuK3xQ9a");
  EXPECT_FALSE(registry->Rescan().retry_soon);
  EXPECT_FALSE(registry->Rescan().retry_soon);
  const std::vector<std::string> lines = log.Lines();
  for (const std::string& line : lines)
    EXPECT_EQ(line.find("CuK3xQ9a"), std::string::npos) << line;
}

TEST(RegistryTest, UnknownIdIsNotFound) {
  auto registry = MakeRegistry({});
  auto instance = registry->CreateInstance("Nope");
  ASSERT_FALSE(instance.ok());
  EXPECT_EQ(instance.error().code(), StatusCode::kNotFound);
}

// Issue 10: the registry looked lineages up without its lock while RegisterStatic could grow the
// list. Run under ThreadSanitizer (the tsan preset) this is a data race report, not a flake.
TEST(RegistryTest, StaticRegistrationsDuringDeploysAreSafe) {
  TempDir dir;
  auto publish = [&](std::string_view fixture) {
    testing::CopyFile(Fixture(fixture), dir / ".incoming");
    fs::rename(dir / ".incoming", dir / "Test_Valid_backend.so");
  };
  publish("Valid");
  auto registry = MakeRegistry({dir.path()});
  auto factory = [] { return std::unique_ptr<IBackend>(std::make_unique<EchoBackend>()); };
  std::thread registering([&] {
    for (int i = 0; i < 200; ++i)
      EXPECT_TRUE(registry->RegisterStatic("Static" + std::to_string(i), factory).ok());
  });
  for (int i = 0; i < 20; ++i) {
    publish(i % 2 == 0 ? "ValidNext" : "Valid");
    const RescanResult rescan = registry->Rescan();
    ASSERT_EQ(rescan.outcomes.size(), 1u);
    EXPECT_EQ(rescan.outcomes[0].action, DeployOutcome::Action::kActivated)
        << rescan.outcomes[0].message;
  }
  registering.join();
  EXPECT_EQ(registry->BackendIds().size(), 201u);
}

}  // namespace
}  // namespace backplane
