// The thread's backend call record and the fatal-signal reporter that reads it: scopes that set
// and restore it, and (in death tests: a child process that really dies) the one line a fatal
// signal leaves, the signal the process dies of, the alternate stack that reports a stack
// overflow, and the handler that was there before, which gets the signal after the line.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "backplane/core/backend_call_record.hpp"
#include "backplane/core/fatal_signal_reporter.hpp"
#include "sanitizer_build.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

using ::testing::KilledBySignal;

const BackendCallSite kExecuteSite{.backend_id = "TestCrash",
                                   .generation = 7,
                                   .sha256 = "ab12",
                                   .file = "/x/Test_Crash_backend.so",
                                   .call = "IWorkload::Execute"};

TEST(BackendCallRecordScopeTest, SetsAndRestoresTheThreadsCallAndModel) {
  EXPECT_EQ(CurrentBackendCall(), nullptr);
  EXPECT_EQ(CurrentModel(), nullptr);
  {
    const ScopedModelRun model("mnist");
    const ScopedBackendCall outer(kExecuteSite);
    ASSERT_NE(CurrentBackendCall(), nullptr);
    EXPECT_STREQ(CurrentBackendCall()->backend_id, "TestCrash");
    {
      // A hook that calls back into the host, which calls another backend.
      const ScopedBackendCall inner(
          BackendCallSite{.backend_id = "CpuRef", .call = "IBackend::GetOption"});
      EXPECT_STREQ(CurrentBackendCall()->backend_id, "CpuRef");
      EXPECT_STREQ(CurrentModel(), "mnist");
    }
    EXPECT_STREQ(CurrentBackendCall()->call, "IWorkload::Execute");
    // Another thread runs no call of this one's.
    std::thread([] { EXPECT_EQ(CurrentBackendCall(), nullptr); }).join();
  }
  EXPECT_EQ(CurrentBackendCall(), nullptr);
  EXPECT_EQ(CurrentModel(), nullptr);
}

TEST(BackendCallRecordScopeTest, IsRestoredWhenTheCallThrows) {
  try {
    const ScopedBackendCall call(kExecuteSite);
    throw std::runtime_error("from backend code");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(CurrentBackendCall(), nullptr);
}

// ---- Death tests: the child installs the reporter and dies ------------------------------------

// As `backplane serve` installs it: over the default disposition (a sanitizer build's own SEGV
// handler is set aside here; HandsTheSignalToTheHandlerThatWasThere is about that case).
void InstallOverTheDefault(const FatalSignalReporterOptions& options = {}) {
  for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    signal(signal_number, SIG_DFL);
  if (!InstallFatalSignalReporter(options).ok())
    _exit(99);
}

void WriteThroughNull() {
  // Both volatile: the compiler may neither drop the write nor turn it into a trap.
  volatile int* volatile null = nullptr;
  *null = 1;
}

// Never set: it keeps the compiler from proving the recursion endless.
volatile bool stop_recursing = false;

[[gnu::noinline]] int RecurseForever(int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  if (stop_recursing)
    return frame[0];
  return RecurseForever(depth + 1) + frame[0];
}

class FatalSignalReporterDeathTest : public ::testing::Test {
 protected:
  // The child re-runs the test binary for the one test: no threads of the parent's in it.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(FatalSignalReporterDeathTest, FaultOutsideBackendCodeSaysSo) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        WriteThroughNull();
      },
      KilledBySignal(SIGSEGV),
      "backplane: fatal signal SIGSEGV \\(11, address 0x0\\) on thread [^ ]+ \\(tid [0-9]+\\) "
      "outside backend code; the process ends\n");
}

TEST_F(FatalSignalReporterDeathTest, FaultInABackendCallNamesTheCallAndTheModel) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        const ScopedModelRun model("mnist");
        const ScopedBackendCall call(kExecuteSite);
        WriteThroughNull();
      },
      KilledBySignal(SIGSEGV),
      "backplane: fatal signal SIGSEGV \\(11, address 0x0\\) on thread [^ ]+ \\(tid [0-9]+\\) "
      "while backend TestCrash generation 7 \\(sha256 ab12, file /x/Test_Crash_backend.so\\) "
      "ran IWorkload::Execute for model mnist; the process ends\n");
}

TEST_F(FatalSignalReporterDeathTest, AbortIsReportedAndStillEndsTheProcessWithSigabrt) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        const ScopedBackendCall call(
            BackendCallSite{.backend_id = "CpuRef", .call = "IBackend::CreateWorkload"});
        std::abort();
      },
      KilledBySignal(SIGABRT),
      "backplane: fatal signal SIGABRT \\(6\\) on thread [^ ]+ \\(tid [0-9]+\\) while backend "
      "CpuRef \\(linked in\\) ran IBackend::CreateWorkload; the process ends\n");
}

// The signal raised by the process itself is not "sent by" anyone else.
TEST_F(FatalSignalReporterDeathTest, RaisedSignalIsReportedWithoutASender) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        raise(SIGBUS);
      },
      KilledBySignal(SIGBUS),
      "backplane: fatal signal SIGBUS \\(7\\) on thread [^ ]+ \\(tid [0-9]+\\) outside backend "
      "code; the process ends\n");
}

// The handler runs on the thread's alternate stack: the overflowed one has no room left.
TEST_F(FatalSignalReporterDeathTest, StackOverflowIsReportedOnTheAlternateStack) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        const ScopedBackendCall call(kExecuteSite);
        RecurseForever(0);
      },
      KilledBySignal(SIGSEGV),
      "backplane: fatal signal SIGSEGV \\(11, address 0x[0-9a-f]+\\) on thread .* ran "
      "IWorkload::Execute; the process ends\n");
}

// A thread that calls into a backend gets an alternate stack of its own on its first call.
TEST_F(FatalSignalReporterDeathTest, StackOverflowOnAnotherThreadIsReportedToo) {
  EXPECT_EXIT(
      {
        InstallOverTheDefault();
        std::thread([] {
          const ScopedBackendCall call(kExecuteSite);
          RecurseForever(0);
        }).join();
      },
      KilledBySignal(SIGSEGV),
      "fatal signal SIGSEGV .* ran IWorkload::Execute; the process ends\n");
}

void PreviousHandler(int) {
  constexpr char kText[] = "the previous handler ran\n";
  (void)!write(STDERR_FILENO, kText, sizeof kText - 1);
  _exit(42);
}

TEST_F(FatalSignalReporterDeathTest, HandsTheSignalToTheHandlerThatWasThere) {
  EXPECT_EXIT(
      {
        signal(SIGSEGV, PreviousHandler);
        if (!InstallFatalSignalReporter().ok())
          _exit(99);
        WriteThroughNull();
      },
      ::testing::ExitedWithCode(42),
      "fatal signal SIGSEGV \\(11, address 0x0\\).*outside backend code; the process "
      "ends\nthe previous handler ran\n");
}

#ifdef BACKPLANE_ASAN_BUILD
// AddressSanitizer's SEGV handler was there first: it still gets the fault, and reports it after
// the line.
TEST_F(FatalSignalReporterDeathTest, LeavesTheFaultToAddressSanitizerAfterTheLine) {
  EXPECT_DEATH(
      {
        if (!InstallFatalSignalReporter().ok())
          _exit(99);
        WriteThroughNull();
      },
      "fatal signal SIGSEGV \\(11, address 0x0\\).*outside backend code; the process ends\n"
      ".*AddressSanitizer: SEGV on unknown address");
}
#endif

TEST_F(FatalSignalReporterDeathTest, AppendsTheLineToTheLogFilesItWasGiven) {
  // Forked, not run again from the start: the child writes to the parent's temporary file.
  GTEST_FLAG_SET(death_test_style, "fast");
  testing::TempDir dir;
  const std::filesystem::path log = dir / "server.log";
  testing::WriteFile(log, "an earlier line\n");
  EXPECT_EXIT(
      {
        InstallOverTheDefault({.log_files = {log}});
        raise(SIGFPE);
      },
      KilledBySignal(SIGFPE), "fatal signal SIGFPE");
  EXPECT_THAT(testing::ReadFile(log),
              ::testing::MatchesRegex("an earlier line\nbackplane: fatal signal SIGFPE \\(8\\) "
                                      "on thread [^ ]+ \\(tid [0-9]+\\) outside backend code; the "
                                      "process ends\n"));
}

TEST(FatalSignalReporterTest, RefusesALogFileItCannotOpen) {
  Status status = InstallFatalSignalReporter({.log_files = {"/nonexistent/dir/server.log"}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("/nonexistent/dir/server.log"));
  EXPECT_FALSE(FatalSignalReporterInstalled());  // nothing was installed
}

}  // namespace
}  // namespace backplane
