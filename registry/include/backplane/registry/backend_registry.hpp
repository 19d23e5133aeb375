// The backend registry: which backend ids exist, where each comes from (linked in, or a loaded
// generation of a file), and every file that was rejected with its reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/loader/backend_file.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane {

using StaticBackendFactory = std::function<std::unique_ptr<IBackend>()>;

// Registers a linked-in backend for every registry created afterwards (ArmNN's static
// registration). Use BACKPLANE_REGISTER_STATIC_BACKEND at namespace scope in the host program.
bool RegisterStaticBackend(std::string id, StaticBackendFactory factory);

// The backend directories used when none are given: $BACKPLANE_BACKEND_PATHS (colon-separated;
// set but empty disables dynamic loading) if set, else the compile-time default list.
std::vector<std::filesystem::path> DefaultBackendPaths();

struct BackendRegistryOptions {
  // Directories searched for backend files; nullopt means DefaultBackendPaths(). An empty list
  // disables dynamic loading, as does dynamic_backends = false.
  std::optional<std::vector<std::filesystem::path>> backend_paths;
  bool dynamic_backends = true;
  // Shared by all registries of the process unless a test needs its own.
  std::shared_ptr<loader::Loader> loader;
};

// ---- Generations (hot reload) -------------------------------------------------------------

// Where one generation of a backend id is in its life (docs/hot-reload.md).
enum class GenerationState {
  kLoading,   // being copied, inspected, loaded, or prepared by the runtimes
  kActive,    // what new work of this id runs on
  kDraining,  // replaced; still mapped while networks or requests hold leases on it
  kUnloaded,  // dlclosed and verified gone from the process
  kLeaked,    // dlclosed but still mapped (docs/loading-rules.md rule 3); counted and warned
  kRejected,  // failed a step; never became active
};
std::string_view ToString(GenerationState state);  // "loading", "active", ...

struct GenerationStatus {
  uint64_t generation = 0;
  GenerationState state = GenerationState::kLoading;
  std::filesystem::path file;
  std::string release;
  BackendApiVersion api_version;
  std::string build_id;
  long refcount = 0;  // leases held right now (networks, instances, the registry itself)
  std::chrono::system_clock::time_point loaded_at;
  // From the moment it stopped being active to the moment it was unmapped; set once unloaded.
  std::optional<double> drain_ms;
  std::string reason;  // kRejected: "CODE: message"
};

struct BackendStatus {
  std::string id;
  bool is_static = false;
  uint64_t active_generation = 0;  // 0 for a static backend or when withdrawn
  bool pinned = false;
  bool withdrawn = false;                      // its file was deleted: offered to no new load
  std::filesystem::path file;                  // the file its generations come from
  std::vector<GenerationStatus> generations;   // newest first, bounded history
  std::vector<loader::RejectedFile> rejected;  // rejected deploys of `file`, newest first
};

// What a rescan or a reload did about one backend file.
struct DeployOutcome {
  enum class Action {
    kUnchanged,  // same file identity (or same build-id) as the active generation
    kActivated,  // a new generation (or a new id) is active
    kRejected,   // the new file failed a step; the old generation keeps serving
    kDeferred,   // a writer still holds the file or it changed while copied: try again soon
    kPinned,     // a new file was seen but the id is pinned
    kWithdrawn,  // the file was deleted
  };
  Action action = Action::kUnchanged;
  std::string backend_id;  // empty when the file never got as far as naming its id
  std::filesystem::path file;
  uint64_t generation = 0;  // the generation activated or rejected
  std::string message;
};
std::string_view ToString(DeployOutcome::Action action);

struct RescanResult {
  std::vector<DeployOutcome> outcomes;  // only files whose state changed
  bool retry_soon = false;              // some file was deferred
  // Every directory worth watching: the backend directories and the directories their
  // symlinks point into.
  std::vector<std::filesystem::path> watch_directories;
};

// A lifecycle event, delivered to observers outside every lock (on the thread that caused it,
// or on the reaper thread for kUnloaded and kLeaked). Observers must not block.
struct GenerationEvent {
  enum class Kind {
    kLoaded,
    kActivated,
    kRejected,
    kDraining,
    kUnloaded,
    kLeaked,
    kWithdrawn,
    kPinned,
    kUnpinned
  };
  Kind kind;
  std::string backend_id;
  uint64_t generation = 0;
  std::filesystem::path file;
  std::optional<loader::LoadReason> reason;  // kRejected by the loader
  std::string message;
  std::optional<double> drain_ms;  // kUnloaded, kLeaked
};
std::string_view ToString(GenerationEvent::Kind kind);
using GenerationObserver = std::function<void(const GenerationEvent&)>;

// A change to what an id offers, proposed to every subscriber (each Runtime) before it takes
// effect, so that any of them can refuse it (e.g. a network fails to prepare on the new code).
struct BackendChange {
  std::string backend_id;
  loader::GenerationLease next;      // null: the id is withdrawn (its file was deleted)
  loader::GenerationLease previous;  // null: a new id
};
// Makes a prepared change visible; cannot fail. Dropping it abandons the change.
using CommitChange = std::function<void()>;
class BackendSubscriber {
 public:
  virtual ~BackendSubscriber() = default;
  // Prepares everything `change` needs off the request path, without making it visible.
  // Called with the registry's change lock held: never call back into the registry's
  // mutating operations from here.
  // A refusal's reason names the step (kPrepareFailed, kValidationFailed, or the loader's own
  // reason when an instance cannot be created).
  virtual loader::LoadResult<CommitChange> PrepareChange(const BackendChange& change) = 0;
};

// One registered backend id and the generation it offers now.
struct RegisteredBackend {
  std::string id;
  loader::GenerationLease generation;  // the active one; null for a static backend
  bool is_static() const { return generation == nullptr; }
};

class BackendRegistry;

// Keeps a subscriber attached; unsubscribes on destruction (waiting for a change in progress).
class Subscription {
 public:
  Subscription() = default;
  Subscription(std::weak_ptr<BackendRegistry> registry, uint64_t id)
      : registry_(std::move(registry)), id_(id) {}
  Subscription(Subscription&& other) noexcept
      : registry_(std::move(other.registry_)), id_(std::exchange(other.id_, 0)) {}
  Subscription& operator=(Subscription&& other) noexcept;
  ~Subscription() { Reset(); }
  void Reset();

 private:
  std::weak_ptr<BackendRegistry> registry_;
  uint64_t id_ = 0;
};

// Thread-safe. Never calls backend code or observers while holding its state lock; generation
// changes (rescan, reload, rollback, unpin) are serialised on a separate change lock.
class BackendRegistry : public std::enable_shared_from_this<BackendRegistry> {
 public:
  // Registers the static backends, then discovers and loads the backend files of the configured
  // directories in order; files that fail are kept in Rejected() and logged, never fatal.
  static Result<std::shared_ptr<BackendRegistry>> Create(BackendRegistryOptions options = {});
  ~BackendRegistry();

  // kInvalidArgument for an empty id or null factory, kAlreadyExists for a registered id.
  Status RegisterStatic(std::string id, StaticBackendFactory factory);

  // Loads one backend file and registers its id. kDuplicateId when the id is registered already
  // (the first registration wins) or when this very file is loaded already. Failures are also
  // recorded in Rejected().
  loader::LoadResult<RegisteredBackend> LoadFile(const std::filesystem::path& file,
                                                 loader::LoadTrace* trace = nullptr);

  std::vector<std::string> BackendIds() const;  // in registration order; withdrawn ids excluded
  std::optional<RegisteredBackend> Find(std::string_view id) const;
  std::vector<loader::RejectedFile> Rejected() const;  // bounded, oldest first
  const std::vector<std::filesystem::path>& directories() const { return directories_; }

  // A new instance of backend `id` for one runtime (the factory is called every time).
  Result<std::shared_ptr<loader::BackendInstance>> CreateInstance(std::string_view id);

  loader::Loader& loader() const { return *loader_; }

  // ---- Hot reload --------------------------------------------------------------------------
  // Looks at every backend directory again and applies what changed: a new file identity of a
  // registered file loads a new generation beside the active one, which every subscriber
  // prepares for and which then becomes active (or is rejected, the old one serving on); a new
  // file registers a new id; a deleted file withdraws its id. The watcher calls this.
  RescanResult Rescan();
  // Looks at the file of `id` now. kNotFound for an unknown id, kFailedPrecondition for a
  // static one.
  Result<DeployOutcome> Reload(std::string_view id);
  // Makes the previous generation active again (it was kept loaded for this). Returns its
  // number; kFailedPrecondition when there is none or a subscriber refuses it.
  Result<uint64_t> Rollback(std::string_view id);
  // A pinned id keeps its active generation; new files are noticed but not loaded until Unpin,
  // which looks at the file again at once.
  Status Pin(std::string_view id);
  Result<DeployOutcome> Unpin(std::string_view id);

  std::vector<BackendStatus> Describe() const;  // every id, in registration order
  std::optional<BackendStatus> Describe(std::string_view id) const;

  // Observers live as long as the registry; the returned number removes one.
  uint64_t AddObserver(GenerationObserver observer);
  void RemoveObserver(uint64_t observer_id);

  // Runs `attach` and subscribes `subscriber` under the change lock, so that no change slips
  // between what `attach` reads and the subscription. The subscriber must outlive the
  // returned Subscription.
  Subscription Subscribe(BackendSubscriber& subscriber, const std::function<void()>& attach);

 private:
  friend class Subscription;
  struct Lineage;
  struct Deployment;
  enum class DeployMode { kRegister, kReplace };

  BackendRegistry(std::shared_ptr<loader::Loader> loader,
                  std::vector<std::filesystem::path> directories);
  void Unsubscribe(uint64_t subscriber_id);

  // All of these run with change_mutex_ held.
  std::optional<DeployOutcome> DeployIfChanged(const loader::BackendFile& file);
  DeployOutcome Deploy(const std::filesystem::path& file, DeployMode mode,
                       loader::LoadTrace* trace = nullptr);
  DeployOutcome Activate(Deployment deployment);
  DeployOutcome Withdraw(const std::string& id);
  DeployOutcome RejectDeploy(const std::filesystem::path& file, loader::LoadError error,
                             std::string backend_id, uint64_t generation = 0);

  void Reject(loader::RejectedFile rejected);
  void OnUnloaded(const loader::GenerationInfo& generation, bool leaked);
  void Notify(const GenerationEvent& event) const;
  Lineage* FindLineage(std::string_view id);  // mutex_ held
  const Lineage* FindLineage(std::string_view id) const;
  Lineage* FindLineageByFile(const std::filesystem::path& file);  // mutex_ held
  BackendStatus DescribeLocked(const Lineage& lineage) const;
  std::filesystem::path RetainedCopyPath(const Lineage& lineage,
                                         const loader::GenerationInfo& generation) const;

  const std::shared_ptr<loader::Loader> loader_;
  const std::vector<std::filesystem::path> directories_;
  uint64_t unload_listener_ = 0;

  // Serialises generation changes (and subscription), so that each runtime sees them in order.
  // Taken before mutex_, never while holding it.
  std::mutex change_mutex_;
  std::map<uint64_t, BackendSubscriber*> subscribers_;  // guarded by change_mutex_
  uint64_t next_subscriber_id_ = 1;                     // guarded by change_mutex_
  // The last rejection per file, to reject an unchanged file once rather than at every rescan.
  std::map<std::filesystem::path, std::string> rejected_fingerprints_;  // change_mutex_

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Lineage>> lineages_;  // guarded by mutex_; registration order
  std::deque<loader::RejectedFile> rejected_;       // guarded by mutex_; bounded

  ListenerList<GenerationEvent> observers_{"generation observer"};
};

}  // namespace backplane

// The variable's name comes from the line, so that a qualified class name (ns::Backend) works.
#define BACKPLANE_STATIC_BACKEND_CONCAT_(a, b) a##b
#define BACKPLANE_STATIC_BACKEND_NAME_(line) \
  BACKPLANE_STATIC_BACKEND_CONCAT_(backplane_static_backend_registered_, line)
#define BACKPLANE_REGISTER_STATIC_BACKEND(BackendClass, backend_id)                      \
  [[maybe_unused]] static const bool BACKPLANE_STATIC_BACKEND_NAME_(__LINE__) =          \
      ::backplane::RegisterStaticBackend(backend_id, [] {                                \
        return std::unique_ptr<::backplane::IBackend>(std::make_unique<BackendClass>()); \
      })
