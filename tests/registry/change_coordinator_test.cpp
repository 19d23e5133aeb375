// The change sequence driven by fake subscribers: every subscriber prepares, then all commit
// under their locks, or none does; a stale subscriber makes all prepare again; observers hear
// about it after every lock is released.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "backplane/registry/backend_registry.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Action = DeployOutcome::Action;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

// What the fake subscribers did, in order, across all of them.
class Journal {
 public:
  void Add(std::string entry) {
    std::lock_guard lock(mutex_);
    entries_.push_back(std::move(entry));
  }
  std::vector<std::string> Take() {
    std::lock_guard lock(mutex_);
    return std::exchange(entries_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> entries_;
};

// A subscriber whose answers the test decides.
class FakeSubscriber final : public BackendSubscriber {
 public:
  FakeSubscriber(std::string name, Journal& journal) : name_(std::move(name)), journal_(journal) {}

  Status refusal;         // returned by PrepareChange when not ok
  int stale_commits = 0;  // how many commit attempts still find the state moved
  int committed = 0;

  Result<std::unique_ptr<PreparedChange>> PrepareChange(const BackendChange& change) override {
    journal_.Add(name_ + " prepare " + std::to_string(change.next->info().number));
    if (!refusal.ok())
      return refusal;
    return std::unique_ptr<PreparedChange>(std::make_unique<Change>(*this));
  }

 private:
  class Change final : public PreparedChange {
   public:
    explicit Change(FakeSubscriber& owner) : owner_(owner) {}
    ~Change() override { owner_.journal_.Add(owner_.name_ + (committed_ ? " release" : " abort")); }
    void BeginCommit() override { owner_.journal_.Add(owner_.name_ + " begin"); }
    std::unique_lock<Mutex> LockState() override {
      owner_.journal_.Add(owner_.name_ + " lock");
      return std::unique_lock<Mutex>(owner_.mutex_);
    }
    bool IsCurrent() const override {
      const bool current = owner_.stale_commits == 0;
      owner_.stale_commits = std::max(0, owner_.stale_commits - 1);
      owner_.journal_.Add(owner_.name_ + (current ? " current" : " stale"));
      return current;
    }
    void Commit() override {
      owner_.mutex_.AssertHeld();
      committed_ = true;
      ++owner_.committed;
      owner_.journal_.Add(owner_.name_ + " commit");
    }
    void AfterCommit() override { owner_.journal_.Add(owner_.name_ + " after commit"); }

   private:
    FakeSubscriber& owner_;
    bool committed_ = false;
  };

  const std::string name_;
  Journal& journal_;
  Mutex mutex_;
};

class ChangeCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loader = loader::Loader::Create({.shadow_root = shadow_root_.path()});
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    loader_ = std::move(loader).value();
    Publish("Valid");
    auto registry =
        BackendRegistry::Create({.backend_paths = std::vector{dir_.path()}, .loader = loader_});
    ASSERT_TRUE(registry.ok()) << registry.error().ToString();
    registry_ = std::move(registry).value();
  }

  void Publish(std::string_view fixture) {
    const fs::path temporary = dir_ / ".incoming";
    testing::CopyFile(testing::Fixture(fixture), temporary);
    fs::rename(temporary, dir_ / "Test_Valid_backend.so");
  }
  uint64_t ActiveGeneration() { return registry_->Describe("TestValid")->active_generation; }

  TempDir shadow_root_;
  TempDir dir_;
  std::shared_ptr<loader::Loader> loader_;
  std::shared_ptr<BackendRegistry> registry_;
  Journal journal_;
};

// Every subscriber begins its commit (a runtime takes its turn to call backends) before any state
// lock is taken, so that backend code running under one subscriber's turn may still take another's
// state lock.
TEST_F(ChangeCoordinatorTest, EveryoneLocksAndRechecksBeforeAnyoneCommits) {
  FakeSubscriber a("a", journal_), b("b", journal_);
  Subscription sa = registry_->Subscribe(a, [] {});
  Subscription sb = registry_->Subscribe(b, [] {});
  Publish("ValidNext");
  RescanResult rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  ASSERT_EQ(rescan.outcomes[0].action, Action::kActivated) << rescan.outcomes[0].message;
  const std::string next = std::to_string(rescan.outcomes[0].generation);
  EXPECT_THAT(journal_.Take(),
              ElementsAre("a prepare " + next, "b prepare " + next, "a begin", "b begin", "a lock",
                          "b lock", "a current", "b current", "a commit", "b commit",
                          "a after commit", "b after commit", "a release", "b release"));
  EXPECT_EQ(ActiveGeneration(), rescan.outcomes[0].generation);
}

TEST_F(ChangeCoordinatorTest, ARefusalAbortsWhatOthersPreparedAndNothingSwitches) {
  FakeSubscriber a("a", journal_), b("b", journal_);
  b.refusal = Status(LoadReason::kPrepareFailed, "b cannot run it");
  Subscription sa = registry_->Subscribe(a, [] {});
  Subscription sb = registry_->Subscribe(b, [] {});
  const uint64_t serving = ActiveGeneration();
  Publish("ValidNext");
  RescanResult rescan = registry_->Rescan();
  ASSERT_EQ(rescan.outcomes.size(), 1u);
  EXPECT_EQ(rescan.outcomes[0].action, Action::kRejected);
  EXPECT_EQ(rescan.outcomes[0].error.reason(), LoadReason::kPrepareFailed);
  EXPECT_THAT(rescan.outcomes[0].error.message(), HasSubstr("b cannot run it"));
  const std::string next = std::to_string(rescan.outcomes[0].generation);
  EXPECT_THAT(journal_.Take(), ElementsAre("a prepare " + next, "b prepare " + next, "a abort"));
  EXPECT_EQ(a.committed, 0);
  EXPECT_EQ(ActiveGeneration(), serving);
  const auto status = registry_->Describe("TestValid").value();
  EXPECT_EQ(status.generations.front().state, GenerationState::kRejected);
  EXPECT_EQ(status.generations.front().rejection.reason(), LoadReason::kPrepareFailed);
}

TEST_F(ChangeCoordinatorTest, AStaleSubscriberMakesEveryonePrepareAgain) {
  FakeSubscriber a("a", journal_), b("b", journal_);
  b.stale_commits = 1;  // a network was loaded on b while it prepared
  Subscription sa = registry_->Subscribe(a, [] {});
  Subscription sb = registry_->Subscribe(b, [] {});
  Publish("ValidNext");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  const auto journal = journal_.Take();
  EXPECT_EQ(std::count(journal.begin(), journal.end(), "a abort"), 1);
  EXPECT_EQ(std::count(journal.begin(), journal.end(), "b stale"), 1);
  EXPECT_EQ(a.committed, 1);
  EXPECT_EQ(b.committed, 1);
}

TEST_F(ChangeCoordinatorTest, ASubscriberThatNeverSettlesRejectsTheGeneration) {
  FakeSubscriber a("a", journal_);
  a.stale_commits = 1000;
  Subscription sa = registry_->Subscribe(a, [] {});
  const uint64_t serving = ActiveGeneration();
  Publish("ValidNext");
  RescanResult rescan = registry_->Rescan();
  EXPECT_EQ(rescan.outcomes.at(0).action, Action::kRejected);
  EXPECT_EQ(rescan.outcomes.at(0).error.reason(), LoadReason::kPrepareFailed);
  EXPECT_THAT(rescan.outcomes.at(0).error.message(), HasSubstr("kept changing"));
  EXPECT_EQ(a.committed, 0);
  EXPECT_EQ(ActiveGeneration(), serving);
}

TEST_F(ChangeCoordinatorTest, AnUnsubscribedRuntimeIsNotAsked) {
  FakeSubscriber a("a", journal_);
  {
    Subscription sa = registry_->Subscribe(a, [] {});
  }
  Publish("ValidNext");
  ASSERT_EQ(registry_->Rescan().outcomes.at(0).action, Action::kActivated);
  EXPECT_TRUE(journal_.Take().empty());
}

// Issue 10: observers ran with the change lock held, so one that called back into the registry
// deadlocked. Events now arrive after every lock is released.
TEST_F(ChangeCoordinatorTest, ObserversMayCallBackIntoTheRegistry) {
  std::vector<std::string> seen;
  const uint64_t observer = registry_->AddObserver([&](const GenerationEvent& event) {
    if (event.kind != GenerationEvent::Kind::kActivated)
      return;
    seen.push_back(std::string(ToString(event.kind)) + " " + registry_->BackendIds().at(0));
    auto reloaded = registry_->Reload(event.backend_id);  // the change lock is free
    seen.push_back(reloaded.ok() ? std::string(ToString(reloaded->action)) : "error");
  });
  Publish("ValidNext");
  auto rescan = std::async(std::launch::async, [&] { return registry_->Rescan(); });
  ASSERT_EQ(rescan.wait_for(10s), std::future_status::ready) << "deadlocked";
  EXPECT_EQ(rescan.get().outcomes.at(0).action, Action::kActivated);
  EXPECT_THAT(seen, ElementsAre("activated TestValid", "unchanged"));
  registry_->RemoveObserver(observer);
}

}  // namespace
}  // namespace backplane
