// The loader's stages, one fixture per outcome (seed 001 "Test Strategy", ArmNN's own cases).
#include "backplane/loader/loader.hpp"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane::loader {
namespace {

using testing::CopyFile;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::IsCodeMapped;
using testing::MakeLoader;
using testing::TempDir;
using testing::WriteFile;

Status LoadFailure(Loader& loader, const std::filesystem::path& file) {
  auto loaded = loader.Load(file);
  EXPECT_FALSE(loaded.ok()) << file << " loaded but should not";
  if (loaded.ok())
    return {LoadReason::kIoError, "loaded"};
  return loaded.error();
}

TEST(LoaderTest, LoadsValidBackend) {
  auto loader = MakeLoader();
  LoadTrace trace;
  auto loaded = loader->Load(Fixture("Valid"), &trace);
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  const GenerationInfo& info = loaded->info();
  EXPECT_EQ(info.backend_id, "TestValid");
  EXPECT_EQ(info.api_version, kBackendApiVersion);
  EXPECT_EQ(info.release, "1.2.3");  // from backplane_add_backend(... VERSION 1.2.3)
  EXPECT_EQ(info.real_path.filename(), "Test_Valid_backend.so.1.2.3");
  EXPECT_EQ(info.build_id.size(), 40u);  // GNU ld's SHA-1 build id, hex
  // The digest on record is the content's, as coreutils computes it.
  const auto sha256sum = testing::RunCommand("sha256sum " + Fixture("Valid").string());
  ASSERT_EQ(sha256sum.exit_code, 0);
  EXPECT_EQ(info.sha256, sha256sum.output.substr(0, 64));
  std::vector<std::string> stages;
  for (const auto& stage : trace.stages) {
    EXPECT_TRUE(stage.ok) << stage.name << ": " << stage.detail;
    stages.push_back(stage.name);
  }
  EXPECT_THAT(stages,
              ::testing::ElementsAre("file", "permissions", "copy", "digest", "elf", "dependencies",
                                     "dlopen", "entry points", "id", "version", "factory"));
}

TEST(LoaderTest, MapsTheSealedCopyNeverTheWatchedPath) {
  auto loader = MakeLoader();
  auto loaded = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(loaded.ok());
  const std::string mapped_as = loaded->info().mapped_as;
  EXPECT_TRUE(mapped_as.starts_with("/memfd:backplane:")) << mapped_as;
  EXPECT_TRUE(IsCodeMapped(mapped_as));
  EXPECT_FALSE(IsCodeMapped(BACKPLANE_FIXTURE_DIR));  // rule 1: never the path that may be replaced
  // Nothing of it on disk: the private directory holds no copy.
  EXPECT_TRUE(std::filesystem::is_empty(loader->shadow_directory().path()));
}

TEST(LoaderTest, UnloadsWhenTheLastLeaseGoes) {
  auto loader = MakeLoader();
  auto loaded = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(loaded.ok());
  GenerationLease lease = loaded.share();
  const auto shadow = lease->info().mapped_as;
  auto instance = loader->CreateInstance(lease);
  ASSERT_TRUE(instance.ok());
  loaded = Status{LoadReason::kIoError, "released"};
  lease.reset();
  loader->WaitForUnloads();
  EXPECT_TRUE(IsCodeMapped(shadow)) << "the instance still holds the generation";
  instance = Status{LoadReason::kIoError, "released"};
  loader->WaitForUnloads();
  EXPECT_FALSE(IsCodeMapped(shadow));
  EXPECT_EQ(loader->stats().unloaded.load(), 1u);
  EXPECT_EQ(loader->stats().leaked.load(), 0u);
  EXPECT_EQ(loader->stats().live.load(), 0u);
}

// Rule 3's check that the code really left: whatever keeps a library mapped after the reaper's
// dlclose (here a handle of the test's own, as a unique symbol or a thread_local destructor
// would), the generation is counted as leaked, not unloaded.
TEST(LoaderTest, ACopyStillMappedAfterDlcloseIsCountedAsLeaked) {
  auto loader = MakeLoader();
  auto loaded = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  GenerationLease lease = loaded.share();
  loaded = Status{LoadReason::kIoError, "released"};
  const std::string mapped_as = lease->info().mapped_as;
  void* held = dlopen(lease->image().ProcPath().c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(held, nullptr) << dlerror();
  lease.reset();
  loader->WaitForUnloads();
  EXPECT_TRUE(IsCodeMapped(mapped_as));
  EXPECT_EQ(loader->stats().leaked.load(), 1u);
  EXPECT_EQ(loader->stats().unloaded.load(), 0u);
  EXPECT_EQ(loader->stats().live.load(), 0u);
  dlclose(held);
  EXPECT_FALSE(IsCodeMapped(mapped_as)) << "the test's own handle was the last";
}

TEST(LoaderTest, SameUnchangedFileIsCodeMappedOnce) {
  auto loader = MakeLoader();
  auto first = loader->Load(Fixture("Valid"));
  auto second = loader->Load(Fixture("Valid"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.share(), second.share());
  EXPECT_EQ(loader->stats().loaded.load(), 1u);
}

// A file designated again while its generation still drains (a rollback by re-pointing a link)
// must become a new generation, never the draining one brought back.
TEST(LoaderTest, ReuseNeverMapsTheSameFileAsANewGeneration) {
  auto loader = MakeLoader();
  auto first = loader->Load(Fixture("Valid"));
  auto second = loader->Load(Fixture("Valid"), nullptr, Loader::Reuse::kNever);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->info().number, second->info().number);
  EXPECT_NE(first->info().mapped_as, second->info().mapped_as);
  EXPECT_EQ(first->info().sha256, second->info().sha256);
  EXPECT_EQ(loader->stats().loaded.load(), 2u);
}

TEST(LoaderTest, GenerationNumbersAreNeverReused) {
  auto loader = MakeLoader();
  std::set<uint64_t> numbers;
  for (int i = 0; i < 5; ++i) {
    auto loaded = loader->Load(Fixture("Valid"));
    ASSERT_TRUE(loaded.ok());
    EXPECT_TRUE(numbers.insert(loaded->info().number).second);
    loaded = Status{LoadReason::kIoError, "released"};
    loader->WaitForUnloads();  // unloaded, so the next load is a new generation
  }
}

TEST(LoaderTest, ApiVersionMatrixAgainstHost24) {
  auto loader = MakeLoader({.host_api = {2, 4}});
  for (const char* ok : {"Api24", "Api23"}) {
    auto loaded = loader->Load(Fixture(ok));
    EXPECT_TRUE(loaded.ok()) << ok << ": " << loaded.error().ToString();
  }
  for (const char* refused : {"Api25", "Api34", "Api14"}) {
    Status error = LoadFailure(*loader, Fixture(refused));
    EXPECT_EQ(error.reason(), LoadReason::kApiIncompatible) << refused;
    EXPECT_THAT(error.message(), HasSubstr("this host implements 2.4")) << refused;
  }
  EXPECT_THAT(LoadFailure(*loader, Fixture("Api25")).message(),
              HasSubstr("built against backend API 2.5"));
}

// SDK 1.1 made the minor rule real: the host loads every minor up to its own and refuses a newer
// one; a host still at 1.0 refuses a backend built against 1.1, whose code may rely on being
// offered subgraphs. SDK 1.2 (IHost), 1.3 (per-network options) and 1.4 (per-call options)
// follow the same rule.
TEST(LoaderTest, ApiVersionMatrixAgainstHost14Host13Host12AndHost10) {
  ASSERT_EQ(kBackendApiVersion, (BackendApiVersion{1, 4})) << "update this test with the SDK";
  auto host14 = MakeLoader();
  for (const char* ok : {"Api10", "Api11", "Api12", "Api13", "Api14", "Subgraph"}) {
    auto loaded = host14->Load(Fixture(ok));
    EXPECT_TRUE(loaded.ok()) << ok << ": " << loaded.error().ToString();
  }
  Status newer = LoadFailure(*host14, Fixture("Api15"));
  EXPECT_EQ(newer.reason(), LoadReason::kApiIncompatible);
  EXPECT_THAT(newer.message(), HasSubstr("built against backend API 1.5"));
  EXPECT_THAT(newer.message(), HasSubstr("this host implements 1.4"));

  auto host13 = MakeLoader({.host_api = {1, 3}});
  EXPECT_TRUE(host13->Load(Fixture("Api13")).ok());
  Status too_new_for_13 = LoadFailure(*host13, Fixture("Api14"));
  EXPECT_EQ(too_new_for_13.reason(), LoadReason::kApiIncompatible);
  EXPECT_THAT(too_new_for_13.message(), HasSubstr("built against backend API 1.4"));

  auto host12 = MakeLoader({.host_api = {1, 2}});
  EXPECT_TRUE(host12->Load(Fixture("Api12")).ok());
  Status too_new_for_12 = LoadFailure(*host12, Fixture("Subgraph"));
  EXPECT_EQ(too_new_for_12.reason(), LoadReason::kApiIncompatible);
  EXPECT_THAT(too_new_for_12.message(), HasSubstr("built against backend API 1.4"));

  auto host11 = MakeLoader({.host_api = {1, 1}});
  EXPECT_TRUE(host11->Load(Fixture("Api11")).ok());
  Status too_new = LoadFailure(*host11, Fixture("HostParallel"));
  EXPECT_EQ(too_new.reason(), LoadReason::kApiIncompatible);
  EXPECT_THAT(too_new.message(), HasSubstr("built against backend API 1.4"));

  auto host10 = MakeLoader({.host_api = {1, 0}});
  EXPECT_TRUE(host10->Load(Fixture("Api10")).ok());
  for (const auto& [refused, built] : {std::pair{"Api11", "1.1"}, std::pair{"Subgraph", "1.4"}}) {
    Status error = LoadFailure(*host10, Fixture(refused));
    EXPECT_EQ(error.reason(), LoadReason::kApiIncompatible) << refused;
    EXPECT_THAT(error.message(), HasSubstr(std::string("built against backend API ") + built))
        << refused;
    EXPECT_THAT(error.message(), HasSubstr("this host implements 1.0")) << refused;
  }
}

// Rule 5: a backend with TBB's task templates compiled in loads (it is confined, see the trap
// tests), with a warning at stage "threads" that names the evidence and the fix; one whose
// parallel work goes through the host's IHost gets none.
TEST(LoaderTest, WarnsAboutABackendThatSubmitsTbbTasksItself) {
  auto loader = MakeLoader();
  LoadTrace tbb;
  ASSERT_TRUE(loader->Load(Fixture("Tbb"), &tbb).ok());
  const auto threads = std::find_if(tbb.stages.begin(), tbb.stages.end(),
                                    [](const LoadStage& stage) { return stage.name == "threads"; });
  ASSERT_NE(threads, tbb.stages.end());
  EXPECT_TRUE(threads->ok);
  EXPECT_TRUE(threads->warning);
  EXPECT_THAT(threads->detail,
              HasSubstr("instantiates TBB's task templates itself (imports "
                        "tbb::detail::r1::spawn, tbb::detail::r1::execute_and_wait): "));
  EXPECT_THAT(threads->detail, HasSubstr("IHost"));

  LoadTrace host;
  ASSERT_TRUE(loader->Load(Fixture("HostParallel"), &host).ok());
  for (const LoadStage& stage : host.stages)
    EXPECT_FALSE(stage.warning) << stage.name << ": " << stage.detail;
}

// An instance says which API its code was built against, so that calls to methods added by a
// later minor go only to backends that have them.
TEST(LoaderTest, InstancesKnowTheMinorTheirCodeImplements) {
  auto loader = MakeLoader({.host_api = {2, 4}});
  auto older = loader->Load(Fixture("Api23"));
  ASSERT_TRUE(older.ok()) << older.error().ToString();
  auto instance = loader->CreateInstance(older.share());
  ASSERT_TRUE(instance.ok()) << instance.error().ToString();
  EXPECT_EQ(instance->api_version(), (BackendApiVersion{2, 3}));
  EXPECT_TRUE(instance->Implements({2, 0}));
  EXPECT_TRUE(instance->Implements({2, 3}));
  EXPECT_FALSE(instance->Implements({2, 4}));  // what 2.4 added is never called on it
  EXPECT_FALSE(instance->Implements({3, 0}));
}

TEST(LoaderTest, IsApiCompatibleFollowsTheArmnnRule) {
  EXPECT_TRUE(IsApiCompatible({2, 1}, {2, 4}));
  EXPECT_TRUE(IsApiCompatible({2, 4}, {2, 4}));
  EXPECT_FALSE(IsApiCompatible({2, 5}, {2, 4}));
  EXPECT_FALSE(IsApiCompatible({2, 4}, {1, 0}));
  EXPECT_FALSE(IsApiCompatible({2, 0}, {3, 0}));
}

TEST(LoaderTest, RefusesMissingOrMangledEntryPoints) {
  auto loader = MakeLoader();
  const std::pair<const char*, const char*> cases[] = {
      {"NoId", "GetBackendId"},
      {"NoVersion", "GetVersion"},
      {"NoFactory", "BackendFactory"},
      {"Mangled", "GetBackendId, GetVersion, BackendFactory"}};
  for (const auto& [fixture, missing] : cases) {
    Status error = LoadFailure(*loader, Fixture(fixture));
    EXPECT_EQ(error.reason(), LoadReason::kMissingEntryPoint) << fixture;
    EXPECT_THAT(error.message(),
                HasSubstr("does not export " + std::string(missing) + " with C linkage"))
        << fixture;
  }
}

TEST(LoaderTest, RefusesNullEmptyOrMalformedIds) {
  auto loader = MakeLoader();
  const std::pair<const char*, const char*> cases[] = {
      {"NullId", "GetBackendId returned null"},
      {"EmptyId", "returned an empty id"},
      {"BadId", "returned 'no spaces allowed'"},
      {"WrongInstanceId", "the instance says its id is 'SomethingElse'"}};
  for (const auto& [fixture, message] : cases) {
    Status error = LoadFailure(*loader, Fixture(fixture));
    EXPECT_EQ(error.reason(), LoadReason::kInvalidId) << fixture;
    EXPECT_THAT(error.message(), HasSubstr(message)) << fixture;
  }
}

TEST(LoaderTest, RefusesBrokenFactories) {
  auto loader = MakeLoader();
  Status null_factory = LoadFailure(*loader, Fixture("NullFactory"));
  EXPECT_EQ(null_factory.reason(), LoadReason::kFactoryFailed);
  EXPECT_THAT(null_factory.message(), HasSubstr("BackendFactory returned null"));
  Status throwing = LoadFailure(*loader, Fixture("ThrowingFactory"));
  EXPECT_EQ(throwing.reason(), LoadReason::kFactoryFailed);
  EXPECT_THAT(throwing.message(),
              HasSubstr("BackendFactory threw: fixture factory refuses to build"));
  // Through BACKPLANE_DEFINE_BACKEND: the macro's factory catches, GetBackendFactoryError tells.
  Status constructor = LoadFailure(*loader, Fixture("ThrowingConstructor"));
  EXPECT_EQ(constructor.reason(), LoadReason::kFactoryFailed);
  EXPECT_THAT(constructor.message(),
              HasSubstr("(backend TestThrowingConstructor): BackendFactory failed: cannot open "
                        "/dev/acme0: no such device"));
  loader->WaitForUnloads();
  EXPECT_FALSE(IsCodeMapped("-Test_NullFactory_backend.so"));
  EXPECT_FALSE(IsCodeMapped("-Test_ThrowingFactory_backend.so"));
  EXPECT_FALSE(IsCodeMapped("-Test_ThrowingConstructor_backend.so"));
}

TEST(LoaderTest, RefusesFilesThatAreNotSharedObjects) {
  auto loader = MakeLoader();
  TempDir dir;

  WriteFile(dir / "Test_Text_backend.so", "#!/bin/sh\necho I am not a library\n");
  Status text = LoadFailure(*loader, dir / "Test_Text_backend.so");
  EXPECT_EQ(text.reason(), LoadReason::kNotElf);
  EXPECT_THAT(text.message(), HasSubstr("Test_Text_backend.so"));

  WriteFile(dir / "Test_Empty_backend.so", "");
  EXPECT_EQ(LoadFailure(*loader, dir / "Test_Empty_backend.so").reason(), LoadReason::kNotElf);

  const std::string image = testing::ReadFile(Fixture("Valid"));
  WriteFile(dir / "Test_Half_backend.so", image.substr(0, image.size() / 2));
  EXPECT_EQ(LoadFailure(*loader, dir / "Test_Half_backend.so").reason(), LoadReason::kElfTruncated);

  std::string other_machine = image;
  other_machine[18] = static_cast<char>(183);  // e_machine = EM_AARCH64 (or x86-64 on AArch64)
  other_machine[19] = 0;
  if (image[18] == other_machine[18])
    other_machine[18] = 62;
  WriteFile(dir / "Test_Arm_backend.so", other_machine);
  EXPECT_EQ(LoadFailure(*loader, dir / "Test_Arm_backend.so").reason(), LoadReason::kWrongArch);

  std::filesystem::create_directory(dir / "Test_Dir_backend.so");
  EXPECT_EQ(LoadFailure(*loader, dir / "Test_Dir_backend.so").reason(), LoadReason::kNotRegular);

  EXPECT_EQ(LoadFailure(*loader, dir / "Test_Missing_backend.so").reason(), LoadReason::kNotFound);

  CopyFile(Fixture("Valid"), dir / "libvalid.so");
  EXPECT_EQ(LoadFailure(*loader, dir / "libvalid.so").reason(), LoadReason::kNameScheme);

  loader->WaitForUnloads();
  EXPECT_EQ(loader->stats().loaded.load(), 0u);  // none of them reached dlopen
}

TEST(LoaderTest, RefusesUnsafePermissionsUnlessAllowed) {
  TempDir dir;
  const auto file = dir / "Test_Valid_backend.so";
  CopyFile(Fixture("Valid"), file);
  std::filesystem::permissions(file, std::filesystem::perms(0775));
  auto strict = MakeLoader();
  Status group_writable = LoadFailure(*strict, file);
  EXPECT_EQ(group_writable.reason(), LoadReason::kUnsafePermissions);
  EXPECT_THAT(group_writable.message(), HasSubstr("writable by its group (mode 0775)"));

  auto relaxed = MakeLoader({.file_policy = {.allow_unsafe_permissions = true}});
  EXPECT_TRUE(relaxed->Load(file).ok());

  std::filesystem::permissions(file, std::filesystem::perms(0755));
  std::filesystem::permissions(dir.path(), std::filesystem::perms(0777));
  Status open_directory = LoadFailure(*strict, file);
  EXPECT_EQ(open_directory.reason(), LoadReason::kUnsafePermissions);
  EXPECT_THAT(open_directory.message(), HasSubstr("writable by others"));
  std::filesystem::permissions(dir.path(), std::filesystem::perms(01777));
  Status shared_directory = LoadFailure(*strict, file);
  EXPECT_EQ(shared_directory.reason(), LoadReason::kUnsafePermissions);
  EXPECT_THAT(shared_directory.message(), HasSubstr("is a shared directory (mode 1777)"));
  EXPECT_THAT(shared_directory.message(), ::testing::Not(HasSubstr("chmod")));
  std::filesystem::permissions(dir.path(), std::filesystem::perms(0700));

  if (geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(chown(file.c_str(), 4242, 4242), 0);
    Status foreign = LoadFailure(*strict, file);
    EXPECT_EQ(foreign.reason(), LoadReason::kUnsafePermissions);
    EXPECT_THAT(foreign.message(), HasSubstr("owned by uid 4242"));
  }
}

TEST(LoaderTest, ClearsStaleShadowsAtStart) {
  TempDir root;
  const auto base = root / ("backplane-" + std::to_string(geteuid()));
  std::filesystem::create_directory(base);
  std::filesystem::permissions(base, std::filesystem::perms(0700));
  // What an earlier process with our pid left, and what a dead process left.
  const auto own = base / std::to_string(getpid());
  const auto dead = base / "999999999";
  std::filesystem::create_directories(own);
  std::filesystem::create_directories(dead);
  WriteFile(own / "7-Test_Valid_backend.so", "stale");
  WriteFile(dead / "3-Test_Valid_backend.so", "stale");

  auto loader = MakeLoader({.shadow_root = root.path()});
  EXPECT_FALSE(std::filesystem::exists(own / "7-Test_Valid_backend.so"));
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_EQ(loader->shadow_directory().path(), own);
}

TEST(LoaderTest, RefusesAShadowRootSomeoneElseControls) {
  TempDir root;
  const auto base = root / ("backplane-" + std::to_string(geteuid()));
  std::filesystem::create_directory(base);
  std::filesystem::permissions(base, std::filesystem::perms(0777));
  auto loader = Loader::Create({.shadow_root = root.path()});
  ASSERT_FALSE(loader.ok());
  EXPECT_THAT(loader.error().message(), HasSubstr("is not a private directory"));
}

}  // namespace
}  // namespace backplane::loader
