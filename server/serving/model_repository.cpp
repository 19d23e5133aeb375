#include "serving/model_repository.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "backplane/core/quoted.hpp"
#include "backplane/loader/reaper.hpp"
#include "config/config_json.hpp"
#include "config/option_json.hpp"
#include "metrics/metrics.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kModelFile = "model.onnx";
constexpr std::string_view kConfigFile = "config.json";
// Versions are JSON numbers in config files: keep them exact as doubles too.
constexpr int64_t kMaxVersion = int64_t{1} << 53;

// A version directory name: a positive integer written without leading zeros ("1", "12"),
// so that "01" and "1" cannot name the same version twice.
std::optional<int64_t> ParseVersion(std::string_view text) {
  if (text.empty() || text.size() > 16 || text[0] == '0')
    return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9')
      return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > kMaxVersion)
    return std::nullopt;
  return value;
}

std::string Join(const std::vector<int64_t>& numbers) {
  std::string text;
  for (int64_t number : numbers)
    text += (text.empty() ? "" : ", ") + std::to_string(number);
  return text;
}

Result<VersionPolicy> ParseVersionPolicy(const json& value, std::string_view where) {
  const std::string prefix = std::string(where) + ": 'version_policy' ";
  if (!value.is_object() || value.size() != 1) {
    return InvalidArgument(prefix +
                           "must be an object with one key: {\"latest\": N}, {\"all\": true} or "
                           "{\"specific\": [versions]}; got " +
                           value.dump());
  }
  const std::string kind = value.begin().key();
  const json& argument = value.begin().value();
  VersionPolicy policy;
  if (kind == "latest") {
    if (!argument.is_number_integer() || argument.get<int64_t>() < 1 ||
        argument.get<int64_t>() > 1000) {
      return InvalidArgument(prefix + "'latest' must be an integer from 1 to 1000, got " +
                             argument.dump());
    }
    policy.kind = VersionPolicy::Kind::kLatest;
    policy.latest = argument.get<int64_t>();
  } else if (kind == "all") {
    if (!(argument.is_boolean() && argument.get<bool>()) &&
        !(argument.is_object() && argument.empty())) {
      return InvalidArgument(prefix + "'all' must be true (or {}), got " + argument.dump());
    }
    policy.kind = VersionPolicy::Kind::kAll;
  } else if (kind == "specific") {
    if (!argument.is_array() || argument.empty()) {
      return InvalidArgument(prefix + "'specific' must be a non-empty array of versions, got " +
                             argument.dump());
    }
    policy.kind = VersionPolicy::Kind::kSpecific;
    for (const auto& version : argument) {
      if (!version.is_number_integer() || version.get<int64_t>() < 1 ||
          version.get<int64_t>() > kMaxVersion) {
        return InvalidArgument(prefix + "'specific' holds " + version.dump() +
                               ", which is not a positive integer version");
      }
      policy.versions.push_back(version.get<int64_t>());
    }
    std::sort(policy.versions.begin(), policy.versions.end());
    policy.versions.erase(std::unique(policy.versions.begin(), policy.versions.end()),
                          policy.versions.end());
  } else {
    return InvalidArgument(prefix + "has unknown kind '" + kind +
                           "' (known: latest, all, specific)");
  }
  return policy;
}

// The version directories of a model that hold a model file, ascending.
std::vector<int64_t> ListVersions(const fs::path& model_dir) {
  std::vector<int64_t> versions;
  std::error_code error;
  for (fs::directory_iterator it(model_dir, error), end; !error && it != end; it.increment(error)) {
    const auto version = ParseVersion(it->path().filename().string());
    std::error_code file_error;
    if (version && fs::is_regular_file(it->path() / kModelFile, file_error)) {
      versions.push_back(*version);
    } else if (it->is_directory(file_error)) {
      Log().debug("model directory {}: ignoring {} (not a version directory with {})",
                  model_dir.string(), it->path().filename().string(), kModelFile);
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

// The model directories of the repository, by name.
std::vector<std::string> ListModelNames(const fs::path& root) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(root, error), end; !error && it != end; it.increment(error)) {
    std::error_code kind_error;
    const std::string name = it->path().filename().string();
    if (it->is_directory(kind_error) && IsValidModelName(name))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<ModelConfig> ReadModelConfig(const fs::path& model_dir, std::string_view name) {
  const fs::path file = model_dir / kConfigFile;
  std::error_code error;
  if (!fs::exists(file, error))
    return ModelConfig{};
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return InvalidArgument("model '" + std::string(name) + "': cannot read " + file.string());
  }
  return ParseModelConfigText(text.str(), file.string());
}

}  // namespace

// ---- Config and names -----------------------------------------------------------------------

namespace {

// {"ID": {"key": scalar, ...}, ...}: only the shape is checked here; the keys and types are the
// backend's, checked when a version loads.
Result<std::map<std::string, json, std::less<>>> ParseBackendOptions(const json& value,
                                                                     std::string_view where) {
  const auto wrong = [&](const std::string& why) {
    return InvalidArgument(std::string(where) + ": 'backend_options' " + why +
                           " (e.g. {\"CpuAcc\": {\"intra_op_threads\": 1}})");
  };
  if (!value.is_object())
    return wrong("must be an object of option values per backend id");
  std::map<std::string, json, std::less<>> options;
  for (const auto& [id, values] : value.items()) {
    if (id.empty())
      return wrong("names an empty backend id");
    if (!values.is_object())
      return wrong("for backend " + id + " must be an object of option values");
    for (const auto& [option, option_value] : values.items()) {
      if (!option_value.is_primitive() || option_value.is_null()) {
        return wrong("for backend " + id + ": option '" + option +
                     "' must be a boolean, a number or a string");
      }
    }
    options.emplace(id, values);
  }
  return options;
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const json& document, std::string_view where) {
  if (!document.is_object()) {
    return InvalidArgument(std::string(where) + ": must hold a JSON object, got " +
                           document.type_name());
  }
  ModelConfig config;
  const json* dynamic_batching = nullptr;  // parsed last: it depends on max_batch_size
  for (const auto& [key, value] : document.items()) {
    if (key == "backends") {
      if (!value.is_array())
        return InvalidArgument(std::string(where) + ": 'backends' must be an array of backend ids");
      for (const auto& id : value) {
        if (!id.is_string() || id.get<std::string>().empty()) {
          return InvalidArgument(std::string(where) + ": 'backends' holds " + id.dump() +
                                 ", which is not a backend id");
        }
        config.backends.push_back(id.get<std::string>());
      }
    } else if (key == "max_in_flight") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > 1000000) {
        return InvalidArgument(std::string(where) +
                               ": 'max_in_flight' must be an integer from 0 (no limit) to "
                               "1000000, got " +
                               value.dump());
      }
      config.max_in_flight = value.get<int64_t>();
    } else if (key == "instances") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > 1024) {
        return InvalidArgument(std::string(where) +
                               ": 'instances' must be an integer from 0 (no limit) to 1024, got " +
                               value.dump());
      }
      config.instances = value.get<int64_t>();
    } else if (key == "version_policy") {
      auto policy = ParseVersionPolicy(value, where);
      if (!policy.ok())
        return policy.error();
      config.version_policy = std::move(policy).value();
    } else if (key == "max_batch_size") {
      auto max_batch_size = ParseMaxBatchSize(value, where);
      if (!max_batch_size.ok())
        return max_batch_size.error();
      config.max_batch_size = max_batch_size.value();
    } else if (key == "dynamic_batching") {
      dynamic_batching = &value;
    } else if (key == "backend_options") {
      auto options = ParseBackendOptions(value, where);
      if (!options.ok())
        return options.error();
      config.backend_options = std::move(options).value();
    } else {
      return InvalidArgument(std::string(where) + ": unknown key '" + key +
                             "' (known: backends, max_in_flight, instances, version_policy, "
                             "max_batch_size, dynamic_batching, backend_options)");
    }
  }
  if (dynamic_batching != nullptr) {
    auto batching = ParseDynamicBatching(*dynamic_batching, config.max_batch_size, where);
    if (!batching.ok())
      return batching.error();
    config.dynamic_batching = std::move(batching).value();
  }
  return config;
}

Result<ModelConfig> ParseModelConfigText(std::string_view text, std::string_view where) {
  auto document = ParseConfigJson(text, where, /*comments=*/false);
  if (!document.ok())
    return document.error();
  return ParseModelConfig(document.value(), where);
}

bool IsValidModelName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name[0] == '.')
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

// ---- ModelVersion ---------------------------------------------------------------------------

namespace {

// A model's "backend_options" typed by what each backend of the runtime declares. A backend the
// runtime does not have cannot type them: they are skipped with a warning, as a preference for it
// is.
Result<OptionsByBackend> TypedBackendOptions(
    const Runtime& runtime, std::string_view model,
    const std::map<std::string, json, std::less<>>& given) {
  OptionsByBackend typed;
  for (const auto& [id, values] : given) {
    const auto instance = runtime.Backend(id);
    if (instance == nullptr) {
      Log().warn(
          "model {}: backend_options for backend {}, which this server does not have, are "
          "ignored",
          model, id);
      continue;
    }
    auto options = OptionsFromJson(values, instance->DescribeOptions(), id);
    if (!options.ok()) {
      return options.error().WithContext("model '" + std::string(model) + "': backend_options: ");
    }
    typed.emplace(id, std::move(options).value());
  }
  return typed;
}

// The runtime's backend ids and the backend id of each layer of network `id`: what a placement
// depends on and what it chose. Generations are left out: a swap moves networks by itself.
std::pair<std::vector<std::string>, std::vector<std::string>> PlacementOf(const Runtime& runtime,
                                                                          NetworkId id) {
  std::vector<std::string> layers;
  if (auto placement = runtime.GetPlacement(id); placement.ok()) {
    for (const auto& layer : placement.value())
      layers.push_back(layer.backend_id);
  }
  return {runtime.BackendIds(), std::move(layers)};
}

}  // namespace

ModelVersion::ModelVersion(Runtime& runtime, NetworkId id, std::string model, int64_t version,
                           std::shared_ptr<const Network> network, fs::file_time_type mtime,
                           uintmax_t size, std::unique_ptr<RequestQueue> queue)
    : runtime_(runtime),
      id_(id),
      model_(std::move(model)),
      version_(version),
      network_(std::move(network)),
      mtime_(mtime),
      size_(size),
      placement_at_load_(PlacementOf(runtime, id)),
      queue_(std::move(queue)) {}

bool ModelVersion::PlacedAsLoaded() const {
  return PlacementOf(runtime_, id_) == placement_at_load_;
}

ModelVersion::~ModelVersion() {
  // Runs on the reaper thread (see Prepare), whichever thread dropped the last reference. No
  // request waits in the queue any more (each holds this version); a batcher's threads stop
  // first.
  queue_.reset();
  Status unloaded = runtime_.UnloadNetwork(id_);
  if (unloaded.ok()) {
    Log().info("model {} version {} unloaded", model_, version_);
  } else {
    Log().warn("model {} version {}: unloading its network failed: {}", model_, version_,
               unloaded.ToString());
  }
}

std::shared_ptr<const ModelVersion> ServingModel::Version(int64_t version) const {
  auto it = versions.find(version);
  return it == versions.end() ? nullptr : it->second;
}

// ---- ModelRepository ------------------------------------------------------------------------

ModelRepository::ModelRepository(fs::path root, Runtime& runtime, ServerMetrics& metrics,
                                 BatcherLimits batcher_limits)
    : root_(std::move(root)),
      runtime_(runtime),
      metrics_(metrics),
      batcher_limits_(batcher_limits) {}

ModelRepository::~ModelRepository() {
  UnloadAll();
  // The versions just released unload on the reaper, through the runtime, which the caller
  // destroys next.
  runtime_.registry().loader().reaper()->WaitIdle();
}

std::shared_ptr<const ServingModel> ModelRepository::Find(std::string_view name) const {
  const auto snapshot = snapshot_.Load();
  auto it = snapshot->serving.find(name);
  return it == snapshot->serving.end() ? nullptr : it->second;
}

ResolvedModel ModelRepository::FindNetwork(NetworkId id) const {
  const auto snapshot = snapshot_.Load();
  for (const auto& [name, model] : snapshot->serving) {
    for (const auto& [number, version] : model->versions) {
      if (version->network_id() == id)
        return {model, version};
    }
  }
  return {};
}

std::optional<std::string> ModelRepository::Unavailable(std::string_view name) const {
  const auto snapshot = snapshot_.Load();
  if (snapshot->serving.contains(name))
    return std::nullopt;
  if (auto it = snapshot->unavailable.find(name); it != snapshot->unavailable.end())
    return it->second;
  std::error_code error;
  if (IsValidModelName(name) && fs::is_directory(root_ / name, error))
    return std::string("not loaded");
  return std::nullopt;
}

std::vector<ModelIndexEntry> ModelRepository::Index() const {
  const auto snapshot = snapshot_.Load();
  std::set<std::string, std::less<>> names;
  for (const auto& name : ListModelNames(root_))
    names.insert(name);
  for (const auto& [name, model] : snapshot->serving)
    names.insert(name);
  std::vector<ModelIndexEntry> entries;
  for (const auto& name : names) {
    if (auto it = snapshot->serving.find(name); it != snapshot->serving.end()) {
      for (const auto& [version, loaded] : it->second->versions)
        entries.push_back({name, std::to_string(version), "READY", ""});
      continue;
    }
    auto reason = snapshot->unavailable.find(name);
    entries.push_back({name, "", "UNAVAILABLE",
                       reason == snapshot->unavailable.end() ? "not loaded" : reason->second});
  }
  return entries;
}

void ModelRepository::Publish(const std::function<void(Snapshot&)>& change) {
  auto next = std::make_shared<Snapshot>(*snapshot_.Load());
  change(*next);
  snapshot_.Publish(std::move(next));
}

Result<std::shared_ptr<const ServingModel>> ModelRepository::Prepare(const std::string& name,
                                                                     const ServingModel* current) {
  const fs::path model_dir = root_ / name;
  std::error_code error;
  if (!fs::is_directory(model_dir, error)) {
    return NotFound("model " + Quoted(name) + " is not in the model repository " + root_.string());
  }
  auto config = ReadModelConfig(model_dir, name);
  if (!config.ok())
    return config.error();

  const std::vector<int64_t> available = ListVersions(model_dir);
  if (available.empty()) {
    return InvalidArgument("model '" + name + "' has no version directory <N>/" +
                           std::string(kModelFile) + " in " + model_dir.string());
  }
  std::vector<int64_t> selected;
  const VersionPolicy& policy = config->version_policy;
  switch (policy.kind) {
    case VersionPolicy::Kind::kLatest: {
      const auto count = std::min<std::size_t>(available.size(), policy.latest);
      selected.assign(available.end() - static_cast<std::ptrdiff_t>(count), available.end());
      break;
    }
    case VersionPolicy::Kind::kAll:
      selected = available;
      break;
    case VersionPolicy::Kind::kSpecific: {
      std::vector<int64_t> missing;
      for (int64_t version : policy.versions) {
        if (std::binary_search(available.begin(), available.end(), version))
          selected.push_back(version);
        else
          missing.push_back(version);
      }
      if (!missing.empty()) {
        return InvalidArgument("model '" + name + "': version_policy selects version(s) " +
                               Join(missing) + " that have no " + std::string(kModelFile) +
                               " (available: " + Join(available) + ")");
      }
      break;
    }
  }

  auto model = std::make_shared<ServingModel>();
  model->name = name;
  model->config = config.value();
  model->metrics = &metrics_.ForModel(name);
  auto backend_options = TypedBackendOptions(runtime_, name, model->config.backend_options);
  if (!backend_options.ok())
    return backend_options.error();
  for (int64_t version : selected) {
    const fs::path file = model_dir / std::to_string(version) / kModelFile;
    const auto mtime = fs::last_write_time(file, error);
    const auto size = fs::file_size(file, error);
    // Unchanged file, preferences and placement: keep the loaded network (requests see no change
    // at all). Otherwise the new network is loaded beside the serving one and replaces it in one
    // publish, so the model is never out of service.
    if (current != nullptr && current->config.backends == model->config.backends &&
        current->config.max_batch_size == model->config.max_batch_size &&
        current->config.dynamic_batching == model->config.dynamic_batching &&
        current->config.backend_options == model->config.backend_options) {
      if (auto loaded = current->Version(version);
          loaded && loaded->SameFile(mtime, size) && loaded->PlacedAsLoaded()) {
        // A changed instance count needs no new network: the limit changes in place.
        if (current->config.instances != model->config.instances) {
          BACKPLANE_RETURN_IF_ERROR(runtime_.SetNetworkInstances(
              loaded->network_id(), static_cast<std::size_t>(model->config.instances)));
        }
        model->versions.emplace(version, loaded);
        continue;
      }
    }
    const std::string what = "model '" + name + "' version " + std::to_string(version);
    auto network = ImportOnnxFile(file);
    if (!network.ok())
      return network.error().WithContext(what + ": ");
    // Before the network is placed: a model that cannot batch is refused with the reason.
    if (model->config.max_batch_size > 0) {
      if (Status batchable = CheckBatchable(network.value(), what); !batchable.ok())
        return batchable;
    }
    NetworkOptions network_options{.backend_preferences = model->config.backends,
                                   .backend_options = backend_options.value(),
                                   .instances = static_cast<std::size_t>(model->config.instances)};
    // A batched model executes at each of its execution batch sizes: a shape program for every
    // one, so that none is evicted by the others (dynamic_batcher.hpp).
    if (model->config.dynamic_batching) {
      network_options.shape_program_capacity =
          std::max(network_options.shape_program_capacity,
                   ExecutionBatchSizes(model->config.max_batch_size,
                                       model->config.dynamic_batching->preferred_batch_sizes)
                       .size());
    }
    auto id = runtime_.LoadNetwork(std::move(network).value(), network_options);
    if (!id.ok()) {
      // The runtime's kNotFound is about backends (none the config prefers is registered), not
      // about the model: a client must not read "no such model" (404) for one that exists.
      if (id.error().code() == StatusCode::kNotFound)
        return Status(StatusCode::kFailedPrecondition, what + ": " + id.error().message());
      return id.error().WithContext(what + ": ");
    }
    auto loaded_network = runtime_.GetNetwork(id.value());
    if (!loaded_network.ok()) {
      (void)runtime_.UnloadNetwork(id.value());
      return loaded_network.error().WithContext(what + ": ");
    }
    // The request queue is chosen here, once: the request path never asks whether it batches.
    std::unique_ptr<RequestQueue> queue;
    if (model->config.dynamic_batching) {
      queue = std::make_unique<DynamicBatcher>(
          runtime_, DynamicBatcher::Options{.network = id.value(),
                                            .what = what,
                                            .max_batch_size = model->config.max_batch_size,
                                            .batching = *model->config.dynamic_batching,
                                            .limits = batcher_limits_,
                                            .metrics = model->metrics});
    } else {
      queue = std::make_unique<RuntimeQueue>(
          runtime_, RuntimeQueue::Options{.network = id.value(),
                                          .what = what,
                                          .max_batch_size = model->config.max_batch_size,
                                          .metrics = model->metrics});
    }
    // From here the ModelVersion owns the network: a later failure unloads it on the way out.
    // Unloading takes the runtime's lock, which a backend swap holds while it prepares every
    // network, and calls backend hooks: the last request to let go of a version that stopped
    // serving must not do that on its own thread (docs/loading-rules.md rule 6). The reaper does.
    model->versions.emplace(version, loader::MakeReaped(std::make_unique<const ModelVersion>(
                                                            runtime_, id.value(), name, version,
                                                            std::move(loaded_network).value(),
                                                            mtime, size, std::move(queue)),
                                                        runtime_.registry().loader().reaper()));
    std::string placed;
    if (auto placement = runtime_.GetPlacement(id.value()); placement.ok()) {
      std::map<std::string, int> layers_by_backend;
      for (const auto& layer : placement.value()) {
        ++layers_by_backend[layer.backend_id +
                            (layer.generation == 0
                                 ? std::string(" (static)")
                                 : " generation " + std::to_string(layer.generation))];
      }
      for (const auto& [backend, count] : layers_by_backend)
        placed += (placed.empty() ? "" : ", ") + std::to_string(count) + " on " + backend;
    }
    Log().info("model {} version {} loaded from {}: layers {}", name, version, file.string(),
               placed);
  }
  return std::shared_ptr<const ServingModel>(std::move(model));
}

Status ModelRepository::Load(std::string_view name_view) {
  const std::string name(name_view);
  if (!IsValidModelName(name)) {
    return InvalidArgument(Quoted(name) +
                           " is not a valid model name (1-128 characters of A-Z a-z 0-9 _ . -, "
                           "not starting with '.')");
  }
  MutexLock lock(load_mutex_);
  const auto current = Find(name);
  auto prepared = Prepare(name, current.get());
  if (!prepared.ok()) {
    Log().error("{}", prepared.error().message());
    // A model of the repository that fails to load is recorded as unavailable, with why; a
    // name that is no model directory is not (clients must not grow the map).
    std::error_code error;
    if (current == nullptr && fs::is_directory(root_ / name, error)) {
      Publish([&](Snapshot& snapshot) { snapshot.unavailable[name] = prepared.error().message(); });
    }
    return prepared.error();
  }
  // Versions of `current` that the new model does not keep are released here; each unloads
  // its network once the requests still holding it finish.
  Publish([&](Snapshot& snapshot) {
    snapshot.serving[name] = prepared.share();
    snapshot.unavailable.erase(name);
  });
  return Status::Ok();
}

Status ModelRepository::Unload(std::string_view name) {
  MutexLock lock(load_mutex_);
  if (Find(name) == nullptr)
    return NotFound("model " + Quoted(name) + " is not loaded");
  Publish([&](Snapshot& snapshot) {
    snapshot.serving.erase(snapshot.serving.find(name));
    snapshot.unavailable[std::string(name)] = "unloaded";
  });
  Log().info("model {} no longer serving (unloaded)", name);
  return Status::Ok();
}

int ModelRepository::LoadAll() {
  std::error_code error;
  if (!fs::is_directory(root_, error)) {
    Log().error("model repository {} is not a directory: no model is served", root_.string());
    return 0;
  }
  int serving = 0;
  for (const auto& name : ListModelNames(root_)) {
    if (Load(name).ok())
      ++serving;
  }
  Log().info("model repository {}: {} model(s) serving", root_.string(), serving);
  return serving;
}

void ModelRepository::UnloadAll() {
  MutexLock lock(load_mutex_);
  snapshot_.Publish(std::make_shared<const Snapshot>());
}

Result<ResolvedModel> ResolveModel(const ModelRepository& repository, std::string_view name,
                                   std::string_view version_text) {
  auto model = repository.Find(name);
  if (model == nullptr) {
    if (auto reason = repository.Unavailable(name)) {
      return Status(StatusCode::kUnavailable,
                    "model " + Quoted(name) + " is not ready: " + *reason);
    }
    return NotFound("unknown model " + Quoted(name));
  }
  if (version_text.empty())
    return ResolvedModel{model, model->versions.rbegin()->second};
  std::string loaded;
  for (const auto& [number, version] : model->versions)
    loaded += (loaded.empty() ? "" : ", ") + std::to_string(number);
  const auto number = ParseVersion(version_text);
  auto version = number ? model->Version(*number) : nullptr;
  if (version == nullptr) {
    return NotFound("model " + Quoted(name) + " has no version " + Quoted(version_text) +
                    " serving (serving: " + loaded + ")");
  }
  return ResolvedModel{model, std::move(version)};
}

}  // namespace backplane::server
