#include "metrics/prometheus.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace backplane::server {

namespace {

// Shortest text that reads back as the same double; Prometheus accepts Go float syntax.
std::string FormatDouble(double value) {
  if (std::isinf(value))
    return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value))
    return "NaN";
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : "NaN";
}

}  // namespace

std::string FormatSampleValue(double value) {
  return FormatDouble(value);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      escaped += "\\\\";
    else if (c == '"')
      escaped += "\\\"";
    else if (c == '\n')
      escaped += "\\n";
    else
      escaped += c;
  }
  return escaped;
}

// ---- Histogram ------------------------------------------------------------------------------

Histogram::Histogram(std::span<const double> upper_bounds)
    : upper_bounds_(upper_bounds.begin(), upper_bounds.end()),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds.size() + 1)) {}

void Histogram::Observe(double value) {
  // The first bound >= value; past the end is the +Inf bucket.
  const auto bucket = static_cast<std::size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts.push_back(cumulative);
  }
  snapshot.count = cumulative;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

// ---- PrometheusWriter -----------------------------------------------------------------------

void PrometheusWriter::Family(std::string_view name, std::string_view type, std::string_view help) {
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  // HELP text escapes backslash and newline only.
  for (char c : help) {
    if (c == '\\')
      text_ += "\\\\";
    else if (c == '\n')
      text_ += "\\n";
    else
      text_ += c;
  }
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += type;
  text_ += '\n';
}

void PrometheusWriter::Sample(std::string_view name, const Labels& labels, std::string_view value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i > 0)
        text_ += ',';
      text_ += labels[i].first;
      text_ += "=\"";
      text_ += EscapeLabelValue(labels[i].second);
      text_ += '"';
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += value;
  text_ += '\n';
}

void PrometheusWriter::Sample(std::string_view name, const Labels& labels, uint64_t value) {
  Sample(name, labels, std::to_string(value));
}

void PrometheusWriter::Sample(std::string_view name, const Labels& labels, int64_t value) {
  Sample(name, labels, std::to_string(value));
}

void PrometheusWriter::HistogramSamples(std::string_view name, const Labels& labels,
                                        const Histogram::Snapshot& snapshot) {
  const std::string bucket = std::string(name) + "_bucket";
  for (std::size_t i = 0; i <= snapshot.upper_bounds.size(); ++i) {
    Labels with_le = labels;
    with_le.emplace_back("le", i < snapshot.upper_bounds.size()
                                   ? FormatDouble(snapshot.upper_bounds[i])
                                   : std::string("+Inf"));
    Sample(bucket, with_le, snapshot.cumulative_counts[i]);
  }
  Sample(std::string(name) + "_sum", labels, FormatDouble(snapshot.sum));
  Sample(std::string(name) + "_count", labels, snapshot.count);
}

}  // namespace backplane::server
