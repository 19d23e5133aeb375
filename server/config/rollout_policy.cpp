#include "config/rollout_policy.hpp"

#include <fmt/format.h>

#include <functional>
#include <nlohmann/json.hpp>

namespace backplane::server {
using nlohmann::json;

namespace {

Result<double> ReadNumber(const json& value, const std::string& key, double min, double max) {
  if (!value.is_number())
    return InvalidArgument("'" + key + "' must be a number, got " + value.dump());
  const double number = value.get<double>();
  if (!(number >= min && number <= max)) {
    return InvalidArgument(
        fmt::format("'{}' must be between {:g} and {:g}, got {}", key, min, max, value.dump()));
  }
  return number;
}

Status ApplyKey(const std::string& key, const json& value, RolloutPolicy& policy) {
  const std::string name = "rollout." + key;
  auto number = [&](double RolloutPolicy::*field, double min, double max) -> Status {
    auto read = ReadNumber(value, name, min, max);
    if (!read.ok())
      return read.error();
    policy.*field = read.value();
    return Status::Ok();
  };
  if (key == "shadow_fraction")
    return number(&RolloutPolicy::shadow_fraction, 0, 1);
  if (key == "confidence") {
    // 0.5 would call a coin toss a regression; 1 would never decide.
    if (!value.is_number() || !(value.get<double>() > 0.5 && value.get<double>() < 1)) {
      return InvalidArgument(
          "'" + name + "' must be a number above 0.5 and below 1, e.g. 0.99, got " + value.dump());
    }
    policy.confidence = value.get<double>();
    return Status::Ok();
  }
  if (key == "max_latency_regression")
    return number(&RolloutPolicy::max_latency_regression, 0, 1e6);
  if (key == "worker_latency_allowance_us")
    return number(&RolloutPolicy::worker_latency_allowance_us, 0, 1e9);
  if (key == "max_error_excess")
    return number(&RolloutPolicy::max_error_excess, 0, 1);
  if (key == "max_abs_divergence")
    return number(&RolloutPolicy::max_abs_divergence, 0, 1e300);
  if (key == "shadow_timeout_ms") {
    // 0 would time out every run: the rollout would roll back at its first shadow sample.
    if (!value.is_number() ||
        !(value.get<double>() > 0 && value.get<double>() <= RolloutPolicy::kMaxShadowTimeoutMs)) {
      return InvalidArgument(fmt::format(
          "'{}' must be a number of milliseconds above 0 and at most {:.0f} (an hour), got {}",
          name, RolloutPolicy::kMaxShadowTimeoutMs, value.dump()));
    }
    policy.shadow_timeout_ms = value.get<double>();
    return Status::Ok();
  }
  if (key == "step_max_duration_s")
    return number(&RolloutPolicy::step_max_duration_s, 0, 1e7);
  if (key == "inconclusive_limit") {
    if (!value.is_number_unsigned() || value.get<uint64_t>() < 1 || value.get<uint64_t>() > 1000) {
      return InvalidArgument("'" + name + "' must be an integer between 1 and 1000, got " +
                             value.dump());
    }
    policy.inconclusive_limit = value.get<uint32_t>();
    return Status::Ok();
  }
  if (key == "on_inconclusive") {
    if (!value.is_string() || (value != "advance" && value != "hold"))
      return InvalidArgument("'" + name + "' must be \"advance\" or \"hold\", got " + value.dump());
    policy.on_inconclusive = value == "advance" ? RolloutPolicy::OnInconclusive::kAdvance
                                                : RolloutPolicy::OnInconclusive::kHold;
    return Status::Ok();
  }
  // Keys of the fixed thresholds the judge replaced: a config that still sets them meant
  // something the server no longer does, so it is refused rather than ignored.
  if (key == "max_p99_ratio") {
    return InvalidArgument("'" + name +
                           "' is no longer a key: latency is judged by a rank test of every run, "
                           "set 'rollout.max_latency_regression' (the slowdown tolerated, e.g. "
                           "0.1) and 'rollout.confidence' instead");
  }
  if (key == "max_error_rate") {
    return InvalidArgument("'" + name +
                           "' is no longer a key: errors are judged by a two-proportion test "
                           "against the stable generation's rate, set 'rollout.max_error_excess' "
                           "(the excess tolerated, e.g. 0.01) and 'rollout.confidence' instead");
  }
  if (key == "min_samples") {
    if (!value.is_number_unsigned() || value.get<uint64_t>() < 1 ||
        value.get<uint64_t>() > 100000000) {
      return InvalidArgument("'" + name + "' must be an integer between 1 and 100000000, got " +
                             value.dump());
    }
    policy.min_samples = value.get<uint64_t>();
    return Status::Ok();
  }
  if (key == "candidate_isolation") {
    if (!value.is_string() || (value != "process" && value != "none"))
      return InvalidArgument("'" + name + "' must be \"process\" or \"none\", got " + value.dump());
    policy.sandbox_candidates = value == "process";
    return Status::Ok();
  }
  if (key == "baseline") {
    if (!value.is_boolean())
      return InvalidArgument("'" + name + "' must be true or false, got " + value.dump());
    policy.baseline = value.get<bool>();
    return Status::Ok();
  }
  if (key == "steps") {
    if (!value.is_array() || value.empty()) {
      return InvalidArgument("'" + name +
                             "' must be a non-empty array of percentages, e.g. [1, 10, 50, 100]");
    }
    std::vector<double> steps;
    for (const auto& element : value) {
      auto step = ReadNumber(element, name + " entry", 0, 100);
      if (!step.ok())
        return step.error();
      if (step.value() <= 0 || (!steps.empty() && step.value() <= steps.back())) {
        return InvalidArgument("'" + name + "' must increase from above 0, got " + value.dump());
      }
      if (step.value() < RolloutPolicy::kSmallestStep) {
        return InvalidArgument(fmt::format(
            "'{}' entry {} is below {:g}, the smallest share the router sends the candidate (one "
            "request in 10,000): the step would route nothing",
            name, element.dump(), RolloutPolicy::kSmallestStep));
      }
      steps.push_back(step.value());
    }
    if (steps.back() != 100) {
      return InvalidArgument("'" + name +
                             "' must end at 100 (the candidate takes every request before it "
                             "is promoted), got " +
                             value.dump());
    }
    policy.steps = std::move(steps);
    return Status::Ok();
  }
  return InvalidArgument(
      "unknown key '" + name +
      "' (known: shadow_fraction, min_samples, steps, confidence, max_latency_regression, "
      "worker_latency_allowance_us, max_error_excess, max_abs_divergence, shadow_timeout_ms, "
      "step_max_duration_s, inconclusive_limit, on_inconclusive, candidate_isolation, "
      "baseline)");
}

}  // namespace

Status CheckDeployPolicy(std::string_view policy) {
  if (policy == "immediate" || policy == "progressive")
    return Status::Ok();
  return InvalidArgument("'deploy_policy' must be \"immediate\" or \"progressive\", got '" +
                         std::string(policy) + "'");
}

Status ApplyRolloutPolicy(const json& value, std::string_view where, RolloutPolicy& policy) {
  if (!value.is_object()) {
    return InvalidArgument(std::string(where) + ": 'rollout' must be a JSON object, got " +
                           value.dump());
  }
  RolloutPolicy updated = policy;
  for (const auto& [key, entry] : value.items()) {
    Status applied = ApplyKey(key, entry, updated);
    if (!applied.ok())
      return applied.WithContext(std::string(where) + ": ");
  }
  policy = std::move(updated);
  return Status::Ok();
}

json RolloutPolicyJson(const RolloutPolicy& policy) {
  return {{"shadow_fraction", policy.shadow_fraction},
          {"min_samples", policy.min_samples},
          {"steps", policy.steps},
          {"confidence", policy.confidence},
          {"max_latency_regression", policy.max_latency_regression},
          {"worker_latency_allowance_us", policy.worker_latency_allowance_us},
          {"max_error_excess", policy.max_error_excess},
          {"max_abs_divergence", policy.max_abs_divergence},
          {"shadow_timeout_ms", policy.shadow_timeout_ms},
          {"step_max_duration_s", policy.step_max_duration_s},
          {"inconclusive_limit", policy.inconclusive_limit},
          {"on_inconclusive",
           policy.on_inconclusive == RolloutPolicy::OnInconclusive::kAdvance ? "advance" : "hold"},
          {"candidate_isolation", policy.sandbox_candidates ? "process" : "none"},
          {"baseline", policy.baseline}};
}

}  // namespace backplane::server
