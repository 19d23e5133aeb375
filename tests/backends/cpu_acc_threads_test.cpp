// CpuAcc's threads within what the machine can run: intra_op_threads bounded by the CPUs this
// process may use (affinity, cgroup CPU quota), OpenMP workers released when it is lowered, and a
// thread that cannot be created an error of the request instead of libgomp ending the process.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <thread>

#include "backplane/sdk/thread_limits.hpp"
#include "cpu_acc_test_util.hpp"
#include "sanitizer_build.hpp"

namespace backplane::cpu_acc_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using CpuAccThreadsTest = CpuAccTest;

constexpr std::string_view kOption = "intra_op_threads";

// The refusal CpuAcc and the host give for `value` with `cpus`.
std::string Refusal(const UsableCpus& cpus, int64_t value) {
  return "backend CpuAcc option 'intra_op_threads' must be 1 to " + std::to_string(cpus.count) +
         " (the CPUs this process may use: " + cpus.Describe() + "), got " + std::to_string(value);
}

int64_t CurrentThreads(loader::BackendInstance& backend) {
  return std::get<int64_t>(backend.GetOption(kOption).value());
}

// Sets intra_op_threads back to 1 at the end of a test, whatever it asserted.
class ResetThreads {
 public:
  explicit ResetThreads(loader::BackendInstance& backend) : backend_(backend) {}
  ~ResetThreads() {
    EXPECT_TRUE(backend_.UpdateOptions({{std::string(kOption), int64_t{1}}}).ok());
  }
  ResetThreads(const ResetThreads&) = delete;
  ResetThreads& operator=(const ResetThreads&) = delete;

 private:
  loader::BackendInstance& backend_;
};

TEST_F(CpuAccThreadsTest, RefusesMoreThreadsThanUsableCores) {
  const UsableCpus cpus = FindUsableCpus();
  Status refused = cpu_acc().UpdateOptions({{std::string(kOption), int64_t{1024}}});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), Refusal(cpus, 1024));
  EXPECT_THAT(refused.message(), HasSubstr(" by affinity, "));
  EXPECT_EQ(CurrentThreads(cpu_acc()), 1);
  // Through the runtime, as the admin API and `backplane run --option` set it: the host refuses
  // it before the backend sees it, in the same words.
  Status through_runtime =
      runtime().UpdateBackendOptions("CpuAcc", {{std::string(kOption), int64_t{1024}}});
  EXPECT_EQ(through_runtime.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(through_runtime.message(), Refusal(cpus, 1024));
  EXPECT_EQ(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{0}}}).message(),
            Refusal(cpus, 0));
  EXPECT_EQ(CurrentThreads(cpu_acc()), 1);
}

// The bound at its edge, on a thread whose affinity allows one CPU (the calling thread's mask is
// what counts), then on this thread with every CPU it may use.
TEST_F(CpuAccThreadsTest, BoundFollowsTheAffinityAtItsEdge) {
  ResetThreads reset(cpu_acc());
  std::thread([&] {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
    int first = 0;
    while (!CPU_ISSET(first, &mask))
      ++first;
    CPU_ZERO(&mask);
    CPU_SET(first, &mask);
    ASSERT_EQ(sched_setaffinity(0, sizeof mask, &mask), 0);
    const UsableCpus one = FindUsableCpus();
    ASSERT_EQ(one.by_affinity, 1);
    EXPECT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{1}}}).ok());
    Status two = cpu_acc().UpdateOptions({{std::string(kOption), int64_t{2}}});
    EXPECT_EQ(two.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(two.message(), Refusal(one, 2));
    EXPECT_THAT(two.message(), HasSubstr("must be 1 to 1 (the CPUs this process may use: 1 by "
                                         "affinity, "));
  }).join();
  const UsableCpus all = FindUsableCpus();
  EXPECT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{all.count}}}).ok());
  EXPECT_EQ(CurrentThreads(cpu_acc()), all.count);
  EXPECT_EQ(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{all.count + 1}}}).message(),
            Refusal(all, all.count + 1));
  EXPECT_EQ(CurrentThreads(cpu_acc()), all.count);
}

// An element-wise layer large enough to run on intra_op_threads threads (64K elements and more).
struct LargeAdd {
  static constexpr int64_t kElements = 2 * 64 * 32 * 32;
  OperatorDesc op;
  std::vector<float> a = std::vector<float>(kElements, 1.0f);
  std::vector<float> b = std::vector<float>(kElements, 2.0f);
  std::vector<float> sum = std::vector<float>(kElements, 0.0f);

  LargeAdd() {
    op.op_type = "Add";
    op.name = "large_add";
    const TensorInfo info{DataType::kFloat32, {2, 64, 32, 32}};
    op.inputs = {info, info};
    op.constant_inputs = {nullptr, nullptr};
    op.outputs = {info};
  }

  Status Execute(loader::Workload& workload) {
    const TensorInfo& info = op.outputs[0];
    const ConstTensorView inputs[] = {{info, a.data()}, {info, b.data()}};
    const TensorView outputs[] = {{info, sum.data()}};
    return workload.Execute(inputs, outputs);
  }

  // Compiles the layer with the current intra_op_threads and runs it once, on this thread.
  Status CompileAndRun(loader::BackendInstance& backend) {
    auto workload = backend.CreateWorkload(op);
    if (!workload.ok())
      return std::move(workload).error();
    BACKPLANE_RETURN_IF_ERROR(Execute(*workload.value()));
    return sum[0] == 3.0f && sum[kElements - 1] == 3.0f ? Status::Ok() : Internal("wrong sum");
  }
};

// Waits until `done(threads of this process)`, or 5 s: exiting threads leave /proc
// asynchronously. Returns the last count.
int AwaitThreads(const std::function<bool(int)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int count = testing::ProcessThreadCount();
  while (!done(count) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    count = testing::ProcessThreadCount();
  }
  return count;
}

// libgomp keeps a pool of workers per thread that started a team, and a team of one never
// touches it: before the fix, threads that had computed on 2 kept their workers after the option
// went back to 1. Now each releases its pool when it next runs CpuAcc code.
TEST_F(CpuAccThreadsTest, LoweringReleasesTheThreads) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads under a sanitizer";
#endif
  const UsableCpus cpus = FindUsableCpus();
  if (cpus.count < 2)
    GTEST_SKIP() << "one usable CPU: intra_op_threads cannot exceed 1 here";
  ResetThreads reset(cpu_acc());
  constexpr int kCallers = 4;
  const int workers = kCallers * (cpus.count - 1);  // each caller's team: itself and these
  std::barrier phase(kCallers + 1);
  std::atomic<int> failed{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      LargeAdd mine;
      phase.arrive_and_wait();  // 1: compute with intra_op_threads at the most
      if (!mine.CompileAndRun(cpu_acc()).ok())
        failed.fetch_add(1);
      phase.arrive_and_wait();
      phase.arrive_and_wait();  // 2: compute again with 1
      if (!mine.CompileAndRun(cpu_acc()).ok())
        failed.fetch_add(1);
      phase.arrive_and_wait();
      phase.arrive_and_wait();  // 3: stop
    });
  }
  const int idle = testing::SettledThreadCount();  // the callers exist, idle
  ASSERT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{cpus.count}}}).ok());
  phase.arrive_and_wait();
  phase.arrive_and_wait();
  const int raised = AwaitThreads([&](int count) { return count >= idle + workers; });
  EXPECT_GE(raised, idle + workers) << "each caller's team has its workers";

  ASSERT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{1}}}).ok());
  phase.arrive_and_wait();
  phase.arrive_and_wait();
  const int lowered = AwaitThreads([&](int count) { return count <= idle; });
  EXPECT_LE(lowered, idle) << "from " << raised << " threads with " << cpus.count
                           << ": the callers' workers are gone";
  phase.arrive_and_wait();
  for (auto& caller : callers)
    caller.join();
  EXPECT_EQ(failed.load(), 0);
}

// SDK 1.3: networks on one instance prepared with intra_op_threads of their own run with them
// and compute the same; the instance's value does not change. Seen in a compiled run's placement
// notes and in the process's threads: a caller's team of one starts no worker, its team of two
// one. When the two-thread network goes (unloaded, or re-prepared with 1) no option is lowered,
// and yet the caller's worker is released (TeamSizes in cpu_acc_backend.cpp).
TEST_F(CpuAccThreadsTest, NetworksOnOneInstanceRunWithTheirOwnThreadCounts) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads under a sanitizer";
#endif
  if (FindUsableCpus().count < 2)
    GTEST_SKIP() << "one usable CPU: intra_op_threads cannot exceed 1 here";
  ASSERT_EQ(CurrentThreads(cpu_acc()), 1);
  auto network = [](int64_t threads) {
    return BackendOptions{{std::string(kOption), threads}, {"batch_split", std::string("never")}};
  };

  // A convolution far above the two-thread threshold (1 MFLOP), compiled twice.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> weight(-0.5f, 0.5f);
  FloatTensor w{{16, 16, 3, 3}, std::vector<float>(16 * 16 * 3 * 3)};
  for (float& value : w.values)
    value = weight(rng);
  TestGraph graph;
  graph.AddInput("x", {2, 16, 28, 28}, rng);
  graph.AddConstant("w", std::move(w));
  graph.AddLayer("Conv", "conv", {"x", "w"}, {"y"}, {{2, 16, 26, 26}},
                 {{"kernel_shape", std::vector<int64_t>{3, 3}}});
  graph.AddLayer("Relu", "relu", {"y"}, {"z"}, {{2, 16, 26, 26}});
  graph.MarkOutput("z");
  std::vector<std::string> notes_one, notes_two;
  auto one = graph.RunCompiled(cpu_acc(), &notes_one, network(1));
  auto two = graph.RunCompiled(cpu_acc(), &notes_two, network(2));
  ASSERT_TRUE(one.ok()) << one.error().ToString();
  ASSERT_TRUE(two.ok()) << two.error().ToString();
  ASSERT_FALSE(notes_one.empty());
  ASSERT_FALSE(notes_two.empty());
  EXPECT_THAT(notes_one[0], ::testing::Not(HasSubstr("thread")));  // one thread names no count
  EXPECT_THAT(notes_two[0], HasSubstr("on 2 threads"));
  std::string mismatch;
  EXPECT_TRUE(AllClose(two->at("z").values, one->at("z").values, &mismatch)) << mismatch;

  // One layer per network, run by one caller thread, which starts its teams.
  LargeAdd single, pair;
  auto on_one = cpu_acc().CreateWorkload(single.op, network(1));
  auto on_two = cpu_acc().CreateWorkload(pair.op, network(2));
  ASSERT_TRUE(on_one.ok()) << on_one.error().ToString();
  ASSERT_TRUE(on_two.ok()) << on_two.error().ToString();
  EXPECT_EQ(CurrentThreads(cpu_acc()), 1) << "a network's value is its own";
  std::barrier phase(2);
  Status ran_one, ran_two, ran_one_again;
  std::thread caller([&] {
    phase.arrive_and_wait();  // 1: a team of one
    ran_one = single.Execute(*on_one.value());
    phase.arrive_and_wait();
    phase.arrive_and_wait();  // 2: a team of two
    ran_two = pair.Execute(*on_two.value());
    phase.arrive_and_wait();
    phase.arrive_and_wait();  // 3: a team of one, the two-thread network gone
    ran_one_again = single.Execute(*on_one.value());
    phase.arrive_and_wait();
    phase.arrive_and_wait();  // 4: stop (a thread's workers leave with it)
  });
  const int idle = testing::SettledThreadCount();  // the caller exists, idle
  phase.arrive_and_wait();
  phase.arrive_and_wait();
  EXPECT_LE(testing::SettledThreadCount(), idle) << "a team of one starts no worker";
  phase.arrive_and_wait();
  phase.arrive_and_wait();
  const int raised = AwaitThreads([&](int count) { return count >= idle + 1; });
  EXPECT_GE(raised, idle + 1) << "a team of two: the caller and one worker";
  on_two.value().reset();
  phase.arrive_and_wait();
  phase.arrive_and_wait();
  const int lowered = AwaitThreads([&](int count) { return count <= idle; });
  EXPECT_LE(lowered, idle) << "from " << raised << " threads: the caller's worker is gone";
  phase.arrive_and_wait();
  caller.join();
  EXPECT_TRUE(ran_one.ok()) << ran_one.ToString();
  EXPECT_TRUE(ran_two.ok()) << ran_two.ToString();
  EXPECT_TRUE(ran_one_again.ok()) << ran_one_again.ToString();
  EXPECT_EQ(single.sum.back(), 3.0f);
  EXPECT_EQ(pair.sum, single.sum);
}

// A new cgroup in the first of `hierarchies` where this process may make one that has `file`
// (a controller's), removed when dropped; empty when there is none (not root, no such
// controller, a read-only /sys/fs/cgroup).
class TestCgroup {
 public:
  TestCgroup(std::initializer_list<fs::path> hierarchies, const std::string& file) {
    for (const fs::path& hierarchy : hierarchies) {
      std::error_code error;
      if (!fs::exists(hierarchy / "cgroup.procs", error))
        continue;
      const fs::path candidate =
          hierarchy / ("backplane-threads-test-" + std::to_string(getpid()) + "-" + file);
      if (::mkdir(candidate.c_str(), 0755) != 0)
        continue;
      if (fs::exists(candidate / file, error)) {
        path_ = candidate;
        return;
      }
      ::rmdir(candidate.c_str());
    }
  }
  ~TestCgroup() {
    if (!path_.empty())
      ::rmdir(path_.c_str());
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Runs `child` in a child process forked from a fresh thread (which has no libgomp pool, whose
// workers the child would not have) and returns its exit status; the child runs no assertion.
int RunInChild(const std::function<int()>& child) {
  pid_t pid = -1;
  std::thread([&] {
    pid = fork();
    if (pid == 0)
      _exit(child());
  }).join();
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid)
    return -1;
  return status;
}

bool WriteFile(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return written;
}

// libgomp ends the process when it cannot create a worker (gomp_fatal: "Thread creation
// failed"). In a child process held to its one thread by a pids cgroup, the request that would
// need a worker fails with kResourceExhausted instead, and once the limit allows the worker the
// same workload computes.
TEST_F(CpuAccThreadsTest, ThreadExhaustionIsAnErrorNotACrash) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads and fork under a sanitizer";
#endif
  const UsableCpus cpus = FindUsableCpus();
  if (cpus.count < 2)
    GTEST_SKIP() << "one usable CPU: intra_op_threads cannot exceed 1 here";
  TestCgroup group({"/sys/fs/cgroup", "/sys/fs/cgroup/pids"}, "pids.max");
  if (group.path().empty())
    GTEST_SKIP() << "no writable cgroup pids hierarchy here (needs root and a pids controller)";

  ResetThreads reset(cpu_acc());
  ASSERT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{2}}}).ok());
  LargeAdd add;
  auto workload = cpu_acc().CreateWorkload(add.op);  // compiled here, run in the child
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();

  enum Outcome { kPassed = 0, kNotMoved = 20, kRanWithoutWorker, kWrongError, kNotRaised, kNoSum };
  const int status = RunInChild([&]() -> int {
    if (!WriteFile(group.path() / "cgroup.procs", std::to_string(getpid())) ||
        !WriteFile(group.path() / "pids.max", "1")) {
      return kNotMoved;
    }
    Status refused = add.Execute(*workload.value());
    if (refused.ok())
      return kRanWithoutWorker;
    if (refused.code() != StatusCode::kResourceExhausted ||
        refused.message().find("a team of 2 OpenMP threads needs 1 more thread(s), and the "
                               "process may create 0 (pids.max 1 - pids.current 1 of " +
                               group.path().string() + "): refused") == std::string::npos) {
      return kWrongError;
    }
    if (!WriteFile(group.path() / "pids.max", "8"))
      return kNotRaised;
    return add.Execute(*workload.value()).ok() && add.sum[0] == 3.0f ? kPassed : kNoSum;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kPassed)
      << "1: libgomp ended the process; 20: not moved into " << group.path()
      << "; 21: ran without its worker; 22: another error; 23: limit not raised; 24: no sum";
}

// The same under RLIMIT_NPROC, which holds for users other than root: a child that became
// nobody with a limit of the threads that user has already gets the request's error; with the
// limit raised the workload computes.
TEST_F(CpuAccThreadsTest, ThreadExhaustionUnderRlimitNprocIsAnErrorNotACrash) {
#if defined(BACKPLANE_TSAN_BUILD) || defined(BACKPLANE_ASAN_BUILD)
  GTEST_SKIP() << "libgomp threads and fork under a sanitizer";
#endif
  if (FindUsableCpus().count < 2)
    GTEST_SKIP() << "one usable CPU: intra_op_threads cannot exceed 1 here";
  if (getuid() != 0)
    GTEST_SKIP() << "needs root to become another user";
  ResetThreads reset(cpu_acc());
  ASSERT_TRUE(cpu_acc().UpdateOptions({{std::string(kOption), int64_t{2}}}).ok());
  LargeAdd add;
  auto workload = cpu_acc().CreateWorkload(add.op);
  ASSERT_TRUE(workload.ok()) << workload.error().ToString();

  constexpr uid_t kNobody = 65534;
  enum Outcome { kPassed = 0, kNoUser = 20, kRanWithoutWorker, kWrongError, kNotRaised, kNoSum };
  const int status = RunInChild([&]() -> int {
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0)
      return kNoUser;
    const auto used = static_cast<rlim_t>(thread_limits_detail::ThreadsOfRealUser());
    rlimit limit{used, used + 8};
    if (setrlimit(RLIMIT_NPROC, &limit) != 0)
      return kNoUser;
    Status refused = add.Execute(*workload.value());
    if (refused.ok())
      return kRanWithoutWorker;
    if (refused.code() != StatusCode::kResourceExhausted ||
        refused.message().find("and the process may create 0 (RLIMIT_NPROC " +
                               std::to_string(used) + " - " + std::to_string(used) +
                               " threads of uid 65534)") == std::string::npos) {
      return kWrongError;
    }
    limit.rlim_cur = used + 8;
    if (setrlimit(RLIMIT_NPROC, &limit) != 0)
      return kNotRaised;
    return add.Execute(*workload.value()).ok() && add.sum[0] == 3.0f ? kPassed : kNoSum;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kPassed)
      << "1: libgomp ended the process; 20: could not become nobody with a limit; 21: ran "
         "without its worker; 22: another error; 23: limit not raised; 24: no sum";
}

// A cgroup CPU quota of one CPU bounds intra_op_threads as an affinity of one CPU does, and the
// refusal names the quota and its file (a child moved into a cpu cgroup: v2 cpu.max or v1
// cpu.cfs_quota_us).
TEST_F(CpuAccThreadsTest, BoundFollowsTheCgroupCpuQuota) {
  if (FindUsableCpus().by_affinity < 2)
    GTEST_SKIP() << "one CPU by affinity already";
  TestCgroup v2({"/sys/fs/cgroup"}, "cpu.max");
  TestCgroup v1({"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}, "cpu.cfs_quota_us");
  const TestCgroup& group = v2.path().empty() ? v1 : v2;
  if (group.path().empty())
    GTEST_SKIP() << "no writable cgroup cpu hierarchy here (needs root and a cpu controller)";
  const bool is_v2 = &group == &v2;
  if (is_v2) {
    ASSERT_TRUE(WriteFile(group.path() / "cpu.max", "100000 100000"));
  } else {
    ASSERT_TRUE(WriteFile(group.path() / "cpu.cfs_period_us", "100000"));
    ASSERT_TRUE(WriteFile(group.path() / "cpu.cfs_quota_us", "100000"));
  }
  const std::string quota = (is_v2 ? "cpu.max 100000/100000 of "
                                   : "cpu.cfs_quota_us/cpu.cfs_period_us 100000/100000 of ") +
                            group.path().string();

  ResetThreads reset(cpu_acc());
  enum Outcome { kPassed = 0, kNotMoved = 20, kNoQuota, kAccepted, kWrongMessage, kOneRefused };
  const int status = RunInChild([&]() -> int {
    if (!WriteFile(group.path() / "cgroup.procs", std::to_string(getpid())))
      return kNotMoved;
    const UsableCpus cpus = FindUsableCpus();
    if (cpus.count != 1 || cpus.by_quota != 1)
      return kNoQuota;
    Status two = cpu_acc().UpdateOptions({{std::string(kOption), int64_t{2}}});
    if (two.ok())
      return kAccepted;
    if (two.message() !=
        "backend CpuAcc option 'intra_op_threads' must be 1 to 1 (the CPUs this "
        "process may use: " +
            std::to_string(cpus.by_affinity) + " by affinity, 1 by the cgroup quota (" + quota +
            ")), got 2") {
      return kWrongMessage;
    }
    return cpu_acc().UpdateOptions({{std::string(kOption), int64_t{1}}}).ok() ? kPassed
                                                                              : kOneRefused;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kPassed)
      << "20: not moved into " << group.path() << "; 21: no quota seen; 22: 2 accepted; 23: "
      << "another message; 24: 1 refused";
}

}  // namespace
}  // namespace backplane::cpu_acc_test
