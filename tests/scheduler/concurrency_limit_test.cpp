// The limit on a network's executions at once: turns in arrival order, handed on by the thread
// that frees a slot, deadlines of waiters, limit changes. All but the last test run on one thread:
// every callback runs inline, so the order of events is the test's own.
#include "backplane/scheduler/concurrency_limit.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace backplane::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Slot = ConcurrencyLimit::Slot;

// Keeps the slots handed to numbered requests, and what each was told.
class Turns {
 public:
  // One at a time: a slot freed here hands its turn on, and a callback of this very object may
  // take it (a list being cleared would not see the slot added meanwhile, and leak it).
  ~Turns() {
    while (!slots_.empty())
      slots_.pop_front();
  }
  ConcurrencyLimit::TurnCallback For(int request) {
    return [this, request](Result<Slot> turn) {
      if (turn.ok()) {
        started_.push_back(request);
        slots_.emplace_back(request, std::move(turn).value());
      } else {
        refused_.push_back(request);
        errors_.push_back(turn.error());
      }
    };
  }
  // Frees the slot of `request`, which hands it on from this thread.
  void Finish(int request) {
    for (auto it = slots_.begin(); it != slots_.end(); ++it) {
      if (it->first == request) {
        slots_.erase(it);
        return;
      }
    }
    ADD_FAILURE() << "request " << request << " holds no slot";
  }
  const std::vector<int>& started() const { return started_; }
  const std::vector<int>& refused() const { return refused_; }
  const std::vector<Status>& errors() const { return errors_; }

 private:
  std::vector<int> started_;
  std::vector<int> refused_;
  std::vector<Status> errors_;
  std::list<std::pair<int, Slot>> slots_;  // a Slot cannot be assigned: no vector
};

Clock::time_point Passed() {
  return Clock::now() - std::chrono::seconds(1);
}
Clock::time_point FarAway() {
  return Clock::now() + std::chrono::hours(1);
}

TEST(ConcurrencyLimitTest, WithoutALimitEveryRequestStartsAtOnce) {
  auto limit = ConcurrencyLimit::Create(0);
  Turns turns;
  for (int request = 1; request <= 5; ++request)
    limit->Acquire(turns.For(request));
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(limit->counts().running, 5u);
  EXPECT_EQ(limit->counts().waiting, 0u);
}

TEST(ConcurrencyLimitTest, RequestsBeyondTheLimitWaitAndStartInArrivalOrderAsSlotsFree) {
  auto limit = ConcurrencyLimit::Create(2);
  Turns turns;
  for (int request = 1; request <= 5; ++request)
    limit->Acquire(turns.For(request));
  EXPECT_THAT(turns.started(), ElementsAre(1, 2));
  EXPECT_EQ(limit->counts().running, 2u);
  EXPECT_EQ(limit->counts().waiting, 3u);

  turns.Finish(2);  // the second finishes first: the first waiter still goes next
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3));
  turns.Finish(1);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(limit->counts().running, 2u);
  turns.Finish(3);
  turns.Finish(4);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3, 4, 5));
  turns.Finish(5);
  EXPECT_EQ(limit->counts().running, 0u);
  EXPECT_EQ(limit->counts().waiting, 0u);
  EXPECT_TRUE(turns.refused().empty());
}

// A request arriving while others wait queues behind them even at the moment a slot frees: the
// slot goes to the first waiter inside the release, never to whoever asks next.
TEST(ConcurrencyLimitTest, ANewRequestNeverOvertakesAWaiter) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  limit->Acquire(turns.For(1));
  limit->Acquire(turns.For(2));
  turns.Finish(1);
  limit->Acquire(turns.For(3));
  EXPECT_THAT(turns.started(), ElementsAre(1, 2));
  EXPECT_EQ(limit->counts().waiting, 1u);
}

TEST(ConcurrencyLimitTest, AWaiterWhoseDeadlinePassedIsRefusedAndItsTurnGoesToTheNext) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  limit->Acquire(turns.For(1));
  limit->Acquire(turns.For(2), Passed());
  limit->Acquire(turns.For(3), FarAway());
  // Request 2's deadline had passed when it arrived, and it was refused at once: the queue moved.
  EXPECT_THAT(turns.refused(), ElementsAre(2));
  turns.Finish(1);
  EXPECT_THAT(turns.started(), ElementsAre(1, 3));
  ASSERT_EQ(turns.errors().size(), 1u);
  EXPECT_EQ(turns.errors()[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(turns.errors()[0].message(),
              HasSubstr("deadline passed while it waited for one of its network's 1 instance(s); "
                        "it was not run"));
}

// The deadline of a request that waits passes while it waits: it is refused when the queue next
// moves, even from behind another waiter, and gives its place up.
TEST(ConcurrencyLimitTest, AnExpiredWaiterBehindOthersIsRefusedWhenTheQueueNextMoves) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  limit->Acquire(turns.For(1));
  limit->Acquire(turns.For(2));
  const auto soon = Clock::now() + std::chrono::milliseconds(1);
  limit->Acquire(turns.For(3), soon);
  limit->Acquire(turns.For(4));
  while (Clock::now() <= soon)
    std::this_thread::yield();
  EXPECT_TRUE(turns.refused().empty()) << "nothing moved the queue yet";
  turns.Finish(1);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2));
  EXPECT_THAT(turns.refused(), ElementsAre(3));
  EXPECT_EQ(limit->counts().waiting, 1u);
  turns.Finish(2);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 4));
}

// A request that started keeps its turn whatever its deadline: only waiting is bounded by it.
TEST(ConcurrencyLimitTest, ARequestWithAFreeSlotStartsWithinItsDeadline) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  limit->Acquire(turns.For(1), FarAway());
  EXPECT_THAT(turns.started(), ElementsAre(1));
}

TEST(ConcurrencyLimitTest, ARaisedLimitStartsWaitersAtOnceALoweredOneLetsTheRunningFinish) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  for (int request = 1; request <= 6; ++request)
    limit->Acquire(turns.For(request));
  limit->SetLimit(3);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3));

  limit->SetLimit(1);
  EXPECT_EQ(limit->counts().running, 3u) << "nothing is stopped";
  turns.Finish(1);
  turns.Finish(2);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3)) << "still one running, the limit";
  turns.Finish(3);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3, 4));

  limit->SetLimit(0);
  EXPECT_THAT(turns.started(), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(limit->counts().limit, 0u);
  EXPECT_EQ(limit->counts().waiting, 0u);
}

// A callback that drops its slot at once (a request that fails before it runs) hands the turn on
// from inside the release that gave it: the queue still drains in order, with no lock held.
TEST(ConcurrencyLimitTest, ASlotDroppedInsideItsCallbackHandsTheTurnOn) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  std::vector<int> dropped;
  limit->Acquire(turns.For(1));
  for (int request = 2; request <= 4; ++request)
    limit->Acquire([&dropped, request](Result<Slot>) { dropped.push_back(request); });
  limit->Acquire(turns.For(5));
  turns.Finish(1);
  EXPECT_THAT(dropped, ElementsAre(2, 3, 4));
  EXPECT_THAT(turns.started(), ElementsAre(1, 5));
}

TEST(ConcurrencyLimitTest, ASlotKeepsItsLimitAlive) {
  Turns turns;
  {
    auto limit = ConcurrencyLimit::Create(1);
    limit->Acquire(turns.For(1));
  }
  turns.Finish(1);  // the last owner: must not touch a freed limit
}

// The synchronous side: a caller blocked in AcquireBlocking waits in the same queue and wakes on
// the thread that frees the slot.
TEST(ConcurrencyLimitTest, ABlockedCallerWaitsForItsTurnInTheSameQueue) {
  auto limit = ConcurrencyLimit::Create(1);
  Turns turns;
  limit->Acquire(turns.For(1));
  std::atomic<bool> started{false};
  std::thread caller([&] {
    Slot slot = limit->AcquireBlocking();
    started.store(true);
  });
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (limit->counts().waiting == 0 && Clock::now() < until)
    std::this_thread::yield();
  if (limit->counts().waiting != 1u) {
    caller.join();
    FAIL() << "the caller did not wait";
  }
  limit->Acquire(turns.For(3));  // behind the blocked caller
  EXPECT_FALSE(started.load());
  turns.Finish(1);
  caller.join();  // its slot is freed as it returns, which starts request 3
  EXPECT_TRUE(started.load());
  EXPECT_THAT(turns.started(), ElementsAre(1, 3));
}

}  // namespace
}  // namespace backplane::scheduler
