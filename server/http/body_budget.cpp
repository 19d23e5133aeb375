#include "http/body_budget.hpp"

#include <utility>

namespace backplane::server {

BodyReservation& BodyReservation::operator=(BodyReservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

bool BodyReservation::Grow(std::size_t more) {
  if (budget_ == nullptr || !budget_->Take(more))
    return false;
  bytes_ += more;
  return true;
}

void BodyReservation::Release() {
  if (budget_ != nullptr && bytes_ > 0)
    budget_->Give(bytes_);
  bytes_ = 0;
}

std::optional<BodyReservation> BodyBudget::TryReserve(std::size_t bytes) {
  if (!Take(bytes))
    return std::nullopt;
  return BodyReservation(this, bytes);
}

bool BodyBudget::Take(std::size_t bytes) {
  std::size_t held = in_use_.load(std::memory_order_relaxed);
  do {
    // Written as a subtraction: held + bytes could wrap for a Content-Length near 2^64 (the
    // framing check refuses those first, but the budget does not rely on it).
    if (bytes > limit_ - held)
      return false;
  } while (!in_use_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  if (gauge_ != nullptr)
    gauge_->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return true;
}

void BodyBudget::Give(std::size_t bytes) {
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  if (gauge_ != nullptr)
    gauge_->fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

}  // namespace backplane::server
