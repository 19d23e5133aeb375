// The bounded cache of one loaded network's shape programs (what LoadedNetwork runs for one
// concrete set of input shapes), least recently used evicted first, and the claims that let one
// request build a program for a new shape while the requests that arrive meanwhile at that shape
// run without it instead of waiting. Private to runtime/src; a template only so that its unit
// test can cache plain values.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backplane/core/tensor.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane {

// A request's input shapes, in the order of the network's inputs: what a shape program is for.
using InputShapes = std::vector<Shape>;

struct InputShapesHash {
  std::size_t operator()(const InputShapes& shapes) const {
    // Boost's hash_combine over every dimension, with each rank mixed in so that [2,3],[4] and
    // [2],[3,4] differ.
    std::size_t hash = shapes.size();
    auto mix = [&hash](uint64_t value) {
      hash ^= std::hash<uint64_t>{}(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
    };
    for (const Shape& shape : shapes) {
      mix(shape.size());
      for (int64_t dim : shape)
        mix(static_cast<uint64_t>(dim));
    }
    return hash;
  }
};

// What happened to one network's shape programs, over every generation it was bound to: shared
// by the LoadedNetworks that replace each other on a hot swap (each has a fresh cache), so that
// the counters a metrics scrape reads only grow. Thread-safe: relaxed atomics, read one by one.
struct ShapeProgramCounters {
  std::atomic<uint64_t> hits{0};      // requests that ran a cached program
  std::atomic<uint64_t> misses{0};    // requests at a shape with no program ready
  std::atomic<uint64_t> compiles{0};  // programs built (one per new shape)
  // Runs a backend failed to compile at a concrete shape with an error (not a decline).
  std::atomic<uint64_t> compile_failures{0};
  std::atomic<uint64_t> evictions{0};
};

// Thread-safe. Every call takes one short lock: a hash lookup and a list splice, never a compile
// and never a program's destruction (an evicted program is released after the lock; the last
// holder destroys it, which LoadedNetwork hands to the reaper).
template <typename Program>
class ShapeProgramCache {
 public:
  // The right to build the program for one shape, given to exactly one of the requests that find
  // the shape missing, which may hand it to the background builder. Move-only; dropped without
  // Publish (the build failed: a bad request, an exception), it releases the shape so that a later
  // request claims it again.
  class Claim {
   public:
    Claim() = default;
    Claim(Claim&& other) noexcept
        : cache_(std::exchange(other.cache_, nullptr)), shapes_(std::move(other.shapes_)) {}
    Claim& operator=(Claim&&) = delete;
    ~Claim() {
      if (cache_ != nullptr)
        cache_->Release(shapes_, nullptr);
    }
    explicit operator bool() const { return cache_ != nullptr; }
    // Caches `program` for the claimed shape as the most recently used entry, evicting the least
    // recently used beyond capacity.
    void Publish(std::shared_ptr<const Program> program) {
      std::exchange(cache_, nullptr)->Release(shapes_, std::move(program));
    }

    // Lets go without touching the cache: for a claim that outlived its cache (a build queued
    // for a LoadedNetwork that was destroyed meanwhile). Calling it while the cache lives would
    // keep the shape claimed for good: no request would build it again.
    void Abandon() { cache_ = nullptr; }

   private:
    friend class ShapeProgramCache;
    Claim(ShapeProgramCache* cache, InputShapes shapes)
        : cache_(cache), shapes_(std::move(shapes)) {}
    ShapeProgramCache* cache_ = nullptr;
    InputShapes shapes_;
  };

  // Exactly one of: a hit (`program`); a miss that this caller must build (`claim`); a miss while
  // another request builds it (neither: run without a program).
  struct Lookup {
    std::shared_ptr<const Program> program;
    Claim claim;
  };

  // `capacity` >= 1 (LoadedNetwork keeps no cache at 0).
  ShapeProgramCache(std::size_t capacity, std::shared_ptr<ShapeProgramCounters> counters)
      : capacity_(capacity), counters_(std::move(counters)) {}
  ShapeProgramCache(const ShapeProgramCache&) = delete;
  ShapeProgramCache& operator=(const ShapeProgramCache&) = delete;

  Lookup Find(const InputShapes& shapes) BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (auto it = index_.find(shapes); it != index_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second);
      counters_->hits.fetch_add(1, std::memory_order_relaxed);
      return {.program = it->second->second};
    }
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    if (!building_.insert(shapes).second)
      return {};
    return {.claim = Claim(this, shapes)};
  }

  std::size_t capacity() const { return capacity_; }
  // The cached programs, most recently used first.
  std::vector<std::pair<InputShapes, std::shared_ptr<const Program>>> Entries() const
      BACKPLANE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return {recency_.begin(), recency_.end()};
  }

 private:
  using Entry = std::pair<InputShapes, std::shared_ptr<const Program>>;

  void Release(const InputShapes& shapes, std::shared_ptr<const Program> program)
      BACKPLANE_EXCLUDES(mutex_) {
    std::list<Entry> evicted;  // destroyed after the lock is released
    MutexLock lock(mutex_);
    building_.erase(shapes);
    if (program == nullptr)
      return;
    recency_.emplace_front(shapes, std::move(program));
    index_.insert_or_assign(recency_.front().first, recency_.begin());
    while (recency_.size() > capacity_) {
      index_.erase(recency_.back().first);
      evicted.splice(evicted.begin(), recency_, std::prev(recency_.end()));
      counters_->evictions.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const std::size_t capacity_;
  const std::shared_ptr<ShapeProgramCounters> counters_;
  mutable Mutex mutex_;
  std::list<Entry> recency_ BACKPLANE_GUARDED_BY(mutex_);  // most recently used first
  std::unordered_map<InputShapes, typename std::list<Entry>::iterator, InputShapesHash> index_
      BACKPLANE_GUARDED_BY(mutex_);
  std::unordered_set<InputShapes, InputShapesHash> building_ BACKPLANE_GUARDED_BY(mutex_);
};

}  // namespace backplane
