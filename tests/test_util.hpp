// Helpers shared by the tests: fixture paths, temporary directories, the process's mappings.
#pragma once

#include <filesystem>

#include <string>
#include <string_view>
#include "backplane/core/runtime.hpp"

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

// True when /proc/self/maps has an executable mapping whose path contains `needle`: code of that
// file is still in the process. Read-only mappings do not count: sanitizer symbolizers map
// library files to read their debug info, which says nothing about the dynamic linker.
bool IsCodeMapped(std::string_view needle);

// Hot reload: the fixture builds Valid and ValidNext run Identity adding 0 and 1000 per layer.
constexpr float kNextOffset = 1000.0f;
// x -> Identity -> h -> Identity -> y on FP32[4]. Two layers on one backend, so that a request
// that mixed generations would be off by exactly one offset.
Network TwoLayerIdentityNetwork();
// Executes `network` on an input of fives and returns by how much every output element exceeds
// it: 0 on Valid, 2 * kNextOffset on ValidNext; NaN when the request failed or elements differ.
float ExecuteOffset(Runtime& runtime, NetworkId network);

}  // namespace backplane::testing
