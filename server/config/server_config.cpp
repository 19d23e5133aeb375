#include "config/server_config.hpp"

#include "config/config_json.hpp"
#include "config/rollout_policy.hpp"

#include "backplane/loader/loader.hpp"

#include <charconv>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace backplane::server {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One config key: how to read it from JSON into a ServeConfig, and its default for the docs.
struct ConfigKey {
  std::string_view name;
  std::function<Status(const json& value, const fs::path& base, ServeConfig& config)> apply;
  std::function<json(const ServeConfig& defaults)> show;
};

// Typed readers. `key` names the key in every message.
Result<std::string> ReadString(const json& value, std::string_view key) {
  if (!value.is_string())
    return InvalidArgument("'" + std::string(key) + "' must be a string, got " + value.dump());
  return value.get<std::string>();
}

Result<int64_t> ReadInteger(const json& value, std::string_view key, int64_t min, int64_t max) {
  if (!value.is_number_integer()) {
    return InvalidArgument("'" + std::string(key) + "' must be an integer, got " + value.dump());
  }
  // number_unsigned above int64's range reads back as a negative int64: compare unsigned first.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgument("'" + std::string(key) + "' must be at most " + std::to_string(max));
  }
  const int64_t number = value.get<int64_t>();
  if (number < min || number > max) {
    return InvalidArgument("'" + std::string(key) + "' must be between " + std::to_string(min) +
                           " and " + std::to_string(max) + ", got " + std::to_string(number));
  }
  return number;
}

Result<bool> ReadBool(const json& value, std::string_view key) {
  if (!value.is_boolean())
    return InvalidArgument("'" + std::string(key) + "' must be true or false, got " + value.dump());
  return value.get<bool>();
}

Result<std::vector<std::string>> ReadStrings(const json& value, std::string_view key) {
  if (!value.is_array()) {
    return InvalidArgument("'" + std::string(key) + "' must be an array of strings, got " +
                           value.dump());
  }
  std::vector<std::string> strings;
  for (const auto& element : value) {
    if (!element.is_string()) {
      return InvalidArgument("'" + std::string(key) + "' must be an array of strings, got " +
                             element.dump() + " in it");
    }
    strings.push_back(element.get<std::string>());
  }
  return strings;
}

fs::path Resolve(const fs::path& base, const std::string& path) {
  const fs::path given(path);
  return given.is_absolute() ? given : base / given;
}

template <typename Field>
ConfigKey IntegerKey(std::string_view name, Field ServeConfig::*field, int64_t min, int64_t max) {
  return {name,
          [=](const json& value, const fs::path&, ServeConfig& config) -> Status {
            auto number = ReadInteger(value, name, min, max);
            if (!number.ok())
              return number.error();
            config.*field = static_cast<Field>(number.value());
            return Status::Ok();
          },
          [=](const ServeConfig& defaults) { return json(defaults.*field); }};
}

template <typename Duration>
ConfigKey DurationKey(std::string_view name, Duration ServeConfig::*field, int64_t min,
                      int64_t max) {
  return {name,
          [=](const json& value, const fs::path&, ServeConfig& config) -> Status {
            auto number = ReadInteger(value, name, min, max);
            if (!number.ok())
              return number.error();
            config.*field = Duration(number.value());
            return Status::Ok();
          },
          [=](const ServeConfig& defaults) { return json((defaults.*field).count()); }};
}

ConfigKey StringKey(std::string_view name, std::string ServeConfig::*field,
                    std::function<Status(const std::string&)> check = {}) {
  return {name,
          [=](const json& value, const fs::path&, ServeConfig& config) -> Status {
            auto text = ReadString(value, name);
            if (!text.ok())
              return text.error();
            if (check) {
              BACKPLANE_RETURN_IF_ERROR(check(text.value()));
            }
            config.*field = text.value();
            return Status::Ok();
          },
          [=](const ServeConfig& defaults) { return json(defaults.*field); }};
}

Status CheckLogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == known)
      return Status::Ok();
  }
  return InvalidArgument(
      "'log_level' must be one of trace, debug, info, warn, error, critical, "
      "off; got '" +
      level + "'");
}

// The table of every key, in the order docs/operators.md lists them.
const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey> keys = {
      {"models",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto text = ReadString(value, "models");
         if (!text.ok())
           return text.error();
         config.models = Resolve(base, text.value());
         return Status::Ok();
       },
       [](const ServeConfig& defaults) { return json(defaults.models.string()); }},
      {"backends",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto paths = ReadStrings(value, "backends");
         if (!paths.ok())
           return paths.error();
         std::vector<fs::path> resolved;
         for (const auto& path : paths.value())
           resolved.push_back(Resolve(base, path));
         config.backends = std::move(resolved);
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("the default backend paths"); }},
      {"backend_preferences",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         auto ids = ReadStrings(value, "backend_preferences");
         if (!ids.ok())
           return ids.error();
         config.backend_preferences = std::move(ids).value();
         return Status::Ok();
       },
       [](const ServeConfig& defaults) { return json(defaults.backend_preferences); }},
      StringKey("listen", &ServeConfig::listen,
                [](const std::string& text) -> Status {
                  auto parsed = ParseListenAddress(text);
                  return parsed.ok() ? Status::Ok() : parsed.error();
                }),
      StringKey("grpc_listen", &ServeConfig::grpc_listen,
                [](const std::string& text) -> Status {
                  if (text == kGrpcOff)
                    return Status::Ok();
                  auto parsed = ParseListenAddress(text);
                  if (parsed.ok())
                    return Status::Ok();
                  return InvalidArgument("'grpc_listen': " + parsed.error().message() +
                                         " (or \"off\")");
                }),
      StringKey("log_level", &ServeConfig::log_level, CheckLogLevel),
      {"admin_token",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         auto text = ReadString(value, "admin_token");
         if (!text.ok())
           return text.error();
         config.admin_token = text.value();
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("none"); }},
      IntegerKey("io_threads", &ServeConfig::io_threads, 1, 64),
      IntegerKey("http_threads", &ServeConfig::http_threads, 1, 4096),
      IntegerKey("max_connections", &ServeConfig::max_connections, 1, 1000000),
      IntegerKey("listen_backlog", &ServeConfig::listen_backlog, 1, 65535),
      IntegerKey("max_body_bytes", &ServeConfig::max_body_bytes, 1024, int64_t{1} << 32),
      IntegerKey("max_buffered_body_bytes", &ServeConfig::max_buffered_body_bytes, 1024,
                 int64_t{1} << 40),
      IntegerKey("grpc_max_concurrent_streams", &ServeConfig::grpc_max_concurrent_streams, 1,
                 1000000),
      IntegerKey("max_json_depth", &ServeConfig::max_json_depth, 2, 1000),
      IntegerKey("max_header_bytes", &ServeConfig::max_header_bytes, 1024, 1 << 20),
      DurationKey("header_timeout_ms", &ServeConfig::header_timeout, 1, 3600000),
      DurationKey("read_timeout_ms", &ServeConfig::read_timeout, 1, 3600000),
      DurationKey("write_timeout_ms", &ServeConfig::write_timeout, 1, 3600000),
      DurationKey("request_timeout_ms", &ServeConfig::request_timeout, 1, 3600000),
      DurationKey("keep_alive_timeout_s", &ServeConfig::keep_alive_timeout, 1, 3600),
      IntegerKey("keep_alive_max_requests", &ServeConfig::keep_alive_max_requests, 1, 1000000),
      IntegerKey("inference_threads", &ServeConfig::inference_threads, 0, 1024),
      IntegerKey("max_in_flight", &ServeConfig::max_in_flight, 1, 1000000),
      StringKey("swap_policy", &ServeConfig::swap_policy,
                [](const std::string& policy) -> Status {
                  if (policy == "migrate" || policy == "pin")
                    return Status::Ok();
                  return InvalidArgument("'swap_policy' must be \"migrate\" or \"pin\", got '" +
                                         policy + "'");
                }),
      {"backend_isolation",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         if (!value.is_object()) {
           return InvalidArgument(
               "'backend_isolation' must be an object of backend id -> \"process\" or "
               "\"none\" (\"*\" for every other id), got " +
               value.dump());
         }
         std::map<std::string, bool, std::less<>> isolation;
         for (const auto& [id, mode] : value.items()) {
           if (id != "*" && !loader::IsValidBackendId(id)) {
             return InvalidArgument("'backend_isolation': '" + id +
                                    "' is not a backend id (1 to 64 letters, digits, '_', "
                                    "'-' or '.') or \"*\"");
           }
           if (!mode.is_string() || (mode != "process" && mode != "none")) {
             return InvalidArgument("'backend_isolation': backend " + id +
                                    " must be \"process\" or \"none\", got " + mode.dump());
           }
           isolation[id] = mode == "process";
         }
         config.backend_isolation = std::move(isolation);
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("none (every backend runs in the server)"); }},
      {"worker",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         if (!value.is_object())
           return InvalidArgument("'worker' must be a JSON object, got " + value.dump());
         ServeConfig::WorkerLimits limits = config.worker;
         for (const auto& [key, entry] : value.items()) {
           const std::string name = "worker." + key;
           Result<int64_t> number = InvalidArgument("");
           if (key == "execute_timeout_ms") {
             number = ReadInteger(entry, name, 0, 86400000);
             if (number.ok())
               limits.execute_timeout = std::chrono::milliseconds(*number);
           } else if (key == "memory_limit_bytes") {
             number = ReadInteger(entry, name, 0, int64_t{1} << 48);
             if (number.ok())
               limits.memory_limit_bytes = static_cast<std::size_t>(*number);
           } else if (key == "slots") {
             number = ReadInteger(entry, name, 1, 256);
             if (number.ok())
               limits.slots = static_cast<int>(*number);
           } else if (key == "max_crashes") {
             number = ReadInteger(entry, name, 0, 1000);
             if (number.ok())
               limits.max_crashes = static_cast<int>(*number);
           } else if (key == "crash_window_s") {
             number = ReadInteger(entry, name, 1, 86400);
             if (number.ok())
               limits.crash_window = std::chrono::seconds(*number);
           } else if (key == "slot_bytes") {
             number = ReadInteger(entry, name, 4096, int64_t{1} << 34);
             if (number.ok())
               limits.slot_bytes = static_cast<std::size_t>(*number);
           } else {
             return InvalidArgument("'worker' has no key '" + key +
                                    "' (known: execute_timeout_ms, memory_limit_bytes, "
                                    "max_crashes, crash_window_s, slots, slot_bytes)");
           }
           if (!number.ok())
             return number.error();
         }
         config.worker = limits;
         return Status::Ok();
       },
       [](const ServeConfig& defaults) {
         json limits = json::object();  // (not a brace list: scripts/check_docs.sh reads those)
         limits["execute_timeout_ms"] = defaults.worker.execute_timeout.count();
         limits["memory_limit_bytes"] = defaults.worker.memory_limit_bytes;
         limits["max_crashes"] = defaults.worker.max_crashes;
         limits["crash_window_s"] = defaults.worker.crash_window.count();
         limits["slots"] = defaults.worker.slots;
         limits["slot_bytes"] = defaults.worker.slot_bytes;
         return limits;
       }},
      {"crash_dir",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto text = ReadString(value, "crash_dir");
         if (!text.ok())
           return text.error();
         if (text->empty())
           return InvalidArgument("'crash_dir' must name a directory, got \"\"");
         config.crash_dir = Resolve(base, text.value());
         return Status::Ok();
       },
       [](const ServeConfig& defaults) {
         return defaults.crash_dir.empty() ? json("none (nothing written)")
                                           : json(defaults.crash_dir.string());
       }},
      {"watch_backends",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         auto flag = ReadBool(value, "watch_backends");
         if (!flag.ok())
           return flag.error();
         config.watch_backends = flag.value();
         return Status::Ok();
       },
       [](const ServeConfig& defaults) { return json(defaults.watch_backends); }},
      DurationKey("watch_debounce_ms", &ServeConfig::watch_debounce, 0, 60000),
      DurationKey("rescan_interval_ms", &ServeConfig::rescan_interval, 0, 86400000),
      StringKey("deploy_policy", &ServeConfig::deploy_policy,
                [](const std::string& policy) { return CheckDeployPolicy(policy); }),
      {"rollout",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         return ApplyRolloutPolicy(value, "'rollout'", config.rollout);
       },
       [](const ServeConfig& defaults) { return RolloutPolicyJson(defaults.rollout); }},
      {"state_dir",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto text = ReadString(value, "state_dir");
         if (!text.ok())
           return text.error();
         if (text->empty())
           return InvalidArgument("'state_dir' must name a directory, got \"\"");
         config.state_dir = Resolve(base, text.value());
         return Status::Ok();
       },
       [](const ServeConfig& defaults) {
         return defaults.state_dir.empty() ? json("none (nothing outlives the process)")
                                           : json(defaults.state_dir.string());
       }},
      DurationKey("crash_grace_s", &ServeConfig::crash_grace, 1, 86400),
      {"trusted_backends",
       [](const json& value, const fs::path&, ServeConfig& config) -> Status {
         auto digests = ReadStrings(value, "trusted_backends");
         if (!digests.ok())
           return digests.error();
         // Checked here, so that a typo stops the start naming the entry; kept lowercase, the
         // form the loader's digests and the admin API's sha256 take.
         for (std::size_t i = 0; i < digests->size(); ++i) {
           auto digest = loader::ParseSha256((*digests)[i]);
           if (!digest.ok()) {
             return digest.error().WithContext("'trusted_backends' entry " + std::to_string(i) +
                                               ": ");
           }
           (*digests)[i] = std::move(digest).value();
         }
         config.trusted_backends = std::move(digests).value();
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("none (any backend content loads)"); }},
      {"trusted_backends_file",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto text = ReadString(value, "trusted_backends_file");
         if (!text.ok())
           return text.error();
         if (text->empty())
           return InvalidArgument("'trusted_backends_file' must name a file, got \"\"");
         config.trusted_backends_file = Resolve(base, text.value());
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("none"); }},
      {"trusted_signing_keys",
       [](const json& value, const fs::path& base, ServeConfig& config) -> Status {
         auto paths = ReadStrings(value, "trusted_signing_keys");
         if (!paths.ok())
           return paths.error();
         if (paths->empty()) {
           return InvalidArgument(
               "'trusted_signing_keys' is empty: name at least one public key file, or leave "
               "the key out");
         }
         std::vector<fs::path> resolved;
         for (const auto& path : paths.value())
           resolved.push_back(Resolve(base, path));
         config.trusted_signing_keys = std::move(resolved);
         return Status::Ok();
       },
       [](const ServeConfig&) { return json("none (signatures are not looked at)"); }},
  };
  return keys;
}

std::string KnownKeys() {
  std::string known;
  for (const auto& key : ConfigKeys())
    known += (known.empty() ? "" : ", ") + std::string(key.name);
  return known;
}

}  // namespace

ServeConfig DefaultServeConfig() {
  ServeConfig config;
  config.models = BACKPLANE_DEFAULT_MODEL_REPOSITORY;
  return config;
}

Status ApplyConfigFile(const fs::path& file, ServeConfig& config) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code error;
    if (!fs::exists(file, error))
      return NotFound("config file " + file.string() + " does not exist");
    return InvalidArgument("config file " + file.string() + " cannot be read");
  }
  std::stringstream text;
  text << in.rdbuf();
  return ApplyConfigText(text.str(), file, config);
}

Status ApplyConfigText(std::string_view text, const fs::path& file, ServeConfig& config) {
  auto parsed = ParseConfigJson(text, "config file " + file.string(), /*comments=*/true);
  if (!parsed.ok())
    return parsed.error();
  const json& document = parsed.value();
  if (!document.is_object()) {
    return InvalidArgument("config file " + file.string() + " must hold a JSON object, got " +
                           std::string(document.type_name()));
  }
  // All-or-nothing: a bad key leaves `config` untouched.
  ServeConfig updated = config;
  const fs::path base = file.has_parent_path() ? file.parent_path() : fs::path(".");
  for (const auto& [name, value] : document.items()) {
    const ConfigKey* key = nullptr;
    for (const auto& candidate : ConfigKeys()) {
      if (candidate.name == name)
        key = &candidate;
    }
    if (key == nullptr) {
      return InvalidArgument("config file " + file.string() + ": unknown key '" + name +
                             "' (known: " + KnownKeys() + ")");
    }
    Status applied = key->apply(value, base, updated);
    if (!applied.ok())
      return applied.WithContext("config file " + file.string() + ": ");
  }
  // Two sources of trust would leave one of them silently ignored (or merged, which nobody can
  // tell from either alone).
  if (updated.trusted_backends && !updated.trusted_backends_file.empty()) {
    return InvalidArgument("config file " + file.string() +
                           ": 'trusted_backends' and 'trusted_backends_file' are both set; "
                           "set one (the file, to change the list without a restart)");
  }
  // A budget below one body would refuse every body of the sizes between the two with 503 for
  // ever, a failure that looks like load; refused here instead, naming both keys.
  if (updated.max_buffered_body_bytes < updated.max_body_bytes) {
    return InvalidArgument("config file " + file.string() + ": 'max_buffered_body_bytes' (" +
                           std::to_string(updated.max_buffered_body_bytes) +
                           ") must be at least 'max_body_bytes' (" +
                           std::to_string(updated.max_body_bytes) +
                           "): a body of the largest allowed size could never be read");
  }
  config = std::move(updated);
  return Status::Ok();
}

std::vector<std::string> DescribeConfigKeys() {
  const ServeConfig defaults = DefaultServeConfig();
  std::vector<std::string> lines;
  for (const auto& key : ConfigKeys())
    lines.push_back(std::string(key.name) + ": " + key.show(defaults).dump());
  return lines;
}

std::string ConfigToJson(const ServeConfig& config) {
  json object = json::object();
  for (const auto& key : ConfigKeys())
    object[std::string(key.name)] = key.show(config);
  if (config.backends) {
    object["backends"] = json::array();
    for (const auto& path : *config.backends)
      object["backends"].push_back(path.string());
  } else {
    object["backends"] = nullptr;
  }
  // The key's own show() describes the default for --help; the value is what is configured.
  if (config.backend_isolation.empty()) {
    object["backend_isolation"] = nullptr;
  } else {
    object["backend_isolation"] = json::object();
    for (const auto& [id, process] : config.backend_isolation)
      object["backend_isolation"][id] = process ? "process" : "none";
  }
  object["admin_token"] = config.admin_token.empty() ? json(nullptr) : json("(set)");
  object["trusted_backends"] =
      config.trusted_backends ? json(*config.trusted_backends) : json(nullptr);
  if (config.trusted_signing_keys) {
    object["trusted_signing_keys"] = json::array();
    for (const auto& path : *config.trusted_signing_keys)
      object["trusted_signing_keys"].push_back(path.string());
  } else {
    object["trusted_signing_keys"] = nullptr;
  }
  object["state_dir"] = config.state_dir.empty() ? json(nullptr) : json(config.state_dir.string());
  object["crash_dir"] = config.crash_dir.empty() ? json(nullptr) : json(config.crash_dir.string());
  object["trusted_backends_file"] = config.trusted_backends_file.empty()
                                        ? json(nullptr)
                                        : json(config.trusted_backends_file.string());
  return object.dump(2);
}

Result<std::shared_ptr<const loader::TrustPolicy>> MakeTrustPolicy(const ServeConfig& config) {
  std::vector<std::shared_ptr<const loader::TrustPolicy>> policies;
  if (config.trusted_backends) {
    auto list = loader::DigestAllowlist::FromDigests(*config.trusted_backends);
    if (!list.ok())
      return list.error().WithContext("'trusted_backends' ");
    policies.push_back(std::move(list).value());
  }
  if (!config.trusted_backends_file.empty()) {
    auto list = loader::DigestAllowlist::FromFile(config.trusted_backends_file);
    if (!list.ok())
      return list.error().WithContext("'trusted_backends_file': ");
    policies.push_back(std::move(list).value());
  }
  if (config.trusted_signing_keys) {
    auto keys = loader::SignaturePolicy::FromKeyFiles(*config.trusted_signing_keys);
    if (!keys.ok())
      return keys.error().WithContext("'trusted_signing_keys': ");
    policies.push_back(std::move(keys).value());
  }
  if (policies.empty())
    return std::shared_ptr<const loader::TrustPolicy>();
  if (policies.size() == 1)
    return std::move(policies.front());
  // A digest on the list or a valid signature: the list for builds no key signed (a hotfix).
  return std::shared_ptr<const loader::TrustPolicy>(
      std::make_shared<loader::AnyOfTrust>(std::move(policies)));
}

std::string ListenAddress::ToString() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  const auto invalid = [&](const std::string& why) {
    return InvalidArgument("listen address '" + std::string(text) + "' " + why +
                           " (expected HOST:PORT, e.g. 127.0.0.1:8000 or [::1]:0)");
  };
  ListenAddress address;
  std::string_view port_text;
  if (text.starts_with("[")) {
    const auto close = text.find("]:");
    if (close == std::string_view::npos)
      return invalid("has no closing ']:' after the IPv6 host");
    address.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return invalid("has no port");
    address.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (address.host.find(':') != std::string::npos)
      return invalid("has an IPv6 host without brackets");
  }
  if (address.host.empty())
    return invalid("has no host");
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), address.port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() ||
      address.port < 0 || address.port > 65535) {
    return invalid("has no valid port (0-65535)");
  }
  return address;
}

bool IsLoopbackHost(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

}  // namespace backplane::server
