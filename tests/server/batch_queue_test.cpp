// BatchQueue, the dynamic batcher's grouping without threads or clocks, against the rules
// docs/operators.md ("Dynamic batching") states, on seeded random arrivals with made-up times:
// requests parsed out of order, several keys, zero-row requests, deadlines, parser-answered marks,
// and preserve_ordering on and off.
#include "serving/batch_queue.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.hpp"

namespace backplane::testing {
namespace {

using server::BatchQueue;
using server::BatchRequest;
using Clock = BatchQueue::Clock;
using std::chrono::microseconds;

struct Sent {
  std::string key;
  int64_t rows = 0;
  bool answered = false;  // a parser's mark
  std::optional<Clock::time_point> deadline;
};

// One round of the simulation: what was sent and what left, with the checks of each departure.
class Round {
 public:
  Round(BatchQueue::Options options, std::mt19937_64& random)
      : options_(options), queue_(options), random_(random) {}

  int Uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  // Adds `count` new arrivals, handed to the queue in a shuffled order (parsers finish out of
  // order), some of them held back for a later call.
  void Arrive(int count) {
    for (int i = 0; i < count; ++i) {
      Sent sent;
      const uint64_t sequence = sent_.size();
      sent.answered = Uniform(0, 9) == 0;
      sent.rows = Uniform(0, 12) == 0 ? 0 : Uniform(1, static_cast<int>(options_.max_batch_size));
      sent.key = sent.rows == 0 ? "alone#" + std::to_string(sequence)
                                : std::string(1, static_cast<char>('a' + Uniform(0, 2)));
      if (Uniform(0, 4) == 0)
        sent.deadline = now_ + microseconds(Uniform(0, 3000));
      sent_.push_back(sent);
      held_.push_back(sequence);
    }
    std::shuffle(held_.begin(), held_.end(), random_);
    const std::size_t hand = held_.empty() ? 0 : static_cast<std::size_t>(Uniform(0, held_.size()));
    for (std::size_t i = 0; i < hand; ++i) {
      const uint64_t sequence = held_.back();
      held_.pop_back();
      const Sent& sent = sent_[sequence];
      BatchRequest request{.sequence = sequence,
                           .arrived = now_,
                           .deadline = sent.deadline,
                           .rows = sent.rows,
                           .key = sent.key,
                           .answered = sent.answered,
                           .alone = sent.rows == 0};
      added_.insert(sequence);
      queue_.Add(std::move(request));
    }
  }

  void Advance(int us) { now_ += microseconds(us); }

  // Expires and dispatches as the dispatcher does with `slots` free.
  void Act(int slots) {
    for (auto& expired : queue_.TakeExpired(now_)) {
      ASSERT_TRUE(expired.deadline.has_value());
      ASSERT_GT(now_, *expired.deadline);
      Leave(expired.sequence, "expired");
    }
    for (int slot = 0; slot < slots; ++slot) {
      auto batch = queue_.TakeBatch(now_);
      if (batch.empty())
        break;
      CheckBatch(batch);
    }
  }

  // Hands every held arrival over, lets every wait end and takes every batch: all requests
  // leave, and nothing is left for TakeAll.
  void Drain() {
    while (!held_.empty())
      Arrive(0);
    Advance(10'000'000);
    for (int i = 0; i < 100'000; ++i) {
      if (queue_.NextDue(true) == std::nullopt)
        break;
      Act(1);
      if (::testing::Test::HasFatalFailure())
        return;
    }
    EXPECT_EQ(queue_.NextDue(true), std::nullopt) << "something still waits";
    EXPECT_TRUE(queue_.TakeAll().empty()) << "requests left after every wait ended";
    for (uint64_t sequence = 0; sequence < sent_.size(); ++sequence) {
      if (!sent_[sequence].answered) {
        EXPECT_EQ(left_.count(sequence), 1u) << "request " << sequence << " never left";
      }
    }
  }

 private:
  void Leave(uint64_t sequence, const char* how) {
    ASSERT_LT(sequence, sent_.size());
    ASSERT_FALSE(sent_[sequence].answered) << "a mark left " << how;
    ASSERT_TRUE(left_.insert(sequence).second) << "request " << sequence << " left twice";
  }

  void CheckBatch(const std::vector<BatchRequest>& batch) {
    int64_t rows = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const BatchRequest& request = batch[i];
      rows += request.rows;
      ASSERT_EQ(request.key, batch.front().key) << "a batch mixed keys";
      if (i > 0) {
        ASSERT_GT(request.sequence, batch[i - 1].sequence) << "a batch out of arrival order";
      }
      // Requests join in arrival order: every earlier arrival was handed over.
      for (uint64_t earlier = 0; earlier < request.sequence; ++earlier)
        ASSERT_EQ(added_.count(earlier), 1u) << request.sequence << " grouped before " << earlier;
      // A batch is the oldest requests of its group: every earlier one of its key left.
      for (uint64_t earlier = 0; earlier < request.sequence; ++earlier) {
        if (sent_[earlier].key == request.key && !sent_[earlier].answered &&
            std::none_of(batch.begin(), batch.end(),
                         [&](const BatchRequest& r) { return r.sequence == earlier; })) {
          ASSERT_EQ(left_.count(earlier), 1u)
              << request.sequence << " left before " << earlier << " of its key";
        }
      }
    }
    ASSERT_LE(rows, options_.max_batch_size) << "a batch past max_batch_size";
    if (batch.front().alone) {
      ASSERT_EQ(batch.size(), 1u) << "a zero-row request joined others";
    }
    if (options_.preserve_ordering) {
      // An unbroken run of arrivals, after everything that left before it.
      for (uint64_t earlier = 0; earlier < batch.front().sequence; ++earlier) {
        if (!sent_[earlier].answered) {
          ASSERT_EQ(left_.count(earlier), 1u) << batch.front().sequence << " overtook " << earlier;
        }
      }
      for (uint64_t between = batch.front().sequence; between < batch.back().sequence; ++between) {
        const bool in_batch = std::any_of(batch.begin(), batch.end(), [&](const BatchRequest& r) {
          return r.sequence == between;
        });
        ASSERT_TRUE(in_batch || sent_[between].answered || left_.count(between) == 1)
            << "the run " << batch.front().sequence << ".." << batch.back().sequence << " skipped "
            << between;
      }
    }
    // Early (its oldest request's wait not over, and not cut short by preserve_ordering): only
    // because it is full or of a preferred size.
    const BatchRequest& oldest = batch.front();
    const bool wait_over = oldest.skips_wait || now_ >= oldest.arrived + options_.max_queue_delay;
    if (!wait_over && !options_.preserve_ordering) {
      const auto& preferred = options_.preferred_batch_sizes;
      const bool preferred_size =
          std::find(preferred.begin(), preferred.end(), rows) != preferred.end();
      int64_t waiting_rows = rows;  // the whole group waiting when it left
      for (uint64_t sequence : added_) {
        if (sent_[sequence].key == oldest.key && !sent_[sequence].answered &&
            left_.count(sequence) == 0 &&
            std::none_of(batch.begin(), batch.end(),
                         [&](const BatchRequest& r) { return r.sequence == sequence; }))
          waiting_rows += sent_[sequence].rows;
      }
      ASSERT_TRUE(preferred_size || waiting_rows >= options_.max_batch_size)
          << "a batch of " << rows << " rows left before its wait ended";
    }
    for (const auto& request : batch)
      Leave(request.sequence, "in a batch");
  }

  const BatchQueue::Options options_;
  BatchQueue queue_;
  std::mt19937_64& random_;
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  std::vector<Sent> sent_;      // by sequence
  std::vector<uint64_t> held_;  // arrived, not handed to the queue yet
  std::set<uint64_t> added_;    // handed to the queue
  std::set<uint64_t> left_;     // in a batch, or expired
};

TEST(BatchQueueTest, RandomArrivalsLeaveOnceInOrderAndWithinTheRules) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto uniform = [&](int low, int high) {
      return std::uniform_int_distribution<int>(low, high)(random);
    };
    BatchQueue::Options options{.max_queue_delay = microseconds(uniform(0, 2) * 1000),
                                .preserve_ordering = uniform(0, 2) == 0,
                                .max_batch_size = uniform(1, 8)};
    for (int size = 1; size <= options.max_batch_size; ++size) {
      if (uniform(0, 3) == 0)
        options.preferred_batch_sizes.push_back(size);
    }
    Round simulated(options, random);
    for (int step = 0; step < 40; ++step) {
      simulated.Arrive(uniform(0, 4));
      simulated.Advance(uniform(0, 1500));
      simulated.Act(uniform(0, 3));
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "step " << step;
    }
    simulated.Drain();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
}

// NextDue is what the dispatcher sleeps until: a request's wait end (with a slot free) or its
// deadline, and nothing when nothing waits.
TEST(BatchQueueTest, NextDueIsTheEarliestWaitEndOrDeadline) {
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  BatchQueue queue({.max_queue_delay = microseconds(1000), .max_batch_size = 8});
  EXPECT_EQ(queue.NextDue(true), std::nullopt);
  queue.Add(BatchRequest{.sequence = 0, .arrived = t0, .rows = 1, .key = "a"});
  EXPECT_EQ(queue.NextDue(true), t0 + microseconds(1000));
  EXPECT_EQ(queue.NextDue(false), std::nullopt) << "no slot free: a wait's end changes nothing";
  queue.Add(BatchRequest{
      .sequence = 1, .arrived = t0, .deadline = t0 + microseconds(300), .rows = 1, .key = "b"});
  EXPECT_EQ(queue.NextDue(true), t0 + microseconds(300));
  EXPECT_EQ(queue.NextDue(false), t0 + microseconds(300)) << "deadlines count without a slot";
  EXPECT_TRUE(queue.TakeBatch(t0 + microseconds(999)).empty()) << "left before its wait ended";
  const auto expired = queue.TakeExpired(t0 + microseconds(301));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired.front().sequence, 1u);
  const auto batch = queue.TakeBatch(t0 + microseconds(1000));
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch.front().sequence, 0u);
  EXPECT_EQ(queue.NextDue(true), std::nullopt);
}

// A request parsed ahead of an earlier arrival is grouped only once that one comes, or once its
// parser's mark does.
TEST(BatchQueueTest, ARequestParsedAheadWaitsForTheEarlierArrival) {
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  BatchQueue queue({.max_queue_delay = microseconds(0), .max_batch_size = 8});
  EXPECT_EQ(queue.Add(BatchRequest{.sequence = 1, .arrived = t0, .rows = 2, .key = "a"}), 0u);
  EXPECT_TRUE(queue.TakeBatch(t0 + std::chrono::hours(1)).empty()) << "grouped before 0 came";
  EXPECT_EQ(queue.Add(BatchRequest{.sequence = 0, .answered = true}), 1u) << "the mark consumed";
  const auto batch = queue.TakeBatch(t0);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch.front().sequence, 1u);
}

// Per-call options are part of the key: one execution runs with one set of them, so requests whose
// options differ in any way (a value, its type, a backend, none at all) never share a batch, and
// requests with equal ones do.
TEST(BatchQueueTest, RequestsWithDifferentCallOptionsNeverShareABatch) {
  std::vector<Tensor> inputs;
  inputs.emplace_back(TensorInfo{DataType::kFloat32, {1, 4}});
  const CallOptions none;
  const CallOptions one = {{"CpuAcc", {{"intra_op_threads", int64_t{1}}}}};
  const std::vector<CallOptions> distinct = {
      none,
      one,
      {{"CpuAcc", {{"intra_op_threads", int64_t{2}}}}},
      {{"CpuAcc", {{"intra_op_threads", 1.0}}}},
      {{"CpuAcc", {{"intra_op_threads", std::string("1")}}}},
      {{"CpuRef", {{"intra_op_threads", int64_t{1}}}}},
      {{"CpuAcc", {{"intra_op_threads", int64_t{1}}, {"batch_split", std::string("never")}}}},
      {{"TestValid", {{"call_offset", 0.1000001}}}},
      {{"TestValid", {{"call_offset", 0.1000002}}}},
      {{"A", {{"b.c", true}}}},
      {{"A.b", {{"c", true}}}},
  };
  std::set<std::string> keys;
  for (const auto& options : distinct)
    keys.insert(server::BatchKey(inputs, options));
  EXPECT_EQ(keys.size(), distinct.size());
  EXPECT_EQ(server::BatchKey(inputs, one), server::BatchKey(inputs, CallOptions(one)));

  // Through the queue: two groups leave as two batches, each with its own options.
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  BatchQueue queue({.max_queue_delay = microseconds(100), .max_batch_size = 8});
  uint64_t sequence = 0;
  for (const CallOptions* options : {&none, &one, &none, &one}) {
    queue.Add(BatchRequest{.sequence = sequence++,
                           .arrived = t0,
                           .rows = 1,
                           .key = server::BatchKey(inputs, *options),
                           .call_options = *options});
  }
  std::vector<std::vector<BatchRequest>> batches;
  for (auto batch = queue.TakeBatch(t0 + microseconds(200)); !batch.empty();
       batch = queue.TakeBatch(t0 + microseconds(200))) {
    batches.push_back(std::move(batch));
  }
  ASSERT_EQ(batches.size(), 2u);
  for (const auto& batch : batches) {
    ASSERT_EQ(batch.size(), 2u);
    EXPECT_EQ(batch[0].call_options, batch[1].call_options);
  }
  EXPECT_NE(batches[0][0].call_options, batches[1][0].call_options);
}

}  // namespace
}  // namespace backplane::testing
