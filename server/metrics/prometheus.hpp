// The Prometheus primitives every part of the server's metrics is built from: a lock-free
// histogram, and the writer of the text exposition format (version 0.0.4) that `promtool check
// metrics` accepts: HELP and TYPE lines, counters ending in _total, histograms as
// _bucket{le}/_sum/_count, seconds as the unit, escaped label values.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::server {

// A cumulative histogram with fixed upper bounds. Thread-safe and lock-free: Observe is a few
// relaxed atomic adds, so a scrape may see a sum and counts from slightly different moments
// (Prometheus tolerates that; it never sees a bucket count decrease).
class Histogram {
 public:
  explicit Histogram(std::span<const double> upper_bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), then +Inf
  std::atomic<double> sum_{0};
};

// Writes one metric family at a time: HELP and TYPE once, then its samples. Each part of the
// metrics renders its own families into one writer (ServerMetrics::Render lists the parts).
// Thread-compatible.
class PrometheusWriter {
 public:
  using Labels = std::vector<std::pair<std::string_view, std::string>>;

  void Family(std::string_view name, std::string_view type, std::string_view help);
  void Sample(std::string_view name, const Labels& labels, std::string_view value);
  void Sample(std::string_view name, const Labels& labels, uint64_t value);
  void Sample(std::string_view name, const Labels& labels, int64_t value);
  // The _bucket{le}, _sum and _count samples of `name` with `labels`.
  void HistogramSamples(std::string_view name, const Labels& labels,
                        const Histogram::Snapshot& snapshot);

  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

// A sample value: the shortest text that reads back as the same double (+Inf, -Inf, NaN).
std::string FormatSampleValue(double value);

// Prometheus label value escaping: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);

}  // namespace backplane::server
