// The HTTP transport's counters: the one part of the server's metrics that HttpServer sees.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "metrics/prometheus.hpp"

namespace backplane::server {

// Owned by ServerMetrics (ServerMetrics::http), which outlives the transport; the transport
// updates these and nothing else. Thread-safe: relaxed atomics, read at scrape time.
struct HttpMetrics {
  // Every HTTP response, by status code (from the access log hook); out of range counts as 500.
  void CountResponse(int status);
  std::atomic<int64_t> in_flight{0};
  // The HTTP body budget (max_buffered_body_bytes): bytes reserved now, and requests refused
  // because their body did not fit.
  std::atomic<int64_t> buffered_body_bytes{0};
  std::atomic<uint64_t> body_budget_refusals{0};

  // The backplane_http_* families.
  void Render(PrometheusWriter& out) const;

 private:
  std::array<std::atomic<uint64_t>, 600> responses_{};  // by status code; 0 unused
};

}  // namespace backplane::server
