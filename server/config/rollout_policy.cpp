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
  if (key == "max_error_rate")
    return number(&RolloutPolicy::max_error_rate, 0, 1);
  if (key == "max_p99_ratio")
    return number(&RolloutPolicy::max_p99_ratio, 1, 1e9);
  if (key == "max_abs_divergence")
    return number(&RolloutPolicy::max_abs_divergence, 0, 1e300);
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
      "' (known: shadow_fraction, min_samples, steps, max_error_rate, max_p99_ratio, "
      "max_abs_divergence, candidate_isolation)");
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
          {"max_error_rate", policy.max_error_rate},
          {"max_p99_ratio", policy.max_p99_ratio},
          {"max_abs_divergence", policy.max_abs_divergence},
          {"candidate_isolation", policy.sandbox_candidates ? "process" : "none"}};
}

}  // namespace backplane::server
