// Backend option values as JSON carries them: a model's config.json "backend_options", the admin
// API's option bodies and answers, `backplane run --option`. JSON has no option types, so a
// value is typed by what the backend declares for its key.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "backplane/core/options.hpp"
#include "backplane/core/status.hpp"

namespace backplane::server {

// A JSON value as an option of `option.type`: bool ← true/false, int64 ← an integer, double ←
// any number, string ← a string. kInvalidArgument naming the backend, the option, the type and
// the value.
Result<OptionValue> OptionFromJson(const nlohmann::json& value, const OptionDescriptor& option,
                                   std::string_view backend_id);

// Every member of the JSON object `values`, typed by `descriptors`: all-or-nothing, the first
// unknown key (with the known ones) or wrong type is kInvalidArgument naming backend and key.
// Range checks are the backend's (IBackend::CheckOptions).
Result<BackendOptions> OptionsFromJson(const nlohmann::json& values,
                                       const std::vector<OptionDescriptor>& descriptors,
                                       std::string_view backend_id);

nlohmann::json OptionValueJson(const OptionValue& value);
// {"key": value, ...}
nlohmann::json OptionsJson(const BackendOptions& options);

}  // namespace backplane::server
