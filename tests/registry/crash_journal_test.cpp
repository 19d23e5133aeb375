// No crash loops: with a state directory, a build activated over one that served and followed by
// the process dying inside the crash grace is refused at the next start (SUSPECTED_CRASH), which
// serves the build before it from the copy kept in the state directory. The crash is real: a
// child process deploys and dies by a signal.
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "backplane/registry/activation_journal.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Fixture;
using ::testing::HasSubstr;
using testing::TempDir;

class CrashJournalTest : public ::testing::Test {
 protected:
  static constexpr char kFile[] = "Test_Valid_backend.so";

  void SetUp() override {
    testing::CopyFile(Fixture("Valid"), dir_ / kFile);
    valid_sha_ = testing::FileDigest(Fixture("Valid"));
    crashing_sha_ = testing::FileDigest(Fixture("ValidCrashesAlways"));
  }

  // A registry of its own loader (a forked child has none of the parent's threads, the shared
  // loader's reaper among them).
  Result<std::shared_ptr<BackendRegistry>> Create(std::chrono::milliseconds grace = 60s,
                                                  DeployPolicy policy = DeployPolicy::kImmediate) {
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    if (!loader.ok())
      return loader.error();
    return BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                    .loader = std::move(loader).value(),
                                    .settle_time = 0ms,
                                    .deploy_policy = policy,
                                    .state_dir = state_dir(),
                                    .crash_grace = grace});
  }
  std::shared_ptr<BackendRegistry> CreateOrFail(std::chrono::milliseconds grace = 60s) {
    auto registry = Create(grace);
    EXPECT_TRUE(registry.ok()) << registry.error().ToString();
    return registry.ok() ? std::move(registry).value() : nullptr;
  }

  // The operator's `cp` over the served file: in place, the bytes of the build before are gone.
  void CopyOver(std::string_view fixture) { testing::CopyFile(Fixture(fixture), dir_ / kFile); }

  // In a child process: a registry serving Valid gets ValidCrashesAlways copied over its file,
  // activates it, then `after_deploy` runs and the process dies by SIGKILL (as the OOM killer or
  // a crashing backend would end it: no clean shutdown). Returns the child's wait status.
  int DeployThenDie(std::chrono::milliseconds grace,
                    const std::function<bool(BackendRegistry&)>& after_deploy = {}) {
    std::fflush(nullptr);
    const pid_t child = fork();
    if (child == 0) {
      auto created = Create(grace);
      if (!created.ok())
        _exit(10);
      const std::shared_ptr<BackendRegistry> registry = std::move(created).value();
      CopyOver("ValidCrashesAlways");
      const auto result = registry->Rescan();
      if (result.outcomes.size() != 1 ||
          result.outcomes[0].action != DeployOutcome::Action::kActivated) {
        _exit(11);
      }
      if (after_deploy && !after_deploy(*registry))
        _exit(12);
      kill(getpid(), SIGKILL);
      _exit(13);
    }
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    return status;
  }

  std::string ActiveSha(BackendRegistry& registry) {
    const auto backend = registry.Find("TestValid");
    return backend && backend->generation ? backend->generation->info().sha256 : "";
  }

  fs::path state_dir() const { return state_root_ / "state"; }

  TempDir shadow_root_;
  TempDir state_root_;
  TempDir dir_;
  std::string valid_sha_;
  std::string crashing_sha_;
};

TEST_F(CrashJournalTest, RefusesTheBuildActiveWhenTheProcessDiedAndServesTheOneBefore) {
  const int status = DeployThenDie(60s);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  const testing::LogCapture log("backplane.registry");
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  // The file holds the crashing build only: Valid comes from the state directory's copy.
  EXPECT_EQ(testing::FileDigest(dir_ / kFile), crashing_sha_);
  EXPECT_EQ(ActiveSha(*registry), valid_sha_);
  const BackendStatus described = registry->Describe("TestValid").value();
  ASSERT_FALSE(described.rejected.empty());
  EXPECT_EQ(described.rejected.front().error.reason(), LoadReason::kSuspectedCrash);
  EXPECT_THAT(described.rejected.front().error.message(), HasSubstr(crashing_sha_));
  ASSERT_EQ(described.activations.size(), 1u);
  EXPECT_EQ(described.activations[0].state, ActivationRecord::State::kSuspected);
  EXPECT_EQ(described.activations[0].sha256, crashing_sha_);
  const std::string text = log.Text();
  EXPECT_THAT(text, HasSubstr("SUSPECTED_CRASH"));
  EXPECT_THAT(text, HasSubstr("serves its previous version"));

  // Still refused by the next rescan and by the start after this one, however it ends.
  EXPECT_TRUE(registry->Rescan().outcomes.empty());
  registry.reset();
  registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), valid_sha_);
}

TEST_F(CrashJournalTest, ABuildThatSurvivedItsGraceIsNotSuspectedAfterALaterCrash) {
  const int status = DeployThenDie(100ms, [](BackendRegistry& registry) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!registry.ActivationRecords().empty()) {
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);

  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
  EXPECT_TRUE(registry->Rejected().empty());
  EXPECT_TRUE(registry->ActivationRecords().empty());
}

TEST_F(CrashJournalTest, ACleanShutdownLeavesNothingSuspected) {
  {
    auto registry = CreateOrFail();
    ASSERT_NE(registry, nullptr);
    CopyOver("ValidCrashesAlways");
    ASSERT_EQ(registry->Rescan().outcomes.at(0).action, DeployOutcome::Action::kActivated);
    ASSERT_EQ(registry->ActivationRecords().size(), 1u);
    EXPECT_EQ(registry->ActivationRecords()[0].state, ActivationRecord::State::kProbation);
  }
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
  EXPECT_TRUE(registry->ActivationRecords().empty());
}

TEST_F(CrashJournalTest, PublishingAnotherFileEndsTheSuspicion) {
  ASSERT_TRUE(WIFSIGNALED(DeployThenDie(60s)));
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  ASSERT_EQ(ActiveSha(*registry), valid_sha_);

  CopyOver("ValidNext");
  const auto result = registry->Rescan();
  ASSERT_EQ(result.outcomes.size(), 1u);
  EXPECT_EQ(result.outcomes[0].action, DeployOutcome::Action::kActivated);
  EXPECT_EQ(ActiveSha(*registry), testing::FileDigest(Fixture("ValidNext")));
  for (const auto& record : registry->ActivationRecords())
    EXPECT_NE(record.state, ActivationRecord::State::kSuspected);

  // The suspect published again is a new deploy like any other.
  CopyOver("ValidCrashesAlways");
  ASSERT_EQ(registry->Rescan().outcomes.at(0).action, DeployOutcome::Action::kActivated);
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
}

TEST_F(CrashJournalTest, AnOperatorReloadLoadsTheSuspectAgainOnProbation) {
  ASSERT_TRUE(WIFSIGNALED(DeployThenDie(60s)));
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  ASSERT_EQ(ActiveSha(*registry), valid_sha_);

  auto reloaded = registry->Reload("TestValid");
  ASSERT_TRUE(reloaded.ok()) << reloaded.error().ToString();
  EXPECT_EQ(reloaded->action, DeployOutcome::Action::kActivated) << reloaded->message;
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
  const auto records = registry->ActivationRecords();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, ActivationRecord::State::kProbation);
  EXPECT_EQ(records[0].sha256, crashing_sha_);
}

TEST_F(CrashJournalTest, WithNothingKeptTheSuspectIsRefusedAndAReloadStillLoadsIt) {
  ASSERT_TRUE(WIFSIGNALED(DeployThenDie(60s)));
  fs::remove_all(state_dir() / "rollback");
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_FALSE(registry->Find("TestValid").has_value());
  ASSERT_EQ(registry->Rejected().size(), 1u);
  EXPECT_EQ(registry->Rejected()[0].error.reason(), LoadReason::kSuspectedCrash);

  auto reloaded = registry->Reload("TestValid");
  ASSERT_TRUE(reloaded.ok()) << reloaded.error().ToString();
  EXPECT_EQ(reloaded->action, DeployOutcome::Action::kActivated) << reloaded->message;
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
}

// The crash loop: a progressive rollout's candidate kills the process in its shadow
// phase. The start after it serves the stable build the candidate ran beside, not the one before
// that (which is what a rollback of the stable build would load).
TEST_F(CrashJournalTest, ACandidateThatCrashedIsRefusedAndTheStableBuildServes) {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    auto created = Create(60s, DeployPolicy::kProgressive);
    if (!created.ok())
      _exit(10);
    const std::shared_ptr<BackendRegistry> registry = std::move(created).value();
    CopyOver("ValidNext");
    (void)registry->Rescan();
    if (!registry->Promote("TestValid").ok())  // ValidNext stable, Valid kept for rollback
      _exit(11);
    CopyOver("ValidCrashesAlways");
    const auto result = registry->Rescan();
    if (result.outcomes.empty() || result.outcomes[0].action != DeployOutcome::Action::kCandidate)
      _exit(12);
    kill(getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);

  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), testing::FileDigest(Fixture("ValidNext")));
  ASSERT_FALSE(registry->Rejected().empty());
  EXPECT_EQ(registry->Rejected().back().error.reason(), LoadReason::kSuspectedCrash);
}

TEST_F(CrashJournalTest, ARollbackAfterARestartLoadsTheCopyKeptInTheStateDirectory) {
  {
    auto registry = CreateOrFail();
    ASSERT_NE(registry, nullptr);
    CopyOver("ValidNext");  // in place: Valid's bytes are nowhere in the backend directory now
    ASSERT_EQ(registry->Rescan().outcomes.at(0).action, DeployOutcome::Action::kActivated);
  }
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  ASSERT_EQ(ActiveSha(*registry), testing::FileDigest(Fixture("ValidNext")));
  auto rolled_back = registry->Rollback("TestValid");
  ASSERT_TRUE(rolled_back.ok()) << rolled_back.error().ToString();
  EXPECT_EQ(ActiveSha(*registry), valid_sha_);
}

TEST_F(CrashJournalTest, ABuildFoundAtStartIsNotOnProbation) {
  CopyOver("ValidCrashesAlways");
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    auto created = Create();
    if (!created.ok())
      _exit(10);
    const std::shared_ptr<BackendRegistry> registry = std::move(created).value();
    if (!registry->ActivationRecords().empty())
      _exit(11);
    kill(getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status " << WEXITSTATUS(status);
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), crashing_sha_);
}

TEST_F(CrashJournalTest, ACorruptJournalIsReportedAndIgnored) {
  fs::create_directories(state_dir());
  testing::WriteFile(state_dir() / "activations",
                     "backplane-activations 1\nsuspected\tTestValid\tnot-a-digest\n");
  const testing::LogCapture log("backplane.registry");
  auto registry = CreateOrFail();
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(ActiveSha(*registry), valid_sha_);
  EXPECT_THAT(log.Text(), HasSubstr("crash journal ignored"));
  EXPECT_TRUE(fs::exists(state_dir() / "activations.corrupt"));
  // Cut short (no trailer) is corrupt too, not "fewer suspects".
  const auto contents = [&] {
    fs::create_directories(state_dir() / "cut");
    testing::WriteFile(state_dir() / "cut" / "activations", "backplane-activations 1\n");
    return ReadActivationJournal(state_dir() / "cut");
  }();
  EXPECT_FALSE(contents.problem.ok());
  EXPECT_THAT(contents.problem.message(), HasSubstr("cut short"));
}

TEST_F(CrashJournalTest, AStateDirThatCannotBeMadeOrIsInUseIsAnErrorNamingIt) {
  testing::WriteFile(state_root_ / "plain-file", "x");
  auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
  ASSERT_TRUE(loader.ok());
  auto refused = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                          .loader = std::move(loader).value(),
                                          .state_dir = state_root_ / "plain-file" / "state"});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message(),
              HasSubstr("state_dir " + (state_root_ / "plain-file" / "state").string()));
  auto first = CreateOrFail();
  ASSERT_NE(first, nullptr);
  auto second = Create();
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error().message(), HasSubstr("in use by another process"));
}

// ---- The rule against a model of it, over random lives of a process ------------------------

// What the rule says the registry does, for one backend id whose builds are numbered 0..3.
struct CrashRuleModel {
  int file = 0;                   // the build the directory holds
  std::optional<int> active = 0;  // the build served; nullopt: the id serves nothing
  bool file_current = true;       // `active` was loaded from the file as it is now
  bool registered = true;         // the id has been active in this life
  std::optional<int> retained;    // the build the rollback store keeps
  std::set<int> suspected;
  std::set<int> probation;  // of this life

  // A new life: what the last one left on probation is suspected; the file's build serves
  // unless suspected, then the kept one does, if any.
  void Start() {
    suspected.insert(probation.begin(), probation.end());
    probation.clear();
    registered = true;
    file_current = !suspected.contains(file);
    if (file_current)
      active = file;
    else if (retained && *retained != file)
      active = retained;
    else
      active = std::nullopt, registered = false;
  }
  void Activate(int build) {
    if (active) {
      retained = active;
      probation.insert(build);
    }
    active = build;
    file_current = true;
    registered = true;
  }
  void Publish(int build) {
    file = build;
    file_current = false;
    if (suspected.contains(build)) {
      if (!active && retained && *retained != build)
        active = retained, registered = true;
      return;
    }
    suspected.clear();
    Activate(build);
  }
  void Reload() {
    const bool had_suspects = !suspected.empty();
    suspected.clear();
    if ((!registered && !had_suspects) || file_current)
      return;
    Activate(file);
  }
  std::string ToString() const {
    auto list = [](const std::set<int>& builds) {
      std::string text;
      for (int build : builds)
        text += std::to_string(build) + " ";
      return "{" + text + "}";
    };
    return "file " + std::to_string(file) + ", active " +
           (active ? std::to_string(*active) : "none") + ", retained " +
           (retained ? std::to_string(*retained) : "none") + ", suspected " + list(suspected) +
           ", probation " + list(probation);
  }
};

TEST_F(CrashJournalTest, FollowsTheRuleOverRandomLivesOfTheProcess) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  const std::vector<std::string> builds = {"Valid", "ValidNext", "ValidBuild3", "ValidBuild4"};
  std::vector<std::string> shas;
  for (const auto& build : builds)
    shas.push_back(testing::FileDigest(Fixture(build)));
  constexpr auto kGrace = 1000ms;
  const fs::path report = state_root_ / "report";

  CrashRuleModel model;
  for (int life = 0; life < 10; ++life) {
    // Decided here, run in a child that dies by SIGKILL (a crash) or ends cleanly.
    std::vector<int> ops;  // 0..3: publish that build; 4: reload; 5: survive the grace
    const int count = std::uniform_int_distribution<int>(1, 4)(random);
    for (int i = 0; i < count; ++i)
      ops.push_back(std::uniform_int_distribution<int>(0, 9)(random) < 7
                        ? std::uniform_int_distribution<int>(0, 3)(random)
                        : std::uniform_int_distribution<int>(4, 5)(random));
    const bool crash = std::bernoulli_distribution(0.6)(random);
    std::fflush(nullptr);
    const pid_t child = fork();
    if (child == 0) {
      std::string failure;
      auto check = [&](const std::string& step, BackendRegistry& registry) {
        const std::string expected_active = model.active ? shas[*model.active] : "";
        std::set<std::string> expected_suspected, expected_probation, suspected, probation;
        for (int build : model.suspected)
          expected_suspected.insert(shas[build]);
        for (int build : model.probation)
          expected_probation.insert(shas[build]);
        for (const auto& record : registry.ActivationRecords()) {
          (record.state == ActivationRecord::State::kSuspected ? suspected : probation)
              .insert(record.sha256);
        }
        if (failure.empty() &&
            (ActiveSha(registry) != expected_active || suspected != expected_suspected ||
             probation != expected_probation)) {
          failure = "life " + std::to_string(life) + ", after " + step + ": the model says " +
                    model.ToString() + "; the registry serves " + ActiveSha(registry) + " with " +
                    std::to_string(suspected.size()) + " suspected and " +
                    std::to_string(probation.size()) + " on probation";
        }
      };
      const auto born = std::chrono::steady_clock::now();
      model.Start();
      auto created = Create(kGrace);
      if (!created.ok())
        _exit(20);
      std::shared_ptr<BackendRegistry> registry = std::move(created).value();
      check("the start", *registry);
      for (int op : ops) {
        if (op < 4) {
          if (op == model.file)
            op = (op + 1) % 4;  // a publish changes the content
          CopyOver(builds[op]);
          (void)registry->Rescan();
          model.Publish(op);
          check("publishing " + builds[op], *registry);
        } else if (op == 4) {
          (void)registry->Reload("TestValid");
          model.Reload();
          check("a reload", *registry);
        } else {
          std::this_thread::sleep_for(kGrace + 200ms);
          model.probation.clear();
          check("the grace", *registry);
        }
      }
      // A slow machine may have let the grace pass: then the life did survive it.
      if (std::chrono::steady_clock::now() - born > kGrace / 2) {
        std::this_thread::sleep_for(kGrace + 200ms);
        model.probation.clear();
        check("the grace (a slow life)", *registry);
      }
      if (!crash)
        model.probation.clear();
      std::string state = failure.empty() ? "ok\n" : failure + "\n";
      state += std::to_string(model.file) + " " + std::to_string(model.active.value_or(-1)) + " " +
               std::to_string(model.retained.value_or(-1)) + " ";
      for (int build : model.suspected)
        state += "s" + std::to_string(build) + " ";
      for (int build : model.probation)
        state += "p" + std::to_string(build) + " ";
      testing::WriteFile(report, state);
      if (crash)
        kill(getpid(), SIGKILL);
      registry.reset();  // the clean end
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    const std::string text = testing::ReadFile(report);
    const auto newline = text.find('\n');
    ASSERT_NE(newline, std::string::npos) << "life " << life << ": no report";
    ASSERT_EQ(text.substr(0, newline), "ok");
    std::istringstream state(text.substr(newline + 1));
    int active = 0, retained = 0;
    state >> model.file >> active >> retained;
    model.active = active < 0 ? std::nullopt : std::optional<int>(active);
    model.retained = retained < 0 ? std::nullopt : std::optional<int>(retained);
    model.suspected.clear();
    model.probation.clear();
    for (std::string word; state >> word;)
      (word[0] == 's' ? model.suspected : model.probation).insert(word[1] - '0');
  }
}

}  // namespace
}  // namespace backplane
