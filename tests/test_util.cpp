#include "test_util.hpp"

#include <algorithm>
#include <cmath>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "backplane/core/logging.hpp"

namespace backplane::testing {
namespace fs = std::filesystem;

fs::path Fixture(std::string_view name) {
  fs::path path = fs::path(BACKPLANE_FIXTURE_DIR) / ("Test_" + std::string(name) + "_backend.so");
  if (!fs::exists(path))
    throw std::runtime_error("fixture not built: " + path.string());
  return path;
}

fs::path CpuRefBackend() {
  return BACKPLANE_CPU_REF;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "backplane-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code error;
  fs::remove_all(path_, error);
}

void CopyFile(const fs::path& from, const fs::path& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  fs::permissions(to, fs::perms(0755));
}

void WriteFile(const fs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

CommandResult RunCommand(const std::string& command_line) {
  CommandResult result;
  FILE* pipe = popen(command_line.c_str(), "r");
  if (pipe == nullptr)
    return result;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0)
    result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::set<std::string> MappedCode(std::string_view needle, pid_t pid) {
  std::set<std::string> mapped;
  std::ifstream maps(pid == 0 ? std::string("/proc/self/maps")
                              : "/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // "start-end perms offset dev inode path", perms like "r-xp".
    const auto perms = line.find(' ');
    const bool executable =
        perms != std::string::npos && line.size() > perms + 3 && line[perms + 3] == 'x';
    const auto path = line.find('/', perms == std::string::npos ? 0 : perms);
    if (executable && path != std::string::npos && line.find(needle) != std::string::npos)
      mapped.insert(line.substr(path, line.find(" (deleted)", path) - path));
  }
  return mapped;
}

bool IsCodeMapped(std::string_view needle) {
  return !MappedCode(needle).empty();
}

int ProcessThreadCount() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

int SettledThreadCount() {
  int count = ProcessThreadCount();
  for (int stable = 0, polls = 0; stable < 3 && polls < 200; ++polls) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int now = ProcessThreadCount();
    stable = now == count ? stable + 1 : 0;
    count = now;
  }
  return count;
}

std::string GenerationMapping(uint64_t number, std::string_view file_name) {
  std::string name = "/memfd:backplane:";  // appended: GCC 12 warns on "..." + std::string&&
  name += std::to_string(number);
  name += ':';
  name += file_name;
  return name;
}

std::set<std::string> MappedGenerations(std::string_view file_name) {
  std::set<std::string> generations;
  for (const std::string& mapped : MappedCode("/memfd:backplane:")) {
    if (file_name.empty() || mapped.ends_with(":" + std::string(file_name)))
      generations.insert(mapped);
  }
  return generations;
}

bool HasCommand(const std::string& command) {
  return RunCommand("command -v '" + command + "' >/dev/null 2>&1").exit_code == 0;
}

bool RunningInCi() {
  // As CI services set it ("true", "1", "TRUE"...): anything but empty, "0" or "false".
  const char* ci = std::getenv("CI");
  if (ci == nullptr)
    return false;
  std::string value(ci);
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return !value.empty() && value != "0" && value != "false";
}

std::optional<int64_t> ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with(field + ":"))
      return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return std::nullopt;
}

uint64_t TestSeed() {
  if (const char* fixed = std::getenv("BACKPLANE_TEST_SEED"))
    return std::stoull(fixed);
  return std::random_device()();
}

LogCapture::LogCapture(const std::string& logger, spdlog::level::level_enum level)
    : lines_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)),
      log_(ModuleLogger(logger)),
      level_(log_.level()) {
  log_.sinks().push_back(lines_);
  log_.set_level(level);
}

LogCapture::~LogCapture() {
  log_.sinks().pop_back();
  log_.set_level(level_);
}

std::string LogCapture::Text() const {
  std::string text;
  for (const auto& line : Lines())
    text += line;
  return text;
}

}  // namespace backplane::testing
