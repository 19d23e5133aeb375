// The server-wide budget of request-body bytes held at once (max_buffered_body_bytes). Each
// connection's limit (max_body_bytes) bounds one body; without a budget, N slow clients each
// sending a partial body of max_body_bytes hold N times that until their read timeouts
// (bench/body_burst.sh shows it; docs/operators.md, "After a burst", has its numbers). A
// connection reserves a body's bytes before reading them: the whole Content-Length at once, or a
// chunked body chunk by chunk as each chunk's size arrives; what does not fit is refused (503)
// instead of buffered.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace backplane::server {

class BodyBudget;

// Bytes of one request's body held against a BodyBudget; gives them back when destroyed (or
// Release). Move-only; a default-constructed one holds nothing. Thread-compatible: one
// connection's strand owns it; the budget it points into is thread-safe.
class BodyReservation {
 public:
  BodyReservation() = default;
  ~BodyReservation() { Release(); }
  BodyReservation(BodyReservation&& other) noexcept : budget_(other.budget_), bytes_(other.bytes_) {
    other.budget_ = nullptr;
    other.bytes_ = 0;
  }
  BodyReservation& operator=(BodyReservation&& other) noexcept;
  BodyReservation(const BodyReservation&) = delete;
  BodyReservation& operator=(const BodyReservation&) = delete;

  // Holds `more` bytes more (a chunk of a chunked body). False, holding what it held, when the
  // budget cannot spare them. A default-constructed reservation has no budget and cannot grow.
  [[nodiscard]] bool Grow(std::size_t more);
  void Release();
  std::size_t bytes() const { return bytes_; }

 private:
  friend class BodyBudget;
  BodyReservation(BodyBudget* budget, std::size_t bytes) : budget_(budget), bytes_(bytes) {}

  BodyBudget* budget_ = nullptr;
  std::size_t bytes_ = 0;
};

// Thread-safe and lock-free (one compare-and-swap per reservation). Must outlive every
// reservation taken from it (the HTTP server's core owns it and waits for its connections).
class BodyBudget {
 public:
  // `in_use_gauge`, when given, mirrors in_use() for /metrics; it must outlive the budget.
  explicit BodyBudget(std::size_t limit, std::atomic<int64_t>* in_use_gauge = nullptr)
      : limit_(limit), gauge_(in_use_gauge) {}
  BodyBudget(const BodyBudget&) = delete;
  BodyBudget& operator=(const BodyBudget&) = delete;

  // A reservation of `bytes` (0 is always granted: a chunked body starts there and grows), or
  // nullopt when in_use() + bytes would pass the limit. All or nothing: a refused call takes
  // nothing, so a refused request never squeezes out a later one.
  [[nodiscard]] std::optional<BodyReservation> TryReserve(std::size_t bytes);

  std::size_t limit() const { return limit_; }
  std::size_t in_use() const { return in_use_.load(std::memory_order_relaxed); }

 private:
  friend class BodyReservation;
  bool Take(std::size_t bytes);
  void Give(std::size_t bytes);

  const std::size_t limit_;
  std::atomic<int64_t>* const gauge_;
  std::atomic<std::size_t> in_use_{0};
};

}  // namespace backplane::server
