// The request scheduler: bounded admission, arena execution, deadlines, draining.
#include "backplane/scheduler/request_scheduler.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <future>
#include <latch>

namespace backplane::scheduler {
namespace {

using ::testing::HasSubstr;

TEST(RequestSchedulerTest, AdmitsUpToTheLimitThenRefusesAtOnce) {
  RequestScheduler scheduler({.max_in_flight = 2});
  auto first = scheduler.Admit();
  auto second = scheduler.Admit();
  ASSERT_TRUE(first.ok() && second.ok());
  auto third = scheduler.Admit();
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.error().message(), HasSubstr("overloaded: 2 requests in flight (limit 2)"));
  { auto released = std::move(first).value(); }
  EXPECT_EQ(scheduler.in_flight(), 1u);
  EXPECT_TRUE(scheduler.Admit().ok());
}

TEST(RequestSchedulerTest, RunsWorkInItsArena) {
  RequestScheduler scheduler({.max_threads = 1});
  int concurrency = 0;
  Status status = scheduler.RunInArena([&] {
    concurrency = tbb::this_task_arena::max_concurrency();
    return Status::Ok();
  });
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(concurrency, 1);
}

TEST(RequestSchedulerTest, EnqueuedWorkRunsAndReportsItsStatus) {
  RequestScheduler scheduler;
  std::promise<Status> finished;
  scheduler.Enqueue(
      scheduler.Admit().value(), [] { return InvalidArgument("bad input"); },
      [&](Status status) { finished.set_value(std::move(status)); });
  Status status = finished.get_future().get();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "bad input");
}

TEST(RequestSchedulerTest, RequestWhoseDeadlinePassedWhileQueuedIsNotRun) {
  RequestScheduler scheduler;
  bool ran = false;
  std::promise<Status> finished;
  scheduler.Enqueue(
      scheduler.Admit().value(),
      [&] {
        ran = true;
        return Status::Ok();
      },
      [&](Status status) { finished.set_value(std::move(status)); },
      Clock::now() - std::chrono::milliseconds(1));
  Status status = finished.get_future().get();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(ran);
}

TEST(RequestSchedulerTest, DestructorWaitsForRequestsInFlight) {
  std::latch started(1);
  std::atomic<bool> finished{false};
  {
    RequestScheduler scheduler;
    scheduler.Enqueue(
        scheduler.Admit().value(),
        [&] {
          started.count_down();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          finished = true;
          return Status::Ok();
        },
        [](Status) {});
    started.wait();
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace backplane::scheduler
