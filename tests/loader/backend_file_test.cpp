// File names, discovery and backend paths (ArmNN's DynamicBackendUtils cases).
#include "backplane/loader/backend_file.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <set>

#include "test_util.hpp"

namespace backplane::loader {
namespace {

namespace fs = std::filesystem;
using testing::CopyFile;
using ::testing::ElementsAre;
using testing::Fixture;
using ::testing::HasSubstr;
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

// Issue 18: `X_backend.so.1 -> X_backend.so.1.0.1` beside 1.0.0, with no unversioned name, served
// 1.0.0 (the highest version once the link's own target was deduplicated away): every re-point
// activated the file the operator had just pointed away from.
TEST(BackendFileTest, TheSonameLinkSpeaksNotTheHighestLeftover) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1.0.0");
  CopyFile(Fixture("ValidNext"), dir / "Test_Valid_backend.so.1.0.1");
  fs::create_symlink("Test_Valid_backend.so.1.0.1", dir / "Test_Valid_backend.so.1");
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.1.0.0.1.0.7");  // an old leftover
  Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  ASSERT_EQ(discovery.files.size(), 1u);
  EXPECT_EQ(discovery.files[0].path, dir / "Test_Valid_backend.so.1");
  EXPECT_EQ(discovery.files[0].real_path, fs::canonical(dir / "Test_Valid_backend.so.1.0.1"));
  EXPECT_EQ(discovery.superseded.size(), 3u);

  // Rolled back by re-pointing the link.
  fs::remove(dir / "Test_Valid_backend.so.1");
  fs::create_symlink("Test_Valid_backend.so.1.0.0", dir / "Test_Valid_backend.so.1");
  discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  ASSERT_EQ(discovery.files.size(), 1u);
  EXPECT_EQ(discovery.files[0].real_path, fs::canonical(dir / "Test_Valid_backend.so.1.0.0"));
}

// A broken speaking name is a rejected deploy: a usable leftover is not tried in its place.
TEST(BackendFileTest, ADanglingSpeakingNameIsRejectedNotReplacedByALeftover) {
  TempDir dir;
  CopyFile(Fixture("Valid"), dir / "Test_Valid_backend.so.2.0.0");
  fs::create_symlink("Test_Valid_backend.so.2.0.1", dir / "Test_Valid_backend.so.2");
  Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
  EXPECT_TRUE(discovery.files.empty());
  ASSERT_EQ(discovery.rejected.size(), 1u);
  EXPECT_EQ(discovery.rejected[0].file, dir / "Test_Valid_backend.so.2");
  EXPECT_EQ(discovery.rejected[0].error.reason(), LoadReason::kNotFound);
}

// The rule as a specification, on seeded random layouts of one family: files and symlinks (to
// names that may not exist, to links, in loops) under names of every specificity. The expected
// outcome is computed here from the documented rule, independently of the loader.
TEST(BackendFileTest, DiscoveryFollowsTheResolutionRuleOnRandomLayouts) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  const std::vector<std::string> suffixes = {"",     ".1",     ".2",      ".10",    ".1.0",
                                             ".1.2", ".1.0.0", ".1.0.10", ".1.0.9", ".2.0.0.1"};
  auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(random);
  };
  for (int round = 0; round < 300; ++round) {
    TempDir dir;
    std::map<std::string, std::string> links;  // name -> target name
    std::set<std::string> files;
    for (const auto& suffix : suffixes) {
      const std::string name = "Test_Valid_backend.so" + suffix;
      switch (pick(4)) {
        case 0:
          break;  // absent
        case 1:
          testing::WriteFile(dir / name, name);
          files.insert(name);
          break;
        default: {
          const std::string target = "Test_Valid_backend.so" + suffixes[pick(suffixes.size())];
          fs::create_symlink(target, dir / name);
          links[name] = target;
        }
      }
    }
    // The least specific name present: fewest components, ties to the highest version.
    std::optional<std::string> speaking;
    for (const auto& suffix : suffixes) {
      const std::string name = "Test_Valid_backend.so" + suffix;
      if (!files.contains(name) && !links.contains(name))
        continue;
      const auto version = BackendFileVersion(name);
      if (!speaking) {
        speaking = name;
        continue;
      }
      const auto best = BackendFileVersion(*speaking);
      if (version.size() < best.size() || (version.size() == best.size() && version > best))
        speaking = name;
    }
    std::optional<std::string> resolved = speaking;
    for (int hops = 0; resolved && !files.contains(*resolved); ++hops) {
      auto link = links.find(*resolved);
      resolved = link == links.end() || hops > 40 ? std::nullopt
                                                  : std::optional<std::string>(link->second);
    }

    const Discovery discovery = DiscoverBackendFiles(std::vector{dir.path()}, {});
    SCOPED_TRACE("round " + std::to_string(round) + ", speaking " + speaking.value_or("none"));
    if (!speaking) {
      EXPECT_TRUE(discovery.files.empty() && discovery.rejected.empty());
    } else if (resolved) {
      ASSERT_EQ(discovery.files.size(), 1u);
      EXPECT_EQ(discovery.files[0].path, dir / *speaking);
      EXPECT_EQ(testing::ReadFile(discovery.files[0].real_path), *resolved);
    } else {
      EXPECT_TRUE(discovery.files.empty());
      ASSERT_EQ(discovery.rejected.size(), 1u);
      EXPECT_EQ(discovery.rejected[0].file, dir / *speaking);
    }
    EXPECT_EQ(discovery.superseded.size(), files.size() + links.size() - (speaking ? 1 : 0));
  }
}

TEST(BackendFileTest, VersionedNamesBelongToOneFamily) {
  EXPECT_EQ(BackendFamily("/b/Acme_Fast_backend.so.1.2.3"), fs::path("/b/Acme_Fast_backend.so"));
  EXPECT_EQ(BackendFamily("/b/Acme_Fast_backend.so"), fs::path("/b/Acme_Fast_backend.so"));
  EXPECT_NE(BackendFamily("/b/Acme_Fast_backend.so.1"), BackendFamily("/c/Acme_Fast_backend.so.1"));
  EXPECT_THAT(BackendFileVersion("Acme_Fast_backend.so.1.20.3"), ElementsAre(1, 20, 3));
  EXPECT_TRUE(BackendFileVersion("Acme_Fast_backend.so").empty());
  // Numerically, not as text: 2.0.10 is newer than 2.0.9, and 1.0 than 1.
  EXPECT_GT(BackendFileVersion("A_b_backend.so.2.0.10"),
            BackendFileVersion("A_b_backend.so.2.0.9"));
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
