#include "config/option_json.hpp"

#include <limits>
#include <string>

#include "backplane/core/quoted.hpp"

namespace backplane::server {
using nlohmann::json;

Result<OptionValue> OptionFromJson(const json& value, const OptionDescriptor& option,
                                   std::string_view backend_id) {
  const auto wrong = [&] {
    return InvalidArgument("backend " + std::string(backend_id) + " option '" + option.name +
                           "' is " + std::string(ToString(option.type)) + ", got " +
                           Excerpt(value.dump(-1, ' ', false, json::error_handler_t::replace)));
  };
  switch (option.type) {
    case OptionType::kBool:
      if (!value.is_boolean())
        return wrong();
      return OptionValue(value.get<bool>());
    case OptionType::kInt64:
      // An unsigned value above int64's range would wrap: refuse it.
      if (!value.is_number_integer() ||
          (value.is_number_unsigned() &&
           value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
        return wrong();
      }
      return OptionValue(value.get<int64_t>());
    case OptionType::kDouble:
      if (!value.is_number())
        return wrong();
      return OptionValue(value.get<double>());
    case OptionType::kString:
      if (!value.is_string())
        return wrong();
      return OptionValue(value.get<std::string>());
  }
  return wrong();
}

Result<BackendOptions> OptionsFromJson(const json& values,
                                       const std::vector<OptionDescriptor>& descriptors,
                                       std::string_view backend_id) {
  if (!values.is_object()) {
    return InvalidArgument("the options of backend " + std::string(backend_id) +
                           " must be a JSON object of option values, e.g. {\"" +
                           (descriptors.empty() ? std::string("name") : descriptors.front().name) +
                           "\": ...}");
  }
  BackendOptions options;
  for (const auto& [key, value] : values.items()) {
    const OptionDescriptor* descriptor = nullptr;
    for (const auto& candidate : descriptors) {
      if (candidate.name == key)
        descriptor = &candidate;
    }
    if (descriptor == nullptr) {
      // ValidateOptions says it in the runtime's words, naming the known keys.
      return ValidateOptions({{key, OptionValue{}}}, descriptors, backend_id);
    }
    auto converted = OptionFromJson(value, *descriptor, backend_id);
    if (!converted.ok())
      return std::move(converted).error();
    options.emplace(key, std::move(converted).value());
  }
  return options;
}

json OptionValueJson(const OptionValue& value) {
  return std::visit([](const auto& v) { return json(v); }, value);
}

json OptionsJson(const BackendOptions& options) {
  json object = json::object();
  for (const auto& [key, value] : options)
    object[key] = OptionValueJson(value);
  return object;
}

}  // namespace backplane::server
