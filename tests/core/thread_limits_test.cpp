#include "backplane/sdk/thread_limits.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
namespace detail = thread_limits_detail;
using ::testing::ElementsAre;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// A hybrid host (v1 controllers beside an empty v2 hierarchy) and a container whose v1 pids
// hierarchy is bind-mounted from its own cgroup: every directory from the process's own up to
// the mount point, own first.
TEST(ThreadLimitsTest, FindsTheCgroupDirectoriesOfV1AndV2) {
  const std::string mountinfo =
      "30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n"
      "31 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:6 - cgroup cgroup rw,cpu,cpuacct\n"
      "32 24 0:28 /docker/abc /sys/fs/cgroup/pids rw shared:7 - cgroup cgroup rw,pids\n"
      "33 24 8:1 / / rw - ext4 /dev/sda1 rw\n";
  const auto mounts = detail::ParseMountInfo(mountinfo);
  ASSERT_EQ(mounts.size(), 3u);
  const std::string cgroup =
      "4:pids:/docker/abc/worker\n2:cpu,cpuacct:/docker/abc\n0::/system.slice/x.service\n";
  EXPECT_THAT(
      detail::CgroupDirs(cgroup, mounts, "cpu"),
      ElementsAre("/sys/fs/cgroup/cpu,cpuacct/docker/abc", "/sys/fs/cgroup/cpu,cpuacct/docker",
                  "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/unified/system.slice/x.service",
                  "/sys/fs/cgroup/unified/system.slice", "/sys/fs/cgroup/unified"));
  EXPECT_THAT(detail::CgroupDirs(cgroup, mounts, "pids"),
              ElementsAre("/sys/fs/cgroup/pids/worker", "/sys/fs/cgroup/pids",
                          "/sys/fs/cgroup/unified/system.slice/x.service",
                          "/sys/fs/cgroup/unified/system.slice", "/sys/fs/cgroup/unified"));
}

// The smallest quota of the ancestors counts, rounded up to whole CPUs; "max" and v1's -1 are
// none.
TEST(ThreadLimitsTest, QuotaIsTheSmallestOfTheAncestorsRoundedUp) {
  testing::TempDir dir;
  const fs::path own = dir / "a" / "b";
  Write(own / "cpu.max", "max 100000");
  Write(dir / "a" / "cpu.max", "250000 100000");
  Write(dir.path() / "cpu.cfs_quota_us", "-1");
  Write(dir.path() / "cpu.cfs_period_us", "100000");
  std::string source;
  EXPECT_EQ(detail::QuotaCpus({own, dir / "a", dir.path()}, &source), 3);
  EXPECT_EQ(source, "cpu.max 250000/100000 of " + (dir / "a").string());
  Write(dir.path() / "cpu.cfs_quota_us", "50000");  // half a CPU: one thread
  EXPECT_EQ(detail::QuotaCpus({own, dir / "a", dir.path()}, &source), 1);
  EXPECT_EQ(source, "cpu.cfs_quota_us/cpu.cfs_period_us 50000/100000 of " + dir.path().string());
  EXPECT_EQ(detail::QuotaCpus({own}, &source), 0);
}

TEST(ThreadLimitsTest, PidsHeadroomIsTheLeastOfTheAncestors) {
  testing::TempDir dir;
  const fs::path own = dir / "a";
  Write(own / "pids.max", "max");
  Write(own / "pids.current", "12");
  Write(dir.path() / "pids.max", "1500");
  Write(dir.path() / "pids.current", "1498");
  const ThreadHeadroom headroom = detail::PidsHeadroom({own, dir.path()});
  EXPECT_EQ(headroom.more, 2);
  EXPECT_EQ(headroom.limited_by, "pids.max 1500 - pids.current 1498 of " + dir.path().string());
  EXPECT_EQ(detail::PidsHeadroom({own}).more, ThreadHeadroom::kUnlimited);
}

TEST(ThreadLimitsTest, ThreadCountOptionsAreInt64sNamedThreads) {
  EXPECT_TRUE(IsThreadCountOption({"threads", OptionType::kInt64, int64_t{1}, ""}));
  EXPECT_TRUE(IsThreadCountOption({"intra_op_threads", OptionType::kInt64, int64_t{1}, ""}));
  EXPECT_FALSE(IsThreadCountOption({"_threads", OptionType::kInt64, int64_t{1}, ""}));
  EXPECT_FALSE(IsThreadCountOption({"threads", OptionType::kDouble, 1.0, ""}));
  EXPECT_FALSE(IsThreadCountOption({"threadsafe", OptionType::kInt64, int64_t{1}, ""}));
}

TEST(ThreadLimitsTest, RefusalNamesTheBoundAndWhereItComesFrom) {
  const UsableCpus cpus{.count = 2,
                        .by_affinity = 8,
                        .by_quota = 2,
                        .quota = "cpu.max 150000/100000 of /sys/fs/cgroup/box"};
  EXPECT_TRUE(CheckThreadCount("Acme", "threads", 2, cpus).ok());
  const Status refused = CheckThreadCount("Acme", "threads", 3, cpus);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "backend Acme option 'threads' must be 1 to 2 (the CPUs this process may use: 8 by "
            "affinity, 2 by the cgroup quota (cpu.max 150000/100000 of /sys/fs/cgroup/box)), "
            "got 3");
  const std::vector<OptionDescriptor> options{{"pool_threads", OptionType::kInt64, int64_t{1}, ""},
                                              {"limit", OptionType::kInt64, int64_t{1}, ""}};
  EXPECT_TRUE(CheckThreadCounts({{"limit", int64_t{4096}}}, options, "Acme").ok());
  EXPECT_TRUE(CheckThreadCounts({{"pool_threads", std::string("x")}}, options, "Acme").ok())
      << "a wrong type is the backend's to refuse";
  EXPECT_EQ(CheckThreadCounts({{"pool_threads", int64_t{0}}}, options, "Acme").code(),
            StatusCode::kInvalidArgument);
}

// This machine: at least one CPU, never more than the affinity allows.
TEST(ThreadLimitsTest, UsableCpusOfThisProcess) {
  const UsableCpus cpus = FindUsableCpus();
  EXPECT_GE(cpus.count, 1);
  EXPECT_LE(cpus.count, cpus.by_affinity);
  EXPECT_GE(FindThreadHeadroom().more, 0);
}

}  // namespace
}  // namespace backplane
