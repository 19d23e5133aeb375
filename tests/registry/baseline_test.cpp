// A progressive rollout's baseline (BackendRegistryOptions::baseline_generations): the stable
// build loaded again from its kept bytes, beside each candidate and placed as the candidate is,
// handed to the runtimes with it and let go of with it. A registry on a real directory with real
// fixture backends (and real worker processes for sandboxed candidates), and a subscriber that
// binds what it is told to as a runtime would.
#include <signal.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>

#include "backplane/isolation/worker_runner.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/registry/crash_supervisor.hpp"
#include "loader/loader_test_util.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Action = DeployOutcome::Action;
using testing::Fixture;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;

constexpr char kBaselineFile[] = "Test_Valid_backend.so";

// "worker process 1234" -> 1234; 0 in the server.
pid_t WorkerPid(const std::string& runs_in) {
  constexpr std::string_view kPrefix = "worker process ";
  if (runs_in.rfind(kPrefix, 0) != 0)
    return 0;
  return static_cast<pid_t>(std::stol(runs_in.substr(kPrefix.size())));
}

bool ProcessGone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Trusts everything until told to refuse one digest (as an allowlist revised meanwhile would).
class RevisableTrust final : public loader::TrustPolicy {
 public:
  void Refuse(std::string sha256) {
    std::lock_guard lock(mutex_);
    refused_ = std::move(sha256);
    ++revision_;
  }
  Status Check(const loader::TrustSubject& subject) const override {
    std::lock_guard lock(mutex_);
    if (subject.sha256 == refused_) {
      return {LoadReason::kUntrusted, subject.file.string() + " (sha256 " + subject.sha256 +
                                          ") is not on the trusted list"};
    }
    return Status::Ok();
  }
  uint64_t Revision() const override {
    std::lock_guard lock(mutex_);
    return revision_;
  }
  std::string Describe() const override { return "all but one digest"; }

 private:
  mutable std::mutex mutex_;
  std::string refused_;
  uint64_t revision_ = 1;
};

// Binds what a runtime would: the candidate and its baseline while the rollout lasts, and lets
// go of both when the candidate is dropped or the id's active generation changes. Remembers what
// each change carried (numbers and facts, never leases: those would keep generations alive).
class BaselineSubscriber final : public BackendSubscriber {
 public:
  struct Seen {
    BackendChange::Target target;
    uint64_t next = 0;  // 0: null
    uint64_t previous = 0;
    uint64_t baseline = 0;
    std::string baseline_sha256;
    std::string baseline_runs_in;
    bool baseline_is_previous = false;  // the same generation object: not a mapping of its own
  };

  bool refuse_baselines = false;  // refuses a change that carries one

  Result<std::unique_ptr<PreparedChange>> PrepareChange(const BackendChange& change) override {
    if (refuse_baselines && change.baseline != nullptr)
      return Status{LoadReason::kPrepareFailed, "the baseline does not prepare here"};
    Seen seen{change.target, change.next ? change.next->info().number : 0,
              change.previous ? change.previous->info().number : 0};
    if (change.baseline != nullptr) {
      seen.baseline = change.baseline->info().number;
      seen.baseline_sha256 = change.baseline->info().sha256;
      seen.baseline_runs_in = change.baseline->info().runs_in;
      seen.baseline_is_previous = change.baseline == change.previous;
    }
    return std::unique_ptr<PreparedChange>(std::make_unique<Change>(*this, change, seen));
  }

  std::vector<Seen> seen() {
    std::lock_guard lock(seen_mutex_);
    return seen_;
  }
  // The last kCandidate change that brought a candidate.
  std::optional<Seen> LastArrival() {
    std::lock_guard lock(seen_mutex_);
    for (auto it = seen_.rbegin(); it != seen_.rend(); ++it) {
      if (it->target == BackendChange::Target::kCandidate && it->next != 0)
        return *it;
    }
    return std::nullopt;
  }
  bool Bound() {
    MutexLock lock(mutex_);
    return candidate_ != nullptr || baseline_ != nullptr;
  }

 private:
  class Change final : public PreparedChange {
   public:
    Change(BaselineSubscriber& owner, BackendChange change, Seen seen)
        : owner_(owner), change_(std::move(change)), seen_(std::move(seen)) {}
    std::unique_lock<Mutex> LockState() override { return std::unique_lock<Mutex>(owner_.mutex_); }
    bool IsCurrent() const override { return true; }
    void Commit() override {
      owner_.mutex_.AssertHeld();
      // What was bound before is released when this change is dropped, outside the lock. A
      // change of the active generation ends the rollout (a promotion), baseline included.
      released_candidate_ = std::move(owner_.candidate_);
      released_baseline_ = std::move(owner_.baseline_);
      if (change_.target == BackendChange::Target::kCandidate) {
        owner_.candidate_ = change_.next;
        owner_.baseline_ = change_.baseline;
      }
      std::lock_guard lock(owner_.seen_mutex_);
      owner_.seen_.push_back(seen_);
    }

   private:
    BaselineSubscriber& owner_;
    BackendChange change_;
    Seen seen_;
    loader::GenerationLease released_candidate_;
    loader::GenerationLease released_baseline_;
  };

  Mutex mutex_;
  loader::GenerationLease candidate_ BACKPLANE_GUARDED_BY(mutex_);
  loader::GenerationLease baseline_ BACKPLANE_GUARDED_BY(mutex_);
  std::mutex seen_mutex_;
  std::vector<Seen> seen_;
};

class BaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::CopyFile(Fixture("Valid"), dir_ / kBaselineFile);
    stable_sha256_ = testing::FileDigest(Fixture("Valid"));
  }

  void TearDown() override {
    subscription_.Reset();
    if (registry_ != nullptr)
      registry_->RemoveObserver(observer_);
  }

  struct Setup {
    bool baseline = true;
    bool sandbox = false;
    std::shared_ptr<const loader::TrustPolicy> trust;
    fs::path state_dir;
  };
  void CreateRegistry(Setup setup) {
    loader::LoaderOptions options{.shadow_root = shadow_root_.path()};
    if (setup.sandbox) {
      supervisor_ = std::make_shared<CrashSupervisor>();
      options.out_of_process =
          isolation::MakeWorkerRunner({}, [weak = std::weak_ptr<CrashSupervisor>(supervisor_)](
                                              const isolation::WorkerCrash& crash) {
            if (auto alive = weak.lock())
              alive->OnCrash(crash);
          });
    }
    auto loader = loader::Loader::Create(std::move(options));
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    loader_ = std::move(loader).value();
    auto registry = BackendRegistry::Create({.backend_paths = std::vector{dir_.path()},
                                             .loader = loader_,
                                             .settle_time = 0ms,
                                             .trust = std::move(setup.trust),
                                             .deploy_policy = DeployPolicy::kProgressive,
                                             .state_dir = setup.state_dir,
                                             .sandbox_candidates = setup.sandbox,
                                             .baseline_generations = setup.baseline});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
    if (supervisor_ != nullptr)
      supervisor_->Attach(registry_);
    subscription_ = registry_->Subscribe(subscriber_, [] {});
    observer_ = registry_->AddObserver([this](const GenerationEvent& event) {
      if (event.kind == GenerationEvent::Kind::kUnloaded) {
        std::lock_guard lock(unloaded_mutex_);
        unloaded_.push_back(event.generation);
      }
    });
  }

  // The operator's `cp` over the served file: in place.
  void CopyOver(std::string_view fixture) {
    testing::CopyFile(Fixture(fixture), dir_ / kBaselineFile);
  }
  DeployOutcome DeployCandidate(std::string_view fixture) {
    CopyOver(fixture);
    const auto result = registry_->Rescan();
    EXPECT_EQ(result.outcomes.size(), 1u);
    return result.outcomes.empty() ? DeployOutcome{} : result.outcomes[0];
  }

  BackendStatus Describe() { return registry_->Describe("TestValid").value(); }
  std::optional<GenerationStatus> Generation(uint64_t number) {
    for (const auto& generation : Describe().generations) {
      if (generation.generation == number)
        return generation;
    }
    return std::nullopt;
  }
  bool Unloaded(uint64_t number) {
    std::lock_guard lock(unloaded_mutex_);
    return std::find(unloaded_.begin(), unloaded_.end(), number) != unloaded_.end();
  }
  // The baseline `number` is let go of by the registry and the subscriber: it leaves the process
  // (and its worker, if it had one, ends).
  void ExpectGone(uint64_t number, pid_t worker = 0) {
    EXPECT_FALSE(subscriber_.Bound());
    EXPECT_TRUE(testing::WaitFor([&] { return Unloaded(number); })) << "generation " << number;
    const auto record = Generation(number);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->state, GenerationState::kUnloaded);
    EXPECT_EQ(record->refcount, 0);
    if (worker != 0) {
      EXPECT_TRUE(testing::WaitFor([&] { return ProcessGone(worker); })) << "worker " << worker;
    }
  }

  TempDir shadow_root_;
  TempDir dir_;
  TempDir state_root_;
  std::string stable_sha256_;
  std::shared_ptr<CrashSupervisor> supervisor_;  // before the loader: workers may outlive it
  std::shared_ptr<loader::Loader> loader_;
  BaselineSubscriber subscriber_;
  std::shared_ptr<BackendRegistry> registry_;
  Subscription subscription_;
  uint64_t observer_ = 0;
  std::mutex unloaded_mutex_;
  std::vector<uint64_t> unloaded_;
};

TEST_F(BaselineTest, ACandidateArrivesWithTheStableBuildLoadedAgainAsItsBaseline) {
  const testing::LogCapture log("backplane.registry");
  CreateRegistry({});
  const uint64_t active = Describe().active_generation;
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;

  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  EXPECT_EQ(arrival->next, outcome.generation);
  EXPECT_EQ(arrival->previous, active);
  ASSERT_NE(arrival->baseline, 0u);
  EXPECT_NE(arrival->baseline, active);
  EXPECT_NE(arrival->baseline, outcome.generation);
  EXPECT_FALSE(arrival->baseline_is_previous);
  EXPECT_EQ(arrival->baseline_sha256, stable_sha256_);
  EXPECT_EQ(arrival->baseline_runs_in, "") << "candidates run in the server here";
  // A mapping of its own: the stable code is in the process twice.
  EXPECT_EQ(testing::MappedGenerations(kBaselineFile)
                .count(testing::GenerationMapping(arrival->baseline, kBaselineFile)),
            1u);

  const BackendStatus status = Describe();
  EXPECT_EQ(status.active_generation, active);
  EXPECT_EQ(status.candidate_generation, outcome.generation);
  EXPECT_EQ(status.baseline_generation, arrival->baseline);
  const auto record = Generation(arrival->baseline);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, GenerationState::kBaseline);
  EXPECT_EQ(ToString(record->state), "baseline");
  EXPECT_EQ(record->sha256, stable_sha256_);
  // What its record names holds its bytes while it lives (a crash capture copies it from there).
  EXPECT_EQ(testing::FileDigest(record->resolved_file), stable_sha256_);
  EXPECT_THAT(log.Text(),
              HasSubstr("backend TestValid generation " + std::to_string(arrival->baseline) +
                        " is the rollout's baseline: generation " + std::to_string(active) +
                        "'s build (sha256 " + stable_sha256_ + ") loaded again in the server"));
}

TEST_F(BaselineTest, WithoutTheOptionACandidateArrivesAlone) {
  CreateRegistry({.baseline = false});
  ASSERT_EQ(DeployCandidate("ValidNext").action, Action::kCandidate);
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  EXPECT_EQ(arrival->baseline, 0u);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  for (const auto& generation : Describe().generations)
    EXPECT_NE(generation.state, GenerationState::kBaseline);
}

TEST_F(BaselineTest, DroppingTheCandidateReleasesItsBaselineWhichUnloads) {
  CreateRegistry({});
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate);
  const uint64_t baseline = Describe().baseline_generation;
  ASSERT_NE(baseline, 0u);

  ASSERT_TRUE(registry_->DropCandidate("TestValid", "the judge said no").ok());
  EXPECT_EQ(Describe().baseline_generation, 0u);
  ExpectGone(baseline);
  EXPECT_FALSE(testing::MappedGenerations(kBaselineFile)
                   .contains(testing::GenerationMapping(baseline, kBaselineFile)));
}

TEST_F(BaselineTest, ASupersededCandidateTakesItsBaselineAlongAndTheNewOneGetsItsOwn) {
  CreateRegistry({});
  ASSERT_EQ(DeployCandidate("ValidNext").action, Action::kCandidate);
  const uint64_t first = Describe().baseline_generation;
  ASSERT_NE(first, 0u);

  const DeployOutcome second = DeployCandidate("ValidBuild3");
  ASSERT_EQ(second.action, Action::kCandidate) << second.message;
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  EXPECT_EQ(arrival->next, second.generation);
  EXPECT_NE(arrival->baseline, 0u);
  EXPECT_NE(arrival->baseline, first);
  EXPECT_EQ(arrival->baseline_sha256, stable_sha256_);
  EXPECT_EQ(Describe().baseline_generation, arrival->baseline);
  EXPECT_TRUE(testing::WaitFor([&] { return Unloaded(first); }));
  EXPECT_EQ(Generation(first)->state, GenerationState::kUnloaded);
}

TEST_F(BaselineTest, APromotedCandidateReleasesItsBaseline) {
  CreateRegistry({});
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate);
  const uint64_t baseline = Describe().baseline_generation;
  ASSERT_NE(baseline, 0u);

  auto promoted = registry_->Promote("TestValid", outcome.generation);
  ASSERT_TRUE(promoted.ok()) << promoted.error().ToString();
  ASSERT_EQ(promoted->action, Action::kActivated);
  EXPECT_EQ(Describe().active_generation, outcome.generation);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  ExpectGone(baseline);
}

TEST_F(BaselineTest, AWithdrawnIdReleasesTheBaselineOfItsCandidate) {
  CreateRegistry({});
  ASSERT_EQ(DeployCandidate("ValidNext").action, Action::kCandidate);
  const uint64_t baseline = Describe().baseline_generation;
  ASSERT_NE(baseline, 0u);

  fs::remove(dir_ / kBaselineFile);
  (void)registry_->Rescan();
  EXPECT_TRUE(Describe().withdrawn);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  ExpectGone(baseline);
}

TEST_F(BaselineTest, ABaselineComesFromTheBytesThatRanNotFromTheFileCopiedOverInPlace) {
  CreateRegistry({});
  // `cp` onto the served file: the stable build's bytes are nowhere in the directory now.
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate);
  ASSERT_EQ(testing::FileDigest(dir_ / kBaselineFile), testing::FileDigest(Fixture("ValidNext")));
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  ASSERT_NE(arrival->baseline, 0u);
  EXPECT_EQ(arrival->baseline_sha256, stable_sha256_);
}

TEST_F(BaselineTest, ABaselineNoLongerTrustedIsLeftOutAndTheCandidateStillArrives) {
  auto trust = std::make_shared<RevisableTrust>();
  CreateRegistry({.trust = trust});
  trust->Refuse(stable_sha256_);  // revoked after it loaded: the active one serves on
  const testing::LogCapture log("backplane.registry");
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  EXPECT_EQ(arrival->next, outcome.generation);
  EXPECT_EQ(arrival->baseline, 0u);
  EXPECT_EQ(Describe().candidate_generation, outcome.generation);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  EXPECT_THAT(log.Text(),
              HasSubstr("candidate generation " + std::to_string(outcome.generation) +
                        " has no baseline (it is judged against the stable generation)"));
  EXPECT_THAT(log.Text(), HasSubstr("UNTRUSTED"));
}

TEST_F(BaselineTest, ABaselineWhoseBytesCannotBeCopiedIsLeftOutAndTheCandidateStillArrives) {
  // Where the copies would go, a plain file: neither the copy kept for the start after a crash
  // nor the baseline's own can be written.
  const fs::path state_dir = state_root_ / "state";
  fs::create_directories(state_dir / "rollback");
  testing::WriteFile(state_dir / "rollback" / "before-probation", "in the way");
  testing::WriteFile(state_dir / "rollback" / "baseline", "in the way");
  CreateRegistry({.state_dir = state_dir});
  const testing::LogCapture log("backplane.registry");
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;
  EXPECT_EQ(subscriber_.LastArrival()->baseline, 0u);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  EXPECT_THAT(log.Text(), HasSubstr("has no baseline"));
  EXPECT_THAT(log.Text(), HasSubstr("could not be copied"));
}

TEST_F(BaselineTest, ARuntimeThatRefusesTheBaselineStillGetsTheCandidate) {
  CreateRegistry({});
  subscriber_.refuse_baselines = true;
  const testing::LogCapture log("backplane.registry");
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  EXPECT_EQ(arrival->baseline, 0u);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  EXPECT_THAT(log.Text(), HasSubstr("the runtimes refused baseline generation"));
  EXPECT_THAT(log.Text(), Not(HasSubstr("is the rollout's baseline")));
  bool rejected = false;
  for (const auto& generation : Describe().generations) {
    if (generation.state == GenerationState::kRejected &&
        generation.rejection.message().find("refused as the rollout's baseline") !=
            std::string::npos)
      rejected = true;
  }
  EXPECT_TRUE(rejected);
}

// ---- Sandboxed candidates: the baseline runs in a worker of its own ------------------------

TEST_F(BaselineTest, ASandboxedCandidatesBaselineRunsInAWorkerAndEndsWithThePromotion) {
  const testing::LogCapture log("backplane.registry");
  CreateRegistry({.sandbox = true});
  const uint64_t active = Describe().active_generation;
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  ASSERT_NE(arrival->baseline, 0u);
  EXPECT_NE(arrival->baseline, active);
  EXPECT_EQ(arrival->baseline_sha256, stable_sha256_);
  const pid_t worker = WorkerPid(arrival->baseline_runs_in);
  ASSERT_NE(worker, 0) << arrival->baseline_runs_in;
  EXPECT_NE(WorkerPid(Generation(outcome.generation)->runs_in), worker) << "a worker of its own";
  EXPECT_EQ(Generation(active)->runs_in, "") << "the stable generation runs here";
  EXPECT_THAT(log.Text(),
              HasSubstr("'s build (sha256 " + stable_sha256_ +
                        ") loaded again in a worker process " + std::to_string(worker)));

  auto promoted = registry_->Promote("TestValid", outcome.generation);
  ASSERT_TRUE(promoted.ok()) << promoted.error().ToString();
  ASSERT_EQ(promoted->action, Action::kActivated);
  EXPECT_EQ(Describe().baseline_generation, 0u);
  ExpectGone(arrival->baseline, worker);
}

TEST_F(BaselineTest, ASandboxedCandidateDroppedTakesItsBaselinesWorkerAlong) {
  CreateRegistry({.sandbox = true});
  ASSERT_EQ(DeployCandidate("ValidNext").action, Action::kCandidate);
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  const pid_t worker = WorkerPid(arrival->baseline_runs_in);
  ASSERT_NE(worker, 0);
  ASSERT_TRUE(registry_->DropCandidate("TestValid", "the judge said no").ok());
  ExpectGone(arrival->baseline, worker);
}

// A baseline's worker dies: the candidate is not rolled back, the active generation is neither
// restarted nor rolled back, and the stable build is not put on probation or suspected.
TEST_F(BaselineTest, ABaselinesWorkerDyingCostsOnlyTheBaseline) {
  CreateRegistry({.sandbox = true, .state_dir = state_root_ / "state"});
  const uint64_t active = Describe().active_generation;
  const testing::LogCapture log("backplane.registry");
  const DeployOutcome outcome = DeployCandidate("ValidNext");
  ASSERT_EQ(outcome.action, Action::kCandidate) << outcome.message;
  const auto arrival = subscriber_.LastArrival();
  ASSERT_TRUE(arrival.has_value());
  const pid_t worker = WorkerPid(arrival->baseline_runs_in);
  ASSERT_NE(worker, 0);

  EXPECT_EQ(testing::FileDigest(Generation(arrival->baseline)->resolved_file), stable_sha256_);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  ASSERT_TRUE(testing::WaitFor([&] { return supervisor_->decided() >= 1; }));

  const BackendStatus status = Describe();
  EXPECT_EQ(status.active_generation, active);
  EXPECT_EQ(status.candidate_generation, outcome.generation);
  EXPECT_TRUE(status.rejected.empty());
  EXPECT_EQ(supervisor_->Counts()["TestValid"].restarts, 0u);
  for (const auto& record : registry_->ActivationRecords()) {
    EXPECT_NE(record.sha256, stable_sha256_);
    EXPECT_NE(record.state, ActivationRecord::State::kSuspected);
  }
  EXPECT_THAT(log.Text(), HasSubstr("baseline generation " + std::to_string(arrival->baseline)));
  EXPECT_THAT(log.Text(), HasSubstr("the rollout goes on"));
  EXPECT_THAT(log.Text(), Not(HasSubstr("rolled back")));

  // The rollout ends as any: the dead baseline is let go of with its candidate.
  ASSERT_TRUE(registry_->DropCandidate("TestValid", "the judge said no").ok());
  ExpectGone(arrival->baseline);
}

}  // namespace
}  // namespace backplane
