// The grouping of one dynamic batcher, without threads or clocks: which waiting requests leave
// together, and when. The batcher holds one BatchQueue under its mutex; whoever adds a parsed
// request passes the time and executes what it hands back, and the dispatcher thread sends what
// becomes due with time (dynamic_batcher.hpp). Tested with
// made-up times like RequestsToDispatch, its core rule.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backplane/core/tensor.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane::server {

// How many of the waiting requests of one group leave now as one batch; 0: wait. `rows` are the
// rows of each waiting request, oldest first, each in 1..max_batch_size (0-row requests count as
// rows of 0). The rule (docs/operators.md, "Dynamic batching"):
// - at least max_batch_size rows waiting: the longest run from the oldest that fits in
//   max_batch_size;
// - else the longest run from the oldest whose rows add up exactly to a preferred batch size,
//   when there is one;
// - else, when the oldest has waited max_queue_delay_us or skips its wait (`delay_passed`; see
//   CompanyOutlook): every waiting request;
// - else 0.
std::size_t RequestsToDispatch(std::span<const int64_t> rows, int64_t max_batch_size,
                               std::span<const int64_t> preferred_batch_sizes, bool delay_passed);

// Whether a request that finds no company waits max_queue_delay_us for some. A wait costs its
// request the whole delay and pays only when others arrive meanwhile: one client that sends its
// next request after each answer never brings company, and paid the delay on every request for
// nothing, plus the cost of waking an idle machine (bench/batching_bench.sh). So after kVainWaits
// waits in a row that gathered nobody, a lone request leaves at once; every kProbeEvery-th still
// waits, to see whether company has come; and any batch of two or more requests (a wait that paid,
// or requests that met while every slot was busy) restores waiting. Thread-compatible: its
// BatchQueue's.
class CompanyOutlook {
 public:
  static constexpr int kVainWaits = 8;
  static constexpr int kProbeEvery = 16;
  // For a request that would start a wait (nothing of its group waits): true when it should not.
  bool SkipWait();
  // A batch of `requests` left; `waited`: because its oldest request's delay passed.
  void Record(std::size_t requests, bool waited);

 private:
  int vain_waits_in_a_row_ = 0;  // at most kVainWaits
  int skipped_since_probe_ = 0;
};

// The key under which a request joins others (BatchRequest::key): the datatype and every
// dimension but the first of each input, so that requests with equal keys can be joined along the
// first dimension, and the request's per-call backend options, since one execution runs with one
// set of them: a request must never run with another client's options.
std::string BatchKey(const std::vector<Tensor>& inputs, const CallOptions& call_options);

// One request waiting for a batch.
struct BatchRequest {
  using Clock = std::chrono::steady_clock;
  uint64_t sequence = 0;  // arrival order, from 0 without gaps
  Clock::time_point arrived;
  std::optional<Clock::time_point> deadline;
  std::vector<Tensor> inputs;
  int64_t rows = 0;
  // Requests join only requests of the same key (BatchKey: the datatypes and every dimension but
  // the first of their inputs, and the per-call options).
  std::string key;
  CallOptions call_options;  // the request's per-call backend options, which its batch runs with
  Runtime::ExecuteCallback done;
  // Its parser answered it (its parse failed, or its deadline had passed): it only marks its
  // place in the arrival order.
  bool answered = false;
  // Zero rows: it joins no batch and leaves at once, alone (its key is its own).
  bool alone = false;
  // Set by the queue: it found its group empty when waiting had not paid lately, and leaves
  // without waiting (CompanyOutlook).
  bool skips_wait = false;
};

// Thread-compatible: the batcher calls it under its mutex.
class BatchQueue {
 public:
  using Clock = BatchRequest::Clock;
  struct Options {
    std::chrono::microseconds max_queue_delay{0};
    bool preserve_ordering = false;
    int64_t max_batch_size = 1;
    std::vector<int64_t> preferred_batch_sizes;      // ascending
    std::atomic<uint64_t>* waits_skipped = nullptr;  // counted when a lone request skips its wait
  };
  explicit BatchQueue(Options options) : options_(std::move(options)) {}

  // Takes a parsed request, or the mark of one its parser answered, in any order: requests join
  // their groups in arrival order (a batch is the oldest requests of its group), so one parsed
  // ahead of an earlier arrival waits here until that one comes. Returns how many marks this
  // consumed: requests that were answered and no longer wait.
  std::size_t Add(BatchRequest request);
  // The earliest moment something is due without news: a deadline, or, when an execution slot
  // is free, a group's oldest request reaching the end of its wait (with preserve_ordering only
  // the group holding the oldest request may leave, so only its wait counts). nullopt: nothing.
  std::optional<Clock::time_point> NextDue(bool slot_free) const;
  // The requests whose deadline passed before `now`, out of their groups.
  std::vector<BatchRequest> TakeExpired(Clock::time_point now);
  // The batch due at `now`, from the group whose oldest request is oldest among those due
  // (RequestsToDispatch per group; with preserve_ordering, the group holding the oldest request
  // only, with requests older than every other group's oldest: an unbroken run of arrivals).
  // Empty: none is due.
  std::vector<BatchRequest> TakeBatch(Clock::time_point now);
  // Everything held, grouped or not (the batcher is stopping); marks are dropped.
  std::vector<BatchRequest> TakeAll();

 private:
  // When the oldest request of a group may leave without more company.
  Clock::time_point WaitEnds(const BatchRequest& oldest) const {
    return oldest.skips_wait ? oldest.arrived : oldest.arrived + options_.max_queue_delay;
  }
  // The group holding the oldest waiting request; null when none waits.
  const std::deque<BatchRequest>* OldestGroup() const;

  const Options options_;
  std::map<std::string, std::deque<BatchRequest>> groups_;  // never an empty group
  std::map<uint64_t, BatchRequest> out_of_order_;           // parsed ahead of an earlier arrival
  uint64_t next_to_group_ = 0;
  CompanyOutlook outlook_;
};

}  // namespace backplane::server
