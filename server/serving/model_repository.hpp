// The model repository in Triton's layout: <root>/<model>/<version>/model.onnx with an optional
// <root>/<model>/config.json. Loads the selected versions of each model onto the runtime and
// publishes them to the request path as immutable snapshots.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/runtime/runtime.hpp"
#include "serving/batching_config.hpp"
#include "serving/dynamic_batcher.hpp"
#include "serving/request_queue.hpp"

namespace backplane::server {

struct ModelMetrics;
class ServerMetrics;
struct ResolvedModel;

// Which version directories of a model are served.
struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int64_t latest = 1;             // kLatest: how many of the highest versions
  std::vector<int64_t> versions;  // kSpecific
  friend bool operator==(const VersionPolicy&, const VersionPolicy&) = default;
};

// A model's config.json. Value type.
struct ModelConfig {
  std::vector<std::string> backends;  // preference list; empty: the server's default
  int64_t max_in_flight = 0;          // requests of this model at once; 0: no per-model limit
  // Executions of each version at once (Triton's instance_group count; NetworkOptions::
  // instances); 0: no limit of its own. Beyond it requests wait their turn.
  int64_t instances = 0;
  VersionPolicy version_policy;
  // Triton's: the most rows (dimension 0) one request, and one batched execution, may hold; 0:
  // the model does not batch. Non-zero requires a symbolic first dimension on every input and
  // output (CheckBatchable, at load) and refuses larger requests.
  int64_t max_batch_size = 0;
  // Present: requests are joined into batched executions (serving/dynamic_batcher.hpp).
  std::optional<DynamicBatching> dynamic_batching;
  // Option values of this model's own per backend id ({"CpuAcc": {"intra_op_threads": 1}}), as
  // given: typed by what the backend declares when a version loads (NetworkOptions::
  // backend_options; an unknown key, a wrong type or a value the backend refuses fails the load).
  std::map<std::string, nlohmann::json, std::less<>> backend_options;
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Parses a config.json document: `{"backends": [...], "max_in_flight": N, "instances": N,
// "version_policy":
// {"latest": N} | {"all": true} | {"specific": [1, 3]}, "max_batch_size": N,
// "dynamic_batching": {...} (batching_config.hpp), "backend_options": {"ID": {"key": value}}}`.
// Unknown keys and wrong types are kInvalidArgument naming the key and `where`.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& document, std::string_view where);
// The same from the file's text: kInvalidArgument "<where> is not valid JSON" when it is not.
Result<ModelConfig> ParseModelConfigText(std::string_view text, std::string_view where);

// Model and version names as they may appear in a URL and on disk: 1-128 characters of
// [A-Za-z0-9_.-], not starting with '.' (no "..", no hidden directories).
bool IsValidModelName(std::string_view name);

// One loaded version of a model. Unloads its network from the runtime when the last request
// using it lets go, so that an unload or reload never fails a request already admitted; the
// repository hands versions out so that this happens on the loader's reaper thread.
// Thread-safe (immutable).
class ModelVersion {
 public:
  // `queue`: where its requests go (RuntimeQueue, or a DynamicBatcher when the model's config
  // has dynamic_batching); not null.
  ModelVersion(Runtime& runtime, NetworkId id, std::string model, int64_t version,
               std::shared_ptr<const Network> network, std::filesystem::file_time_type mtime,
               uintmax_t size, std::unique_ptr<RequestQueue> queue);
  ~ModelVersion();  // stops the queue (a batcher's threads), then unloads the network
  ModelVersion(const ModelVersion&) = delete;
  ModelVersion& operator=(const ModelVersion&) = delete;

  NetworkId network_id() const { return id_; }
  int64_t version() const { return version_; }
  const Network& network() const { return *network_; }
  // Where every admitted request of this version goes.
  RequestQueue& queue() const { return *queue_; }
  // The model file's identity when it was loaded: a `load` call reloads a changed file.
  bool SameFile(std::filesystem::file_time_type mtime, uintmax_t size) const {
    return mtime == mtime_ && size == size_;
  }
  // Whether the network sits where it was placed at load and the runtime offers the backends it
  // offered then. A withdrawn backend moves networks to their next preference; when it comes
  // back, a `load` call re-places the model rather than keeping it on the fallback.
  bool PlacedAsLoaded() const;

 private:
  Runtime& runtime_;
  const NetworkId id_;
  const std::string model_;
  const int64_t version_;
  const std::shared_ptr<const Network> network_;
  const std::filesystem::file_time_type mtime_;
  const uintmax_t size_;
  // What PlacedAsLoaded compares: the runtime's backends and each layer's, at load.
  const std::pair<std::vector<std::string>, std::vector<std::string>> placement_at_load_;
  std::unique_ptr<RequestQueue> queue_;  // reset first in the destructor
};

// A model as requests see it: immutable once published.
struct ServingModel {
  std::string name;
  ModelConfig config;
  std::map<int64_t, std::shared_ptr<const ModelVersion>> versions;  // ascending, never empty
  // Owned by ServerMetrics, which outlives every snapshot; the same object across reloads of
  // the model, so its in-flight count (max_in_flight) spans a reload.
  ModelMetrics* metrics = nullptr;

  const ModelVersion& Latest() const { return *versions.rbegin()->second; }
  // nullptr when `version` is not loaded.
  std::shared_ptr<const ModelVersion> Version(int64_t version) const;
};

// One line of the repository index (Triton's repository extension).
struct ModelIndexEntry {
  std::string name;
  std::string version;  // "" for a model that has no loaded version
  std::string state;    // "READY" or "UNAVAILABLE"
  std::string reason;   // why UNAVAILABLE
};

// Thread-safe. Requests read published snapshots: a lock held only to copy one shared_ptr
// (Published), never across a load; Load, Unload and LoadAll are serialised with each other (they
// read the disk and load networks, which may take seconds).
class ModelRepository {
 public:
  // `runtime` and `metrics` must outlive the repository and every ModelVersion it hands out.
  // `batcher_limits` bound the dynamic batcher of every model that has one.
  ModelRepository(std::filesystem::path root, Runtime& runtime, ServerMetrics& metrics,
                  BatcherLimits batcher_limits = {});
  ~ModelRepository();

  const std::filesystem::path& root() const { return root_; }

  // Loads every model directory; each failure is logged and recorded (Index, Unavailable),
  // never fatal. Returns the number of models serving.
  int LoadAll() BACKPLANE_EXCLUDES(load_mutex_);
  // Loads or reloads one model: reads its config and version directories again, loads new or
  // changed versions, drops versions the policy no longer selects. All-or-nothing: on failure
  // the versions that were serving keep serving. kNotFound when there is no such model
  // directory, kInvalidArgument for a bad name or config, the runtime's error for a model that
  // cannot load.
  Status Load(std::string_view name) BACKPLANE_EXCLUDES(load_mutex_);
  // Stops serving a model; requests already admitted finish. kNotFound when it is not loaded.
  Status Unload(std::string_view name) BACKPLANE_EXCLUDES(load_mutex_);
  // Stops serving everything (shutdown).
  void UnloadAll() BACKPLANE_EXCLUDES(load_mutex_);

  // The serving model, or null.
  std::shared_ptr<const ServingModel> Find(std::string_view name) const;
  // The serving model and version whose network is `id`; both null when none is (unloaded).
  ResolvedModel FindNetwork(NetworkId id) const;
  // Why a model of the repository is not serving (its last load error, or "unloaded"); nullopt
  // when it serves or the repository has no such model.
  std::optional<std::string> Unavailable(std::string_view name) const;
  // Every model directory of the repository and every serving model, with their states.
  std::vector<ModelIndexEntry> Index() const;

 private:
  struct Snapshot {
    std::map<std::string, std::shared_ptr<const ServingModel>, std::less<>> serving;
    std::map<std::string, std::string, std::less<>> unavailable;  // name → reason
  };
  Result<std::shared_ptr<const ServingModel>> Prepare(const std::string& name,
                                                      const ServingModel* current);
  void Publish(const std::function<void(Snapshot&)>& change) BACKPLANE_REQUIRES(load_mutex_);

  const std::filesystem::path root_;
  Runtime& runtime_;
  ServerMetrics& metrics_;
  const BatcherLimits batcher_limits_;
  Mutex load_mutex_;  // serialises Load, Unload, LoadAll, UnloadAll
  Published<Snapshot> snapshot_;
};

// A request's model and version. Value type.
struct ResolvedModel {
  std::shared_ptr<const ServingModel> model;
  std::shared_ptr<const ModelVersion> version;  // keeps the network loaded while held
};
// `version_text` empty: the highest version serving. kNotFound for a model or version that does
// not exist (the message lists what does); kUnavailable for a model of the repository that is
// not serving, with the reason (its load error, or "unloaded").
Result<ResolvedModel> ResolveModel(const ModelRepository& repository, std::string_view name,
                                   std::string_view version_text);

}  // namespace backplane::server
