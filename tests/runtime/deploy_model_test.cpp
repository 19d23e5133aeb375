// The resolution rule of docs/hot-reload.md as a specification: seeded random sequences of what
// operators do to a backend directory (rename onto a name, copy over, install, slow in-place
// writes, new versioned files, `ln -sfn` of any name to any version, removals, leftovers),
// applied to a real watched registry while a client executes. After each step settles, the
// active generation's content must be exactly what the rule designates, every replaced
// generation must leave the process, and no request may fail.
//
// BACKPLANE_DEPLOY_STEPS sets the number of steps (CI runs a bounded number; bench/deploy_model.sh
// runs thousands) and BACKPLANE_DEPLOY_SEED replays a sequence; the seed is printed on failure.
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backplane/loader/backend_file.hpp"
#include "backplane/registry/backend_reloader.hpp"
#include "backplane/runtime/runtime.hpp"
#include "runtime/swap_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using backplane::testing::Fixture;
using backplane::testing::TempDir;

constexpr std::string_view kFamily = "Test_Valid_backend.so";
// The names operators use: the unversioned name, SONAME-style links, full versions and a
// leftover of an earlier symlink deploy (".so.1.0.0.3").
constexpr std::string_view kSuffixes[] = {"", ".1", ".2", ".1.0.0", ".1.0.1", ".2.0.0", ".1.0.0.3"};
// Distinguishable builds of TestValid: each adds its own offset per layer.
constexpr std::string_view kBuilds[] = {"Valid", "ValidNext", "ValidBuild3", "ValidBuild4"};

std::string Sha256(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i)
    hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

// What the directory holds, as the test believes it: each name is a file with known content or
// a symlink to another name.
class DirectoryModel {
 public:
  struct Entry {
    std::optional<std::string> content;  // a regular file
    std::string target;                  // else a symlink to this name
  };

  std::map<std::string, Entry> entries;

  // The name the rule says speaks, computed here independently of the loader: fewest version
  // components, ties to the highest version.
  std::optional<std::string> Speaking() const {
    std::optional<std::string> best;
    std::vector<uint64_t> best_version;
    for (const auto& [name, entry] : entries) {
      std::vector<uint64_t> version;
      std::string_view rest = std::string_view(name).substr(kFamily.size());
      while (!rest.empty()) {
        rest.remove_prefix(1);
        const auto dot = rest.find('.');
        version.push_back(std::stoull(std::string(rest.substr(0, dot))));
        rest = dot == std::string_view::npos ? std::string_view() : rest.substr(dot);
      }
      const bool better = !best || version.size() < best_version.size() ||
                          (version.size() == best_version.size() && version > best_version);
      if (better) {
        best = name;
        best_version = version;
      }
    }
    return best;
  }

  // The regular file `name` leads to; nullopt when dangling or looping.
  std::optional<std::string> Resolve(std::string name) const {
    for (int hops = 0; hops < 40; ++hops) {
      auto it = entries.find(name);
      if (it == entries.end())
        return std::nullopt;
      if (it->second.content)
        return name;
      name = it->second.target;
    }
    return std::nullopt;
  }
};

// A directory holding only TestValid's family, a runtime serving a network on it, a watcher
// applying what lands there, and a client executing all along.
class DeployModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto build : kBuilds)
      builds_.push_back(testing::ReadFile(Fixture(build)));
    backends_ = dir_ / "backends";
    fs::create_directory(backends_);
    loader_ = loader::Loader::Create({.shadow_root = shadow_root_.path()}).value();
    registry_ =
        BackendRegistry::Create({.backend_paths = std::vector{backends_}, .loader = loader_})
            .value();
    auto reloader = BackendReloader::Start(
        registry_, {.debounce = 20ms, .rescan_interval = 0ms, .poll_interval = 100ms});
    ASSERT_TRUE(reloader.ok()) << reloader.error().ToString();
    reloader_ = std::move(reloader).value();
  }

  void TearDown() override {
    stop_ = true;
    if (client_.joinable())
      client_.join();
  }

  void StartClient() {
    client_ = std::thread([this] {
      while (!stop_) {
        const float offset = testing::ExecuteOffset(*runtime_, network_);
        ++requests_;
        if (std::isnan(offset))
          ++failed_requests_;
      }
    });
  }

  // A build's bytes made unique: loaders ignore what follows the ELF's last section, so every
  // write has a digest of its own, and a rewrite of the same build is still a different file.
  std::string Stamped(std::size_t build) {
    return builds_[build] + fmt::format("backplane-deploy-stamp-{:08}", ++stamps_);
  }

  fs::path Path(const std::string& name) const { return backends_ / name; }

  static void WriteAll(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = write(fd, bytes.data(), bytes.size());
      ASSERT_GT(n, 0) << std::strerror(errno);
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Write to a temporary name, fsync, rename into place (also how a new versioned file lands).
  void RenameOnto(const std::string& name, std::string content) {
    const fs::path temporary = Path(".incoming.tmp");
    const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    ASSERT_GE(fd, 0);
    WriteAll(fd, content);
    fsync(fd);
    close(fd);
    ASSERT_EQ(rename(temporary.c_str(), Path(name).c_str()), 0);
    model_.entries[name] = {std::move(content), ""};
  }

  // `cp new.so name`: rewrites the file the name leads to, in place, in one write or (a slow
  // writer) in chunks with pauses.
  void WriteInPlace(const std::string& name, std::string content, bool slowly) {
    const auto file = model_.Resolve(name);
    ASSERT_TRUE(file.has_value());
    const int fd = open(Path(name).c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::size_t chunk = slowly ? content.size() / 4 + 1 : content.size();
    for (std::size_t at = 0; at < content.size(); at += chunk) {
      WriteAll(fd, std::string_view(content).substr(at, chunk));
      if (slowly)
        std::this_thread::sleep_for(15ms);
    }
    close(fd);
    model_.entries[*file] = {std::move(content), ""};
  }

  // `install -m 755 new.so name`: removes the name, then writes a new file under it.
  void Install(const std::string& name, std::string content) {
    unlink(Path(name).c_str());
    const int fd = open(Path(name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    ASSERT_GE(fd, 0);
    WriteAll(fd, content);
    close(fd);
    model_.entries[name] = {std::move(content), ""};
  }

  // `ln -sfn target name`: a new link renamed over the name.
  void Link(const std::string& name, const std::string& target) {
    const fs::path temporary = Path(".link.tmp");
    unlink(temporary.c_str());
    ASSERT_EQ(symlink(target.c_str(), temporary.c_str()), 0);
    ASSERT_EQ(rename(temporary.c_str(), Path(name).c_str()), 0);
    model_.entries[name] = {std::nullopt, target};
  }

  void Remove(const std::string& name) {
    ASSERT_EQ(unlink(Path(name).c_str()), 0);
    model_.entries.erase(name);
  }

  // One random operator action; returns what it did, for the failure message.
  std::string RandomStep(std::mt19937_64& random) {
    auto pick = [&](std::size_t n) {
      return std::uniform_int_distribution<std::size_t>(0, n - 1)(random);
    };
    const std::string name =
        std::string(kFamily) + std::string(kSuffixes[pick(std::size(kSuffixes))]);
    const std::size_t build = pick(builds_.size());
    const bool leads_to_file = model_.Resolve(name).has_value();
    switch (pick(7)) {
      case 0:
        RenameOnto(name, Stamped(build));
        return "rename build " + std::to_string(build) + " onto " + name;
      case 1:
        if (!leads_to_file)
          break;
        WriteInPlace(name, Stamped(build), /*slowly=*/false);
        return "cp build " + std::to_string(build) + " over " + name;
      case 2:
        if (!leads_to_file)
          break;
        WriteInPlace(name, Stamped(build), /*slowly=*/true);
        return "slow in-place write of build " + std::to_string(build) + " to " + name;
      case 3:
        Install(name, Stamped(build));
        return "install build " + std::to_string(build) + " as " + name;
      case 4:
      case 5: {
        // Mostly at a name that exists; sometimes dangling, which the rule must reject.
        std::string target =
            std::string(kFamily) + std::string(kSuffixes[pick(std::size(kSuffixes))]);
        Link(name, target);
        return "ln -sfn " + target + " " + name;
      }
      case 6:
        if (!model_.entries.contains(name) || model_.entries.size() == 1)
          break;
        Remove(name);
        return "rm " + name;
    }
    RenameOnto(name, Stamped(build));
    return "rename build " + std::to_string(build) + " onto " + name;
  }

  // The content the rule designates: the speaking name's file, or what served before when that
  // name leads nowhere (a rejected deploy keeps the serving generation).
  std::optional<std::string> Designated() {
    if (const auto speaking = model_.Speaking()) {
      if (const auto file = model_.Resolve(*speaking))
        designated_ = Sha256(*model_.entries.at(*file).content);
    }
    return designated_;
  }

  std::optional<GenerationStatus> Active() const {
    const auto status = registry_->Describe("TestValid");
    if (!status)
      return std::nullopt;
    for (const auto& generation : status->generations) {
      if (generation.generation == status->active_generation &&
          generation.state == GenerationState::kActive)
        return generation;
    }
    return std::nullopt;
  }

  template <typename Predicate>
  static bool WaitFor(Predicate done) {
    return testing::WaitFor(done, 20s, 2ms);
  }

  // Nothing between loading and the end of its life but the active generation.
  std::string Unsettled() const {
    std::string unsettled;
    const BackendStatus status = *registry_->Describe("TestValid");
    for (const auto& generation : status.generations) {
      const bool over = generation.state == GenerationState::kActive ||
                        generation.state == GenerationState::kUnloaded ||
                        generation.state == GenerationState::kRejected;
      if (!over) {
        unsettled += fmt::format(" generation {} {} ({});", generation.generation,
                                 ToString(generation.state), generation.file.string());
      }
    }
    return unsettled;
  }

  TempDir dir_;
  TempDir shadow_root_;
  fs::path backends_;
  std::vector<std::string> builds_;
  uint64_t stamps_ = 0;
  DirectoryModel model_;
  std::optional<std::string> designated_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
  std::unique_ptr<Runtime> runtime_;
  NetworkId network_ = 0;
  std::unique_ptr<BackendReloader> reloader_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> requests_{0}, failed_requests_{0};
  std::thread client_;
};

TEST_F(DeployModelTest, TheActiveContentIsAlwaysWhatTheRuleDesignates) {
  const uint64_t seed = EnvOr("BACKPLANE_DEPLOY_SEED", std::random_device{}());
  const uint64_t steps = EnvOr("BACKPLANE_DEPLOY_STEPS", 300);
  SCOPED_TRACE(fmt::format("seed {} (replay with BACKPLANE_DEPLOY_SEED={})", seed, seed));
  std::mt19937_64 random(seed);

  // The ldconfig layout to start from: .so.1 -> .so.1.0.0, no unversioned name.
  RenameOnto(std::string(kFamily) + ".1.0.0", Stamped(0));
  Link(std::string(kFamily) + ".1", std::string(kFamily) + ".1.0.0");
  ASSERT_TRUE(WaitFor([&] { return Active() && Active()->sha256 == *Designated(); }));
  runtime_ = Runtime::Create({.registry = registry_}).value();
  network_ = runtime_->LoadNetwork(testing::TwoLayerIdentityNetwork()).value();
  StartClient();

  std::vector<std::string> history;
  for (uint64_t step = 1; step <= steps; ++step) {
    history.push_back(RandomStep(random));
    ASSERT_FALSE(HasFatalFailure());
    const auto designated = Designated();
    const auto speaking = model_.Speaking();
    auto describe = [&] {
      std::string text = fmt::format("step {}: {}; speaking name {} ", step, history.back(),
                                     speaking.value_or("(none)"));
      const auto active = Active();
      text += active ? fmt::format("; active generation {} from {} ({}) sha256 {}",
                                   active->generation, active->file.string(),
                                   active->resolved_file.string(), active->sha256)
                     : "; no active generation";
      // A deploy silenced by a stale rejection shows up here (the newest first).
      if (const auto status = registry_->Describe("TestValid"); status && !status->rejected.empty())
        text += fmt::format("; last rejection {}: {}", status->rejected.front().file.string(),
                            status->rejected.front().error.ToString());
      text += "; expected sha256 " + designated.value_or("(none)") + "\nsteps so far:";
      for (const auto& done : history)
        text += "\n  " + done;
      return text;
    };
    ASSERT_TRUE(WaitFor([&] {
      const auto active = Active();
      return active && designated && active->sha256 == *designated;
    })) << describe();
    // Every generation it replaced leaves the process once the client lets go of it.
    ASSERT_TRUE(WaitFor([&] { return Unsettled().empty(); }))
        << "still not unloaded:" << Unsettled() << "\n"
        << describe();
  }
  // Settled: once the directory has been looked at, looking again finds nothing to change (a
  // rejection is remembered, not reported at every scan). The first look is the test's own: the
  // watcher may not have seen the last steps yet, since a step that changes nothing the rule
  // designates passes the waits above at once (seed 3407107754 ended on a link into a loop).
  (void)registry_->Rescan();
  const RescanResult last = registry_->Rescan();
  EXPECT_TRUE(last.outcomes.empty())
      << ToString(last.outcomes.at(0).action) << ": " << last.outcomes.at(0).message
      << "\nsteps:" << fmt::format("{}", fmt::join(history, "\n  "));
  stop_ = true;
  client_.join();
  EXPECT_EQ(failed_requests_.load(), 0u) << "of " << requests_.load() << " requests";
  EXPECT_GT(requests_.load(), steps);
  EXPECT_EQ(loader_->stats().leaked.load(), 0u);
}

}  // namespace
}  // namespace backplane
