// The shape program cache alone: LRU order and counters against a plain model on seeded random
// accesses, claims, and evicted programs that live on while held. The shape program builder
// alone: its bounded queue, and what Shutdown drops and waits for.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <random>
#include <thread>

#include "shape_program_builder.hpp"
#include "shape_program_cache.hpp"

namespace backplane::shape_program_cache_test {
namespace {

using Cache = ShapeProgramCache<int>;

InputShapes Key(int64_t batch) {
  return {{batch, 4}};
}

TEST(ShapeProgramCacheTest, LruOrderMatchesAPlainModelOnSeededRandomAccesses) {
  const auto seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  for (int round = 0; round < 20; ++round) {
    const std::size_t capacity = 1 + random() % 6;
    const int keys = 1 + static_cast<int>(random() % 12);
    auto counters = std::make_shared<ShapeProgramCounters>();
    Cache cache(capacity, counters);
    std::deque<int> model;  // most recently used first
    uint64_t hits = 0, misses = 0, evictions = 0;
    for (int access = 0; access < 200; ++access) {
      const int key = static_cast<int>(random() % keys);
      auto found = cache.Find(Key(key));
      auto in_model = std::find(model.begin(), model.end(), key);
      if (in_model != model.end()) {
        ++hits;
        ASSERT_NE(found.program, nullptr) << "round " << round << " access " << access;
        EXPECT_EQ(*found.program, key);
        EXPECT_FALSE(found.claim);
        model.erase(in_model);
        model.push_front(key);
      } else {
        ++misses;
        ASSERT_EQ(found.program, nullptr) << "round " << round << " access " << access;
        ASSERT_TRUE(found.claim) << "nobody else builds it";
        if (random() % 5 == 0)
          continue;  // the build failed: the claim is dropped, nothing cached
        found.claim.Publish(std::make_shared<const int>(key));
        model.push_front(key);
        if (model.size() > capacity) {
          model.pop_back();
          ++evictions;
        }
      }
      const auto entries = cache.Entries();
      ASSERT_EQ(entries.size(), model.size()) << "round " << round << " access " << access;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        EXPECT_EQ(entries[i].first, Key(model[i])) << "position " << i;
        EXPECT_EQ(*entries[i].second, model[i]) << "position " << i;
      }
    }
    EXPECT_EQ(counters->hits.load(), hits);
    EXPECT_EQ(counters->misses.load(), misses);
    EXPECT_EQ(counters->evictions.load(), evictions);
  }
}

TEST(ShapeProgramCacheTest, OnlyTheFirstFinderOfAMissingShapeBuildsIt) {
  auto counters = std::make_shared<ShapeProgramCounters>();
  Cache cache(4, counters);
  auto first = cache.Find(Key(1));
  ASSERT_TRUE(first.claim);
  auto meanwhile = cache.Find(Key(1));
  EXPECT_FALSE(meanwhile.claim) << "one build per shape";
  EXPECT_EQ(meanwhile.program, nullptr);
  EXPECT_TRUE(cache.Find(Key(2)).claim) << "another shape is another build";

  first.claim.Publish(std::make_shared<const int>(1));
  auto after = cache.Find(Key(1));
  ASSERT_NE(after.program, nullptr);
  EXPECT_EQ(*after.program, 1);
  EXPECT_EQ(counters->misses.load(), 3u);
  EXPECT_EQ(counters->hits.load(), 1u);
}

TEST(ShapeProgramCacheTest, DroppedClaimLetsTheNextRequestBuild) {
  Cache cache(4, std::make_shared<ShapeProgramCounters>());
  { auto failed = cache.Find(Key(7)); }
  auto again = cache.Find(Key(7));
  EXPECT_TRUE(again.claim);
  EXPECT_TRUE(cache.Entries().empty());
}

TEST(ShapeProgramCacheTest, EvictedProgramLivesWhileARequestHoldsIt) {
  auto counters = std::make_shared<ShapeProgramCounters>();
  Cache cache(1, counters);
  cache.Find(Key(1)).claim.Publish(std::make_shared<const int>(1));
  std::shared_ptr<const int> running = cache.Find(Key(1)).program;
  std::weak_ptr<const int> watch = running;
  cache.Find(Key(2)).claim.Publish(std::make_shared<const int>(2));
  EXPECT_EQ(counters->evictions.load(), 1u);
  ASSERT_EQ(cache.Entries().size(), 1u);
  EXPECT_EQ(cache.Entries()[0].first, Key(2));
  EXPECT_FALSE(watch.expired()) << "evicted, but a request still runs it";
  EXPECT_EQ(*running, 1);
  running.reset();
  EXPECT_TRUE(watch.expired()) << "the last holder destroys it";
}

TEST(ShapeProgramCacheTest, KeysDifferByHowDimensionsSplitAcrossInputs) {
  const InputShapes a = {{2, 3}, {4}};
  const InputShapes b = {{2}, {3, 4}};
  EXPECT_NE(InputShapesHash{}(a), InputShapesHash{}(b));
  Cache cache(4, std::make_shared<ShapeProgramCounters>());
  cache.Find(a).claim.Publish(std::make_shared<const int>(1));
  EXPECT_TRUE(cache.Find(b).claim) << "a different key, not a hit";
}

// One build runs (held on a future), two fill a queue of 2, a fourth is refused and destroyed
// before Submit returns; Shutdown drops the two queued unrun and waits for the running one.
TEST(ShapeProgramBuilderTest, BoundedQueueAndShutdownDropsQueuedWaitsForRunning) {
  ShapeProgramBuilder builder(/*queue_capacity=*/2);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  ASSERT_TRUE(builder.Submit([&started, released, &ran] {
    started.set_value();
    released.wait();
    ran.fetch_add(1);
  }));
  started.get_future().wait();  // running: the queue is empty again
  auto token = std::make_shared<int>(0);
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(builder.Submit([token, &ran] { ran.fetch_add(100); })) << i;
  EXPECT_EQ(token.use_count(), 3);
  EXPECT_FALSE(builder.Submit([token, &ran] { ran.fetch_add(100); })) << "the queue is full";
  EXPECT_EQ(token.use_count(), 3) << "the refused build was destroyed inside Submit";

  std::thread shutdown([&] { builder.Shutdown(); });
  // Shutdown drops the queued builds first, then waits for the running one.
  while (token.use_count() != 1)
    std::this_thread::yield();
  release.set_value();
  shutdown.join();
  EXPECT_EQ(ran.load(), 1) << "the running build finished, the queued ones never ran";
  EXPECT_FALSE(builder.Submit([] {})) << "refused after Shutdown";
  builder.Shutdown();  // idempotent
}

}  // namespace
}  // namespace backplane::shape_program_cache_test
