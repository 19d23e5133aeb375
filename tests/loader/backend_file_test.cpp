// File names, discovery and backend paths (ArmNN's DynamicBackendUtils cases).
#include "backplane/loader/backend_file.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace backplane::loader {
namespace {

namespace fs = std::filesystem;
using testing::CopyFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Fixture;
using testing::TempDir;

TEST(BackendFileTest, AcceptsArmnnNames) {
  for (const char* name :
       {"Arm_GpuAcc_backend.so", "Arm_GpuAcc_backend.so.1", "Arm_GpuAcc_backend.so.1.2",
        "Arm_GpuAcc_backend.so.1.2.3", "Arm_GpuAcc_backend.so.10.1.27", "Arm123_GpuAcc_backend.so",
        "Arm_GpuAcc456_backend.so", "A_B_backend.so"}) {
    EXPECT_TRUE(IsBackendFileName(name)) << name;
  }
}

TEST(BackendFileTest, RejectsOtherNames) {
  for (const char* name : {"Arm_GpuAcc_backend.so.",
                           "Arm_GpuAcc_backend.so.1.",
                           "Arm_GpuAcc_backend.so..1",
                           "Arm_GpuAcc_backend.so.1..2",
                           "Arm,GpuAcc_backend.so",
                           "Arm_GpuAcc,_backend.so",
                           "Arm%GpuAcc_backend.so",
                           "_GpuAcc_backend.so",
                           "Arm__backend.so",
                           "Arm_GpuAcc.so",
                           "Arm_GpuAcc_backend",
                           "Arm_GpuAcc_backend.dll",
                           "Arm_GpuAcc_v1.2.so",
                           "Arm_GpuAcc_backend.so.a",
                           "Arm_Gpu_Acc_backend.so",
                           "libArm_GpuAcc_backend.so.x",
                           "",
                           "Arm_GpuAcc_backend.so.1.2.3.",
                           "Arm_GpuAcc_Backend.so",
                           ".Arm_GpuAcc_backend.so"}) {
    EXPECT_FALSE(IsBackendFileName(name)) << name;
  }
}

TEST(BackendFileTest, SplitsPathLists) {
  EXPECT_THAT(SplitPathList("/a:/b::/c:"), ElementsAre("/a", "/b", "/c"));
  EXPECT_TRUE(SplitPathList("").empty());
}

TEST(BackendFileTest, DropsInvalidDirectoriesAndKeepsOrder) {
  TempDir one, two;
  testing::WriteFile(one / "file", "x");
  const std::vector<fs::path> paths{two.path(), "/does/not/exist", one / "file", one.path()};
  EXPECT_THAT(ValidBackendDirectories(paths), ElementsAre(two.path(), one.path()));
}

TEST(BackendFileTest, DiscoveryFollowsSymlinksOncePerFileAndIgnoresOtherNames) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1.2.3");
  fs::create_symlink("Test_Valid_backend.so.1.2.3", dir / "Test_Valid_backend.so");
  fs::create_symlink("Test_Valid_backend.so.1.2.3", dir / "Test_Valid_backend.so.1");
  fs::create_symlink(Fixture("Other"), dir / "Test_Other_backend.so");  // into another directory
  fs::create_symlink(dir / "gone", dir / "Test_Dangling_backend.so");
  testing::WriteFile(dir / "README.txt", "not a backend");
  CopyFile(Fixture("Valid"), dir / "libsomething.so");

  Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  std::vector<std::string> names;
  for (const auto& file : discovery.files)
    names.push_back(file.path.filename().string());
  EXPECT_THAT(names, ElementsAre("Test_Other_backend.so", "Test_Valid_backend.so"));
  EXPECT_EQ(discovery.files[1].real_path, fs::canonical(dir / "Test_Valid_backend.so.1.2.3"));
  // A dangling name is a broken deploy, reported like any other unusable name.
  ASSERT_EQ(discovery.rejected.size(), 1u);
  EXPECT_EQ(discovery.rejected[0].file, dir / "Test_Dangling_backend.so");
  EXPECT_EQ(discovery.rejected[0].error.reason(), LoadReason::kNotFound);
  EXPECT_THAT(discovery.rejected[0].error.message(), HasSubstr("dangling symlink"));
}

TEST(BackendFileTest, DiscoveryKeepsOneNamePerFamily) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1.9");
  CopyFile(Fixture("ValidNext"), dir / "Test_Valid_backend.so.1.10");
  CopyFile(Fixture("Other"), dir / "Test_Other_backend.so.2");
  CopyFile(Fixture("Other"), dir / "Test_Other_backend.so");  // another file, unversioned
  Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  std::vector<std::string> names;
  for (const auto& file : discovery.files)
    names.push_back(file.path.filename().string());
  EXPECT_THAT(names, ElementsAre("Test_Other_backend.so", "Test_Valid_backend.so.1.10"));
  ASSERT_EQ(discovery.superseded.size(), 2u);
  EXPECT_EQ(discovery.superseded[0].file, dir / "Test_Other_backend.so.2");
  EXPECT_EQ(discovery.superseded[0].speaking, dir / "Test_Other_backend.so");
  EXPECT_EQ(discovery.superseded[1].file, dir / "Test_Valid_backend.so.1.9");
  EXPECT_EQ(discovery.superseded[1].speaking, dir / "Test_Valid_backend.so.1.10");
}

TEST(BackendFileTest, VersionedNamesBelongToOneFamily) {
  EXPECT_EQ(BackendFamily("/b/Acme_Fast_backend.so.1.2.3"), fs::path("/b/Acme_Fast_backend.so"));
  EXPECT_EQ(BackendFamily("/b/Acme_Fast_backend.so"), fs::path("/b/Acme_Fast_backend.so"));
  EXPECT_NE(BackendFamily("/b/Acme_Fast_backend.so.1"), BackendFamily("/c/Acme_Fast_backend.so.1"));
  EXPECT_THAT(BackendFileVersion("Acme_Fast_backend.so.1.20.3"), ElementsAre(1, 20, 3));
  EXPECT_TRUE(BackendFileVersion("Acme_Fast_backend.so").empty());
  // Numerically, not as text: 2.0.10 is newer than 2.0.9, and 1.0 than 1.
  EXPECT_GT(BackendFileVersion("A_b_backend.so.2.0.10"), BackendFileVersion("A_b_backend.so.2.0.9"));
  EXPECT_GT(BackendFileVersion("A_b_backend.so.1.0"), BackendFileVersion("A_b_backend.so.1"));
}

TEST(BackendFileTest, SameFileNameInTwoDirectoriesIsTwoFiles) {
  TempDir first, second;
  CopyFile(Fixture("Valid"), first / "Test_Valid_backend.so");
  CopyFile(Fixture("Other"), second / "Test_Valid_backend.so");
  Discovery discovery = DiscoverBackendFiles(std::vector{first.path(), second.path()}, {});
  ASSERT_EQ(discovery.files.size(), 2u);
  EXPECT_EQ(discovery.files[0].path.parent_path(), first.path());
  EXPECT_EQ(discovery.files[1].path.parent_path(), second.path());
}

TEST(BackendFileTest, DiscoveryReportsUnsafeFiles) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so");
  fs::permissions(dir / "Test_Valid_backend.so", fs::perms(0777));
  Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  EXPECT_TRUE(discovery.files.empty());
  ASSERT_EQ(discovery.rejected.size(), 1u);
  EXPECT_EQ(discovery.rejected[0].error.reason(), LoadReason::kUnsafePermissions);
}

TEST(BackendFileTest, ReasonCodesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(LoadReason::kLastReason); ++i) {
    const auto reason = static_cast<LoadReason>(i);
    EXPECT_EQ(ParseLoadReason(ToString(reason)), reason);
  }
  EXPECT_EQ(ParseLoadReason("NOPE"), std::nullopt);
}

}  // namespace
}  // namespace backplane::loader
