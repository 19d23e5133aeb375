// Typed backend options (ExecuTorch RFC "option 3": an update call per backend, validated by the
// backend; ArmNN's BackendOptions for values given at creation).
#pragma once

#include <cassert>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane {

enum class OptionType { kBool, kInt64, kDouble, kString };

// The alternatives are in OptionType order.
using OptionValue = std::variant<bool, int64_t, double, std::string>;

constexpr std::string_view ToString(OptionType type) {
  switch (type) {
    case OptionType::kBool:
      return "bool";
    case OptionType::kInt64:
      return "int64";
    case OptionType::kDouble:
      return "double";
    case OptionType::kString:
      return "string";
  }
  return "unknown";
}

inline OptionType TypeOf(const OptionValue& value) {
  return static_cast<OptionType>(value.index());
}

inline std::string ToString(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<V, std::string>) {
          return "\"" + v + "\"";
        } else {
          return std::to_string(v);
        }
      },
      value);
}

// One option a backend understands: what a server lists and validates against.
struct OptionDescriptor {
  std::string name;
  OptionType type = OptionType::kBool;
  OptionValue default_value;
  std::string help;
};

// Option values by name, for one backend.
using BackendOptions = std::map<std::string, OptionValue, std::less<>>;

// Checks `changes` against `descriptors`: every key known, every value of the declared type.
// All-or-nothing callers apply nothing when this fails.
inline Status ValidateOptions(const BackendOptions& changes,
                              const std::vector<OptionDescriptor>& descriptors,
                              std::string_view backend_id) {
  for (const auto& [key, value] : changes) {
    const OptionDescriptor* found = nullptr;
    for (const auto& descriptor : descriptors) {
      if (descriptor.name == key)
        found = &descriptor;
    }
    if (found == nullptr) {
      std::string known;
      for (const auto& descriptor : descriptors) {
        known += (known.empty() ? "" : ", ") + descriptor.name;
      }
      return InvalidArgument("backend " + std::string(backend_id) + " has no option '" + key +
                             "' (known: " + (known.empty() ? "none" : known) + ")");
    }
    if (TypeOf(value) != found->type) {
      return InvalidArgument("backend " + std::string(backend_id) + " option '" + key + "' is " +
                             std::string(ToString(found->type)) + ", got " +
                             std::string(ToString(TypeOf(value))) + " " + ToString(value));
    }
  }
  return Status::Ok();
}

// One call's values (SDK 1.4 per-call options) as `descriptors` declare them: an int64 value of
// a double option becomes that double, since a request's `1` (JSON) or int64 parameter (gRPC)
// means 1.0 there. Everything else is left as given, for ValidateCallOptions to judge.
inline BackendOptions WidenedCallOptions(BackendOptions values,
                                         const std::vector<OptionDescriptor>& descriptors) {
  for (const auto& descriptor : descriptors) {
    if (descriptor.type != OptionType::kDouble)
      continue;
    auto it = values.find(descriptor.name);
    if (it == values.end())
      continue;
    if (const auto* integer = std::get_if<int64_t>(&it->second))
      it->second = static_cast<double>(*integer);
  }
  return values;
}

// Checks one call's values for a backend (SDK 1.4 per-call options): every key declared by
// `descriptors` with a value of its type (ValidateOptions; an int64 for a double option is taken,
// WidenedCallOptions), and named among `per_call`, the options the backend takes per call
// (IBackend::DescribeCallOptions).
inline Status ValidateCallOptions(const BackendOptions& call_options,
                                  const std::vector<OptionDescriptor>& descriptors,
                                  const std::vector<std::string>& per_call,
                                  std::string_view backend_id) {
  BACKPLANE_RETURN_IF_ERROR(
      ValidateOptions(WidenedCallOptions(call_options, descriptors), descriptors, backend_id));
  for (const auto& [key, value] : call_options) {
    bool allowed = false;
    for (const auto& name : per_call)
      allowed = allowed || name == key;
    if (!allowed) {
      std::string names;
      for (const auto& name : per_call)
        names += (names.empty() ? "" : ", ") + name;
      return InvalidArgument("backend " + std::string(backend_id) + " option '" + key +
                             "' is not taken per call, only per network or per runtime (per "
                             "call: " +
                             (names.empty() ? "none" : names) + ")");
    }
  }
  return Status::Ok();
}

// The current values of a backend's options, validated against its descriptors. A ready-made
// implementation of the IBackend option calls for authors.
//
// Thread-safe: Update and Get may race with each other.
class OptionSet {
 public:
  OptionSet(std::string backend_id, std::vector<OptionDescriptor> descriptors)
      : backend_id_(std::move(backend_id)),
        descriptors_(WithTypedDefaults(std::move(descriptors))) {
    for (const auto& descriptor : descriptors_)
      values_[descriptor.name] = descriptor.default_value;
  }

  const std::vector<OptionDescriptor>& descriptors() const { return descriptors_; }

  // All-or-nothing: an unknown key or a wrong type changes nothing.
  Status Update(const BackendOptions& changes) {
    BACKPLANE_RETURN_IF_ERROR(ValidateOptions(changes, descriptors_, backend_id_));
    MutexLock lock(mutex_);
    for (const auto& [key, value] : changes)
      values_[key] = value;
    return Status::Ok();
  }

  Result<OptionValue> Get(std::string_view key) const {
    MutexLock lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) {
      return NotFound("backend " + backend_id_ + " has no option '" + std::string(key) + "'");
    }
    return it->second;
  }

  // The value of an option known to exist with type T (a programmer error otherwise).
  template <typename T>
  T GetAs(std::string_view key) const {
    MutexLock lock(mutex_);
    return std::get<T>(values_.find(key)->second);
  }

 private:
  // `{"ratio", OptionType::kDouble, 1, ...}` stores an int64 default: a trap that would make
  // GetAs<double> throw later. Integer defaults of double options are converted; any other
  // mismatch is a programmer error.
  static std::vector<OptionDescriptor> WithTypedDefaults(
      std::vector<OptionDescriptor> descriptors) {
    for (auto& descriptor : descriptors) {
      if (descriptor.type == OptionType::kDouble) {
        if (const auto* integer = std::get_if<int64_t>(&descriptor.default_value)) {
          descriptor.default_value = static_cast<double>(*integer);
        }
      }
      assert(TypeOf(descriptor.default_value) == descriptor.type &&
             "an option's default value must have the option's type");
    }
    return descriptors;
  }

  const std::string backend_id_;
  const std::vector<OptionDescriptor> descriptors_;
  mutable Mutex mutex_;
  BackendOptions values_ BACKPLANE_GUARDED_BY(mutex_);
};

}  // namespace backplane
