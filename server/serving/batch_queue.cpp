#include "serving/batch_queue.hpp"

#include <algorithm>
#include <charconv>
#include <utility>

namespace backplane::server {

std::string BatchKey(const std::vector<Tensor>& inputs, const CallOptions& call_options) {
  std::string key;
  for (const auto& input : inputs) {
    key += ToString(input.info().type);
    for (std::size_t d = 1; d < input.info().shape.size(); ++d) {
      key += ',';
      key += std::to_string(input.info().shape[d]);
    }
    key += ';';
  }
  // Unambiguous whatever the names hold: each name and value is prefixed with its length, each
  // value with its type (1 and 1.0 and "1" are different options), a double in its shortest
  // exact form (ToString's six decimals would join 0.1000001 and 0.1000002).
  const auto append = [&key](std::string_view text) {
    key += std::to_string(text.size());
    key += ':';
    key += text;
  };
  for (const auto& [backend_id, values] : call_options) {
    key += '|';
    append(backend_id);
    for (const auto& [name, value] : values) {
      append(name);
      key += std::to_string(value.index());
      if (const auto* real = std::get_if<double>(&value)) {
        char digits[32];
        const auto written = std::to_chars(digits, digits + sizeof digits, *real);
        append(std::string_view(digits, written.ptr - digits));
      } else {
        append(ToString(value));
      }
    }
  }
  return key;
}

std::size_t RequestsToDispatch(std::span<const int64_t> rows, int64_t max_batch_size,
                               std::span<const int64_t> preferred_batch_sizes, bool delay_passed) {
  // The longest run from the oldest that fits in `limit` rows, and whether it has exactly `limit`.
  const auto fitting = [&](int64_t limit) {
    std::size_t count = 0;
    int64_t total = 0;
    while (count < rows.size() && total + rows[count] <= limit)
      total += rows[count++];
    return std::pair{count, total};
  };
  int64_t waiting_rows = 0;
  for (int64_t row_count : rows)
    waiting_rows += row_count;
  if (waiting_rows >= max_batch_size)
    return fitting(max_batch_size).first;
  // Largest first: the first exact match is the largest batch of a preferred size.
  for (auto size = preferred_batch_sizes.rbegin(); size != preferred_batch_sizes.rend(); ++size) {
    if (*size > waiting_rows)
      continue;
    // The longest run of at most `size` rows; with zero-row requests after it, still exact.
    const auto [count, total] = fitting(*size);
    if (total == *size)
      return count;
  }
  return delay_passed ? rows.size() : 0;
}

bool CompanyOutlook::SkipWait() {
  if (vain_waits_in_a_row_ < kVainWaits)
    return false;
  if (++skipped_since_probe_ < kProbeEvery)
    return true;
  skipped_since_probe_ = 0;
  return false;  // the probe
}

void CompanyOutlook::Record(std::size_t requests, bool waited) {
  if (requests > 1) {
    vain_waits_in_a_row_ = 0;
    skipped_since_probe_ = 0;
  } else if (waited) {
    vain_waits_in_a_row_ = std::min(vain_waits_in_a_row_ + 1, kVainWaits);
  }
}

std::size_t BatchQueue::Add(BatchRequest request) {
  const uint64_t sequence = request.sequence;
  out_of_order_.emplace(sequence, std::move(request));
  std::size_t answered = 0;
  while (!out_of_order_.empty() && out_of_order_.begin()->first == next_to_group_) {
    BatchRequest next = std::move(out_of_order_.begin()->second);
    out_of_order_.erase(out_of_order_.begin());
    ++next_to_group_;
    if (next.answered) {
      ++answered;
      continue;
    }
    std::deque<BatchRequest>& group = groups_[next.key];
    if (next.alone) {
      next.skips_wait = true;  // nothing can join it: a wait would only delay it
    } else if (group.empty()) {
      next.skips_wait = outlook_.SkipWait();
      if (next.skips_wait && options_.waits_skipped != nullptr)
        options_.waits_skipped->fetch_add(1, std::memory_order_relaxed);
    }
    group.push_back(std::move(next));
  }
  return answered;
}

const std::deque<BatchRequest>* BatchQueue::OldestGroup() const {
  const std::deque<BatchRequest>* oldest = nullptr;
  for (const auto& [key, waiting] : groups_) {
    if (oldest == nullptr || waiting.front().sequence < oldest->front().sequence)
      oldest = &waiting;
  }
  return oldest;
}

std::optional<BatchQueue::Clock::time_point> BatchQueue::NextDue(bool slot_free) const {
  std::optional<Clock::time_point> due;
  const auto consider = [&due](Clock::time_point when) { due = due ? std::min(*due, when) : when; };
  // With preserve_ordering another group's wait is no reason to wake: it may not leave (the
  // dispatcher would spin).
  const std::deque<BatchRequest>* oldest = OldestGroup();
  for (const auto& [key, waiting] : groups_) {
    if (slot_free && (!options_.preserve_ordering || &waiting == oldest))
      consider(WaitEnds(waiting.front()));
    for (const auto& request : waiting) {
      if (request.deadline)
        consider(*request.deadline);
    }
  }
  return due;
}

std::vector<BatchRequest> BatchQueue::TakeExpired(Clock::time_point now) {
  std::vector<BatchRequest> expired;
  for (auto& [key, waiting] : groups_) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (it->deadline && now > *it->deadline) {
        expired.push_back(std::move(*it));
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::erase_if(groups_, [](const auto& group) { return group.second.empty(); });
  return expired;
}

std::vector<BatchRequest> BatchQueue::TakeBatch(Clock::time_point now) {
  const std::deque<BatchRequest>* oldest = OldestGroup();
  if (oldest == nullptr)
    return {};
  uint64_t oldest_other = UINT64_MAX;  // the oldest request of every other group
  for (const auto& [key, waiting] : groups_) {
    if (&waiting != oldest)
      oldest_other = std::min(oldest_other, waiting.front().sequence);
  }
  std::deque<BatchRequest>* chosen = nullptr;
  std::size_t take = 0;
  std::vector<int64_t> rows;
  for (auto& [key, waiting] : groups_) {
    if (options_.preserve_ordering && &waiting != oldest)
      continue;
    rows.clear();
    for (const auto& request : waiting) {
      if (options_.preserve_ordering && request.sequence > oldest_other)
        break;
      rows.push_back(request.rows);
    }
    // A run cut short by another group's request cannot grow: it leaves now.
    const bool wait_ended = now >= WaitEnds(waiting.front()) ||
                            (options_.preserve_ordering && rows.size() < waiting.size());
    const std::size_t count = RequestsToDispatch(rows, options_.max_batch_size,
                                                 options_.preferred_batch_sizes, wait_ended);
    if (count > 0 && (chosen == nullptr || waiting.front().sequence < chosen->front().sequence)) {
      chosen = &waiting;
      take = count;
    }
  }
  if (chosen == nullptr)
    return {};
  const BatchRequest& first = chosen->front();
  outlook_.Record(take, !first.skips_wait && now - first.arrived >= options_.max_queue_delay);
  std::vector<BatchRequest> batch;
  batch.reserve(take);
  for (std::size_t i = 0; i < take; ++i) {
    batch.push_back(std::move(chosen->front()));
    chosen->pop_front();
  }
  std::erase_if(groups_, [](const auto& group) { return group.second.empty(); });
  return batch;
}

std::vector<BatchRequest> BatchQueue::TakeAll() {
  std::vector<BatchRequest> all;
  for (auto& [sequence, request] : out_of_order_) {
    if (!request.answered)
      all.push_back(std::move(request));
  }
  out_of_order_.clear();
  for (auto& [key, waiting] : groups_) {
    for (auto& request : waiting)
      all.push_back(std::move(request));
  }
  groups_.clear();
  return all;
}

}  // namespace backplane::server
