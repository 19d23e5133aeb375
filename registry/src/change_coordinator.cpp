#include "change_coordinator.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "registry_log.hpp"

namespace backplane::registry_detail {

namespace {

constexpr int kAttempts = 5;

}  // namespace

uint64_t ChangeCoordinator::Subscribe(BackendSubscriber& subscriber) {
  const uint64_t id = next_subscriber_id_++;
  subscribers_.emplace(id, &subscriber);
  return id;
}

void ChangeCoordinator::Unsubscribe(uint64_t subscriber_id) {
  subscribers_.erase(subscriber_id);
}

std::optional<Status> ChangeCoordinator::TryApply(const BackendChange& change, bool regardless) {
  std::vector<std::unique_ptr<PreparedChange>> prepared;
  for (const auto& [subscriber_id, subscriber] : subscribers_) {
    auto result = subscriber->PrepareChange(change);
    if (result.ok()) {
      prepared.push_back(std::move(result).value());
    } else if (regardless) {
      Log().warn(
          "backend {}: a runtime could not prepare for the change, and keeps what it has: {}",
          change.backend_id, result.error().ToString());
    } else {
      return std::move(result).error();  // `prepared` is dropped: every change aborts
    }
  }
  for (auto& change : prepared)
    change->BeginCommit();
  {
    // Locked in subscription order, which every change follows (one at a time): no deadlock.
    std::vector<std::unique_lock<Mutex>> locks;
    locks.reserve(prepared.size());
    for (auto& change : prepared)
      locks.push_back(change->LockState());
    const bool current = std::all_of(prepared.begin(), prepared.end(),
                                     [](const auto& change) { return change->IsCurrent(); });
    if (!current)
      return std::nullopt;
    for (auto& change : prepared)
      change->Commit();
  }
  for (auto& change : prepared)
    change->AfterCommit();
  return Status::Ok();  // what the changes replaced is released here, outside every lock
}

Status ChangeCoordinator::Apply(const BackendChange& change) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (auto applied = TryApply(change, /*regardless=*/false))
      return *applied;
  }
  return {LoadReason::kPrepareFailed,
          "backend " + change.backend_id + ": a runtime kept changing while the change was " +
              "prepared (" + std::to_string(kAttempts) + " attempts); try again"};
}

void ChangeCoordinator::ApplyRegardless(const BackendChange& change) {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (TryApply(change, /*regardless=*/true))
      return;
  }
  Log().error(
      "backend {}: a runtime kept changing while its withdrawal was prepared; it keeps "
      "offering the backend to new loads until the next scan",
      change.backend_id);
}

}  // namespace backplane::registry_detail
