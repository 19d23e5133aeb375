#include "rollout_meter.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

namespace backplane {

namespace {

constexpr uint32_t kBasisPoints = 10000;

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t ToBasisPoints(double fraction) {
  return static_cast<uint32_t>(std::lround(std::clamp(fraction, 0.0, 1.0) * kBasisPoints));
}

// One draw in [0, 10000): a thread's own generator, so that requests never share one.
uint32_t Draw() {
  thread_local std::minstd_rand generator(std::random_device{}());
  return static_cast<uint32_t>(generator() % kBasisPoints);
}

// The same key lands on the same point, spread evenly (std::hash of a string is not well mixed
// in its low bits: splitmix64's finaliser mixes it).
uint32_t PointOf(std::string_view key) {
  uint64_t x = std::hash<std::string_view>{}(key);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x % kBasisPoints);
}

// The candidate's and the baseline's shares, as RolloutMeter::shares_ holds them.
struct Shares {
  uint32_t candidate = 0;
  uint32_t baseline = 0;
};

uint64_t Pack(Shares shares) {
  return uint64_t{shares.baseline} << 32 | shares.candidate;
}

Shares Unpack(uint64_t word) {
  return {.candidate = static_cast<uint32_t>(word), .baseline = static_cast<uint32_t>(word >> 32)};
}

double MaxDifference(std::span<const double> expected, std::span<const double> actual) {
  double worst = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double x = expected[i], y = actual[i];
    if (std::isnan(x) && std::isnan(y))
      continue;
    worst = std::max(worst, std::isnan(x) || std::isnan(y) ? INFINITY : std::abs(x - y));
  }
  return worst;
}

// Whether the argmax over rows of `row` elements differs in any row.
bool ArgmaxDiffers(std::span<const double> expected, std::span<const double> actual,
                   std::size_t row) {
  for (std::size_t start = 0; start + row <= expected.size(); start += row) {
    const auto a = expected.subspan(start, row);
    const auto b = actual.subspan(start, row);
    if (std::max_element(a.begin(), a.end()) - a.begin() !=
        std::max_element(b.begin(), b.end()) - b.begin())
      return true;
  }
  return false;
}

}  // namespace

std::string_view ArmName(RolloutArm arm) {
  switch (arm) {
    case RolloutArm::kCandidate:
      return "candidate";
    case RolloutArm::kBaseline:
      return "baseline";
    case RolloutArm::kStable:
      break;
  }
  return "stable";
}

double MaxDifference(const Tensor& a, const Tensor& b) {
  return MaxDifference(ElementsAsDoubles(a.View()), ElementsAsDoubles(b.View()));
}

OutputDivergence CompareOutputs(std::span<const Tensor> expected, std::span<const Tensor> actual) {
  OutputDivergence divergence;
  if (expected.size() != actual.size()) {
    divergence.shapes_differ = true;
    return divergence;
  }
  double magnitude = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (expected[i].info() != actual[i].info()) {
      divergence.shapes_differ = true;
      return divergence;
    }
    const std::vector<double> want = ElementsAsDoubles(expected[i].View());
    const std::vector<double> got = ElementsAsDoubles(actual[i].View());
    divergence.max_abs = std::max(divergence.max_abs, MaxDifference(want, got));
    for (double value : want) {
      if (std::isfinite(value))
        magnitude = std::max(magnitude, std::abs(value));
    }
    const auto& shape = expected[i].info().shape;
    if (!shape.empty() && shape.back() > 1)
      divergence.argmax_differs |= ArgmaxDiffers(want, got, static_cast<std::size_t>(shape.back()));
  }
  divergence.max_relative =
      divergence.max_abs == 0 ? 0 : divergence.max_abs / std::max(magnitude, 1e-30);
  return divergence;
}

std::size_t LatencyHistogram::BucketOf(double micros) {
  if (!(micros > 1.0))
    return 0;
  const auto bucket = static_cast<std::size_t>(std::log2(micros) * 8.0);
  return std::min(bucket, kBuckets - 1);
}

double LatencyHistogram::UpperBoundMicros(std::size_t bucket) {
  return std::exp2(static_cast<double>(bucket + 1) / 8.0);
}

uint64_t LatencyHistogram::total() const {
  uint64_t sum = 0;
  for (uint64_t count : counts)
    sum += count;
  return sum;
}

double LatencyHistogram::QuantileMicros(double q) const {
  const uint64_t all = total();
  if (all == 0)
    return 0;
  const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(all)));
  uint64_t seen = 0;
  for (std::size_t bucket = 0; bucket < kBuckets; ++bucket) {
    seen += counts[bucket];
    if (seen >= std::max<uint64_t>(rank, 1))
      return UpperBoundMicros(bucket);
  }
  return UpperBoundMicros(kBuckets - 1);
}

LatencyHistogram LatencyHistogram::operator-(const LatencyHistogram& earlier) const {
  LatencyHistogram window;
  for (std::size_t bucket = 0; bucket < kBuckets; ++bucket)
    window.counts[bucket] = counts[bucket] - earlier.counts[bucket];
  return window;
}

ShadowStats ShadowStats::operator-(const ShadowStats& earlier) const {
  ShadowStats window = *this;
  window.samples -= earlier.samples;
  window.errors -= earlier.errors;
  window.skipped -= earlier.skipped;
  window.diverged -= earlier.diverged;
  window.argmax_disagreements -= earlier.argmax_disagreements;
  window.timeouts -= earlier.timeouts;
  window.latency = latency - earlier.latency;
  window.stable_latency = stable_latency - earlier.stable_latency;
  window.slower -= earlier.slower;
  return window;
}

RolloutMeter::RolloutMeter(uint64_t stable_generation, uint64_t candidate_generation,
                           uint64_t baseline_generation)
    : stable_(stable_generation),
      candidate_(candidate_generation),
      baseline_(baseline_generation) {}

void RolloutMeter::SetTraffic(const RolloutTraffic& traffic) {
  shadow_timeout_ms_.store(traffic.shadow_timeout_ms, std::memory_order_relaxed);
  shadow_tolerance_.store(traffic.shadow_tolerance, std::memory_order_relaxed);
  shadow_basis_points_.store(ToBasisPoints(traffic.shadow_fraction), std::memory_order_relaxed);
  Shares shares{.candidate = ToBasisPoints(traffic.candidate_percent / 100.0)};
  // Without a baseline its share stays 0, so that traffic() says what is routed.
  if (baseline_.generation != 0)
    shares.baseline =
        std::min(ToBasisPoints(traffic.baseline_percent / 100.0), kBasisPoints - shares.candidate);
  shares_.store(Pack(shares), std::memory_order_relaxed);
}

RolloutTraffic RolloutMeter::traffic() const {
  const Shares shares = Unpack(shares_.load(std::memory_order_relaxed));
  return {
      .candidate_percent = shares.candidate * 100.0 / kBasisPoints,
      .baseline_percent = shares.baseline * 100.0 / kBasisPoints,
      .shadow_fraction = shadow_basis_points_.load(std::memory_order_relaxed) * 1.0 / kBasisPoints,
      .shadow_tolerance = shadow_tolerance_.load(std::memory_order_relaxed),
      .shadow_timeout_ms = shadow_timeout_ms_.load(std::memory_order_relaxed)};
}

RolloutArm RolloutMeter::ChooseArm(std::string_view key) const {
  Shares shares = Unpack(shares_.load(std::memory_order_relaxed));
  if (baseline_lost_.load(std::memory_order_relaxed))
    shares.baseline = 0;
  if (shares.candidate == 0 && shares.baseline == 0)
    return RolloutArm::kStable;
  const uint32_t point = key.empty() ? Draw() : PointOf(key);
  if (point < shares.candidate)
    return RolloutArm::kCandidate;
  if (point < shares.candidate + shares.baseline)
    return RolloutArm::kBaseline;
  return RolloutArm::kStable;
}

bool RolloutMeter::SampleShadow() const {
  const uint32_t share = shadow_basis_points_.load(std::memory_order_relaxed);
  return share != 0 && Draw() < share;
}

RolloutMeter::Arm& RolloutMeter::ArmOf(RolloutArm arm) {
  switch (arm) {
    case RolloutArm::kCandidate:
      return candidate_;
    case RolloutArm::kBaseline:
      return baseline_;
    case RolloutArm::kStable:
      break;
  }
  return stable_;
}

void RolloutMeter::RecordExecution(RolloutArm which, double micros, const Status& status) {
  Arm& arm = ArmOf(which);
  arm.latency[LatencyHistogram::BucketOf(micros)].fetch_add(1, std::memory_order_relaxed);
  if (!status.ok())
    arm.errors.fetch_add(1, std::memory_order_relaxed);
  // Last: a snapshot that sees the request counted sees its error too (it reads requests first).
  arm.requests.fetch_add(1, std::memory_order_release);
}

bool RolloutMeter::LoseBaseline() {
  return !baseline_lost_.exchange(true, std::memory_order_relaxed);
}

void RolloutMeter::RecordShadowSkipped() {
  shadow_skipped_.fetch_add(1, std::memory_order_relaxed);
}

bool RolloutMeter::BeginShadow() {
  // Read first: while one runs, nearly every sampled request finds it so, and a read keeps the
  // line shared between the cores where an exchange would bounce it at every request.
  return !shadow_in_flight_.load(std::memory_order_relaxed) &&
         !shadow_in_flight_.exchange(true, std::memory_order_acq_rel);
}

void RolloutMeter::EndShadow() {
  shadow_in_flight_.store(false, std::memory_order_release);
}

void RolloutMeter::ShadowStarted() {
  shadow_started_ns_.store(SteadyNanos(), std::memory_order_relaxed);
}

void RolloutMeter::ShadowDiscarded(double elapsed_micros) {
  StopShadowClock(elapsed_micros);
  shadow_skipped_.fetch_add(1, std::memory_order_relaxed);
}

void RolloutMeter::StopShadowClock(double elapsed_micros) {
  // Counted here unless a snapshot counted it while it ran.
  if (shadow_started_ns_.exchange(0, std::memory_order_relaxed) != kShadowCounted &&
      elapsed_micros > shadow_timeout_ms_.load(std::memory_order_relaxed) * 1000)
    shadow_timeouts_.fetch_add(1, std::memory_order_relaxed);
}

void RolloutMeter::CountOverdueShadow() const {
  int64_t started = shadow_started_ns_.load(std::memory_order_relaxed);
  if (started <= 0)
    return;
  const double elapsed_ms = static_cast<double>(SteadyNanos() - started) / 1e6;
  if (elapsed_ms > shadow_timeout_ms_.load(std::memory_order_relaxed) &&
      shadow_started_ns_.compare_exchange_strong(started, kShadowCounted,
                                                 std::memory_order_relaxed))
    shadow_timeouts_.fetch_add(1, std::memory_order_relaxed);
}

void RolloutMeter::RaiseTo(std::atomic<double>& maximum, double value) {
  double seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void RolloutMeter::RecordShadow(const Result<std::vector<Tensor>>& candidate,
                                const std::vector<Tensor>& stable, double candidate_micros,
                                double stable_micros, double elapsed_micros) {
  StopShadowClock(elapsed_micros);
  shadow_latency_[LatencyHistogram::BucketOf(candidate_micros)].fetch_add(
      1, std::memory_order_relaxed);
  shadow_stable_latency_[LatencyHistogram::BucketOf(stable_micros)].fetch_add(
      1, std::memory_order_relaxed);
  if (candidate_micros > stable_micros)
    shadow_slower_.fetch_add(1, std::memory_order_relaxed);
  if (!candidate.ok()) {
    shadow_errors_.fetch_add(1, std::memory_order_relaxed);
  } else {
    const OutputDivergence divergence = CompareOutputs(stable, candidate.value());
    if (divergence.shapes_differ) {
      shadow_diverged_.fetch_add(1, std::memory_order_relaxed);
      RaiseTo(shadow_max_abs_, INFINITY);
    } else {
      if (divergence.max_abs > shadow_tolerance_.load(std::memory_order_relaxed))
        shadow_diverged_.fetch_add(1, std::memory_order_relaxed);
      if (divergence.argmax_differs)
        shadow_argmax_.fetch_add(1, std::memory_order_relaxed);
      RaiseTo(shadow_max_abs_, divergence.max_abs);
      RaiseTo(shadow_max_relative_, divergence.max_relative);
    }
  }
  shadow_samples_.fetch_add(1, std::memory_order_release);
}

LatencyHistogram RolloutMeter::Read(const Histogram& histogram) {
  LatencyHistogram read;
  for (std::size_t bucket = 0; bucket < LatencyHistogram::kBuckets; ++bucket)
    read.counts[bucket] = histogram[bucket].load(std::memory_order_relaxed);
  return read;
}

RolloutStats RolloutMeter::Snapshot() const {
  CountOverdueShadow();
  auto arm = [](const Arm& from) {
    RolloutArmStats stats{.generation = from.generation};
    stats.requests = from.requests.load(std::memory_order_acquire);
    stats.errors = from.errors.load(std::memory_order_relaxed);
    stats.latency = Read(from.latency);
    return stats;
  };
  RolloutStats stats{.traffic = traffic(),
                     .stable = arm(stable_),
                     .candidate = arm(candidate_),
                     .baseline = arm(baseline_),
                     .baseline_lost = baseline_lost_.load(std::memory_order_relaxed)};
  stats.shadow.samples = shadow_samples_.load(std::memory_order_acquire);
  stats.shadow.errors = shadow_errors_.load(std::memory_order_relaxed);
  stats.shadow.skipped = shadow_skipped_.load(std::memory_order_relaxed);
  stats.shadow.diverged = shadow_diverged_.load(std::memory_order_relaxed);
  stats.shadow.argmax_disagreements = shadow_argmax_.load(std::memory_order_relaxed);
  stats.shadow.max_abs_difference = shadow_max_abs_.load(std::memory_order_relaxed);
  stats.shadow.max_relative_difference = shadow_max_relative_.load(std::memory_order_relaxed);
  stats.shadow.timeouts = shadow_timeouts_.load(std::memory_order_relaxed);
  stats.shadow.latency = Read(shadow_latency_);
  stats.shadow.stable_latency = Read(shadow_stable_latency_);
  stats.shadow.slower = shadow_slower_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace backplane
