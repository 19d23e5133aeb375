#include "metrics/http_metrics.hpp"

#include <string>

namespace backplane::server {

void HttpMetrics::CountResponse(int status) {
  if (status < 100 || status >= static_cast<int>(responses_.size()))
    status = 500;
  responses_[static_cast<std::size_t>(status)].fetch_add(1, std::memory_order_relaxed);
}

void HttpMetrics::Render(PrometheusWriter& out) const {
  out.Family("backplane_http_responses_total", "counter", "HTTP responses sent, by status code.");
  for (std::size_t status = 0; status < responses_.size(); ++status) {
    const uint64_t count = responses_[status].load(std::memory_order_relaxed);
    if (count != 0)
      out.Sample("backplane_http_responses_total", {{"code", std::to_string(status)}}, count);
  }
  out.Family("backplane_http_requests_in_flight", "gauge",
             "HTTP requests being handled right now (this scrape included).");
  out.Sample("backplane_http_requests_in_flight", {}, in_flight.load(std::memory_order_relaxed));
  out.Family("backplane_http_buffered_body_bytes", "gauge",
             "Request-body bytes reserved against max_buffered_body_bytes right now.");
  out.Sample("backplane_http_buffered_body_bytes", {},
             buffered_body_bytes.load(std::memory_order_relaxed));
  out.Family("backplane_http_body_budget_refusals_total", "counter",
             "HTTP requests refused with 503 because their body did not fit in "
             "max_buffered_body_bytes.");
  out.Sample("backplane_http_body_budget_refusals_total", {},
             body_budget_refusals.load(std::memory_order_relaxed));
}

}  // namespace backplane::server
