#include "backplane/scheduler/concurrency_limit.hpp"

#include <future>
#include <string>

namespace backplane::scheduler {

std::shared_ptr<ConcurrencyLimit> ConcurrencyLimit::Create(std::size_t limit) {
  return std::shared_ptr<ConcurrencyLimit>(new ConcurrencyLimit(limit));
}

ConcurrencyLimit::Slot::~Slot() {
  if (limit_ != nullptr)
    limit_->Release();
}

void ConcurrencyLimit::Turns::Tell() {
  for (auto& [on_turn, turn] : calls)
    on_turn(std::move(turn));
  calls.clear();
}

void ConcurrencyLimit::Acquire(TurnCallback on_turn, std::optional<Clock::time_point> deadline) {
  Turns turns;
  {
    MutexLock lock(mutex_);
    waiters_.push_back({std::move(on_turn), deadline});
    MoveQueue(turns);
  }
  turns.Tell();
}

ConcurrencyLimit::Slot ConcurrencyLimit::AcquireBlocking() {
  {
    MutexLock lock(mutex_);
    if (waiters_.empty() && HasFreeSlot()) {  // the usual case: no promise, no wait
      ++running_;
      return Slot(shared_from_this());
    }
  }
  // A promise, not a condition variable on this stack: the thread that hands the turn over may
  // still be inside the notification when this one wakes and returns; set_value is safe then.
  std::promise<Slot> turn;
  auto granted = turn.get_future();
  Acquire([&turn](Result<Slot> slot) { turn.set_value(std::move(slot).value()); });
  return granted.get();
}

void ConcurrencyLimit::SetLimit(std::size_t limit) {
  Turns turns;
  {
    MutexLock lock(mutex_);
    limit_ = limit;
    MoveQueue(turns);
  }
  turns.Tell();
}

ConcurrencyLimit::Counts ConcurrencyLimit::counts() const {
  MutexLock lock(mutex_);
  return {.limit = limit_, .running = running_, .waiting = waiters_.size()};
}

void ConcurrencyLimit::Release() {
  Turns turns;
  {
    MutexLock lock(mutex_);
    --running_;
    MoveQueue(turns);
  }
  // A slot handed out here may be dropped inside its callback (a request that fails before it
  // runs), which releases it again from this thread: no lock is held, so that only recurses.
  turns.Tell();
}

void ConcurrencyLimit::MoveQueue(Turns& turns) {
  // Every waiter is looked at, not only the first: one that expired behind others gives its
  // place (and its admission among the requests in flight) back now rather than when it reaches
  // the front. The queue is at most the requests in flight long.
  const auto now = Clock::now();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline && now > *it->deadline) {
      turns.calls.emplace_back(
          std::move(it->on_turn),
          Status(StatusCode::kDeadlineExceeded,
                 "the request's deadline passed while it waited for one of its network's " +
                     std::to_string(limit_) + " instance(s); it was not run"));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  while (!waiters_.empty() && HasFreeSlot()) {
    ++running_;
    turns.calls.emplace_back(std::move(waiters_.front().on_turn), Slot(shared_from_this()));
    waiters_.pop_front();
  }
}

}  // namespace backplane::scheduler
