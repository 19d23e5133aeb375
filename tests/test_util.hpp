// Helpers shared by the tests: fixture paths, temporary directories, the process's mappings.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>

#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "backplane/sdk/thread_limits.hpp"

namespace backplane::testing {

// The path of fixture Test_<name>_backend.so as the build left it.
std::filesystem::path Fixture(std::string_view name);
// The first-party CpuRef backend.
std::filesystem::path CpuRefBackend();

// A fresh directory under the system temp dir (mode 0700), removed with its content on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Copies `from` to `to` (mode 0755), replacing `to`.
void CopyFile(const std::filesystem::path& from, const std::filesystem::path& to);
void WriteFile(const std::filesystem::path& path, std::string_view content);
std::string ReadFile(const std::filesystem::path& path);

// Runs `command_line` with the shell and collects its standard output (redirect stderr in the
// command line to capture it too). exit_code is 128 + signal when it was killed.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command_line);

// The files of /proc/self/maps's executable mappings whose line contains `needle`: code of those
// files is still in the process. Read-only mappings do not count: sanitizer symbolizers map
// library files to read their debug info, which says nothing about the dynamic linker. `pid`: of
// another process (0: this one). A deleted file's " (deleted)" suffix is dropped.
std::set<std::string> MappedCode(std::string_view needle, pid_t pid = 0);
bool IsCodeMapped(std::string_view needle);  // !MappedCode(needle).empty()

// Threads of this process now (/proc/self/task), and once the count stopped changing (three polls
// 10 ms apart agree, 2 s at most): threads that are exiting (a joined thread's OpenMP workers end
// after it, asynchronously) leave /proc a little later.
int ProcessThreadCount();
int SettledThreadCount();

// How /proc/<pid>/maps names the code of generation `number` of the backend file `file_name`:
// the loader maps a sealed memory copy, "/memfd:backplane:<number>:<file name>".
std::string GenerationMapping(uint64_t number, std::string_view file_name);
// The generations of backend files named `file_name` whose code is mapped in this process
// (their GenerationMapping names); every backend file when `file_name` is empty.
std::set<std::string> MappedGenerations(std::string_view file_name = {});

// Skips a test that sets a thread-count option to `n` on a machine where fewer CPUs are usable:
// the host and CpuAcc refuse such a value (backplane/sdk/thread_limits.hpp).
#define BACKPLANE_REQUIRE_CPUS(n)                                              \
  do {                                                                         \
    const ::backplane::UsableCpus usable_cpus = ::backplane::FindUsableCpus(); \
    if (usable_cpus.count < (n)) {                                             \
      GTEST_SKIP() << "needs " << (n) << " usable CPUs, this process may use " \
                   << usable_cpus.Describe();                                  \
    }                                                                          \
  } while (false)

// Tests that need ../shared/data (or another path outside the build) call this first: without
// it they skip locally, and fail under CI (CI=true), where every test must run.
#define BACKPLANE_REQUIRE_PATH(path)                                                    \
  do {                                                                                  \
    if (!std::filesystem::exists(path)) {                                               \
      if (::backplane::testing::RunningInCi())                                          \
        FAIL() << (path) << " is missing (CI=true: tests never skip for missing data)"; \
      GTEST_SKIP() << (path) << " is missing";                                          \
    }                                                                                   \
  } while (false)
bool RunningInCi();

// The same for a program on PATH that a test drives (`package`: the Debian package that has it,
// installed by scripts/deps.sh, which the README's commands and CI run).
#define BACKPLANE_REQUIRE_COMMAND(command, package)                                               \
  do {                                                                                            \
    if (!::backplane::testing::HasCommand(command)) {                                             \
      if (::backplane::testing::RunningInCi())                                                    \
        FAIL() << (command) << " is not installed (Debian package " << (package)                  \
               << ", installed by scripts/deps.sh; CI=true: tests never skip for missing tools)"; \
      GTEST_SKIP() << (command) << " is not installed (Debian package " << (package) << ")";      \
    }                                                                                             \
  } while (false)
bool HasCommand(const std::string& command);  // `command -v <command>` succeeds

// A process's resident set (field "VmRSS") or its peak ("VmHWM") from /proc/<pid>/status, in
// bytes; nullopt when it cannot be read (a memory bound checked against nothing must fail the
// test, not pass it).
std::optional<int64_t> ProcStatusBytes(pid_t pid, const std::string& field);

// The seed of a randomised test: BACKPLANE_TEST_SEED when set (to replay a failure), else fresh.
// Every such test prints it with its failures.
uint64_t TestSeed();

// Polls `done` until it holds (true) or `deadline` passes (false): tests wait on deadlines, not
// sleeps.
template <typename Predicate>
bool WaitFor(Predicate done,
             std::chrono::steady_clock::duration deadline = std::chrono::seconds(20),
             std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

// What one module's logger (ModuleLogger("backplane.registry")…) writes while this lives, at
// `level` and above: the lines an operator reads, for tests that assert them. Put the logger back
// as it was on destruction. Thread-compatible: one capture of a logger at a time.
class LogCapture {
 public:
  explicit LogCapture(const std::string& logger,
                      spdlog::level::level_enum level = spdlog::level::info);
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::vector<std::string> Lines() const { return lines_->last_formatted(); }
  std::string Text() const;  // the lines, joined

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> lines_;
  spdlog::logger& log_;
  spdlog::level::level_enum level_;
};

}  // namespace backplane::testing
