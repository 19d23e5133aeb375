// The backend registry: which backend ids exist, where each comes from (linked in, or a loaded
// generation of a file), and every file that was rejected with its reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/listener_list.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/loader.hpp"
#include "backplane/registry/activation_journal.hpp"
#include "backplane/registry/backend_change.hpp"
#include "backplane/registry/generation_status.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane {

using StaticBackendFactory = std::function<std::unique_ptr<IBackend>()>;

// Registers a linked-in backend for every registry created afterwards (ArmNN's static
// registration). Use BACKPLANE_REGISTER_STATIC_BACKEND at namespace scope in the host program.
bool RegisterStaticBackend(std::string id, StaticBackendFactory factory);

// The backend directories used when none are given: $BACKPLANE_BACKEND_PATHS (colon-separated;
// set but empty disables dynamic loading) if set, else the compile-time default list (the
// installation's <libdir>/backplane/backends), after the build tree's backends for a program that
// runs from the build tree's bin/ directory.
std::vector<std::filesystem::path> DefaultBackendPaths();

// What a deploy (a new file for a registered id) does (docs/hot-reload.md, "Progressive
// rollout").
enum class DeployPolicy {
  kImmediate,  // the new generation becomes active at once, once every runtime has prepared it
  // It becomes the id's candidate beside the active generation: runtimes bind their networks on
  // both and route the share of requests they are told to (Runtime::SetRolloutTraffic) until
  // Promote makes it active or DropCandidate rolls it back.
  kProgressive,
};

struct BackendRegistryOptions {
  // Directories searched for backend files; nullopt means DefaultBackendPaths(). An empty list
  // disables dynamic loading, as does dynamic_backends = false.
  std::optional<std::vector<std::filesystem::path>> backend_paths;
  bool dynamic_backends = true;
  // Shared by all registries of the process unless a test needs its own.
  std::shared_ptr<loader::Loader> loader;
  // A file modified this recently that is not yet a complete ELF (empty, truncated) is taken for
  // one still being written: deferred, not rejected, until it has been left alone this long. Only
  // in Rescan (the watcher's, which looks again); Create's first scan, LoadFile and Reload take
  // the file as it is.
  std::chrono::milliseconds settle_time{250};
  // Which backend content may load (null: any). Asked by the loader about the digest of each
  // file's private copy before it is mapped, for every load this registry makes: discovery,
  // deploys, LoadFile, Rollback. A file refused as UNTRUSTED is reported once, and looked at
  // again when it changes or when the policy's Revision() does (checked at every rescan).
  std::shared_ptr<const loader::TrustPolicy> trust;
  DeployPolicy deploy_policy = DeployPolicy::kImmediate;
  // Where the registry keeps what must outlive the process (docs/operators.md, "Crash loops and
  // state_dir"); empty: nothing is kept. With one, each activation of a new generation over one
  // that served (a deploy, a promotion, a rollout candidate) is on probation for `crash_grace`
  // (ActivationJournal); content whose probation the process did not survive is refused at the
  // next start (LoadReason::kSuspectedCrash), which serves the version before it from the copy the
  // rollback store keeps here. Create fails naming the directory when it cannot be created,
  // locked or written. One registry per directory at a time.
  std::filesystem::path state_dir;
  std::chrono::milliseconds crash_grace{60000};
  // DeployPolicy::kProgressive: each candidate runs in a worker process throughout its rollout,
  // whatever its backend id's isolation, so that a crash in the shadow or a canary step costs
  // only the candidate (CrashSupervisor rolls it back). The build that is promoted is loaded
  // again as `loader` places it and swapped in as any deploy. Needs a loader with an
  // out_of_process runner (Create fails without one).
  bool sandbox_candidates = false;
  // DeployPolicy::kProgressive: beside each candidate, the active generation's build (its kept
  // copy, the bytes that ran) is loaded again as the rollout's baseline, placed as the candidate
  // is (BackendChange::baseline), so that the candidate is compared with the same code under
  // the same conditions, not with code that is hot and runs in the server. A baseline that does
  // not load is logged and the rollout goes on without one.
  bool baseline_generations = false;
};

// One registered backend id and the generation it offers now.
struct RegisteredBackend {
  std::string id;
  loader::GenerationLease generation;  // the active one; null for a static backend
  bool is_static() const { return generation == nullptr; }
};

namespace registry_detail {
class BackendScanner;
struct Candidate;
class ChangeCoordinator;
class LineageTable;
struct LineageView;
class RollbackStore;
struct Events;
}  // namespace registry_detail

// Thread-safe. Made of parts with one job each (registry/src): the scanner reads the backend
// directories, the lineage table keeps each id's generations (its one lock, never held while
// backend code, file copies or observers run), the rollback store keeps the previous version of
// each id, and the change coordinator has every runtime prepare and then commit a change.
// Changes (rescan, reload, rollback, unpin, subscription) run one at a time in a change
// sequence; observers and logs get their events after every lock is released.
// How many backend generations are still in the process: loaded and not yet gone (instances
// destroyed, library closed and verified unmapped, shadow copy deleted), counting every registry
// and runtime that share the registry's loader (the process-wide one unless given another).
// Thread-safe. Outlives the registry on purpose: the active generations leave only after the
// registry that holds them and every runtime and request using them are gone, on the reaper
// thread, so an embedder's orderly shutdown takes this first, drops the runtimes and the
// registry, then waits (docs/embedding.md, "Shutting down"). Keeps the loader object (its
// reaper thread) alive, never a generation.
class LiveGenerations {
 public:
  explicit LiveGenerations(std::shared_ptr<const loader::Loader> loader)
      : loader_(std::move(loader)) {}
  uint64_t count() const;
  // True once no generation is left; false when `timeout` passed first (a request, runtime or
  // instance somewhere still holds one, or a backend's Shutdown does not return).
  [[nodiscard]] bool WaitForNone(std::chrono::milliseconds timeout) const;

 private:
  std::shared_ptr<const loader::Loader> loader_;
};

class BackendRegistry : public std::enable_shared_from_this<BackendRegistry> {
 public:
  // Registers the static backends, then discovers and loads the backend files of the configured
  // directories in order; files that fail are kept in Rejected() and logged, never fatal.
  static Result<std::shared_ptr<BackendRegistry>> Create(BackendRegistryOptions options = {});
  ~BackendRegistry();

  // kInvalidArgument for an empty id or null factory, kAlreadyExists for a registered id.
  Status RegisterStatic(std::string id, StaticBackendFactory factory);

  // Loads one backend file and registers its id. DUPLICATE_ID when the id is registered already
  // (the first registration wins) or when this very file is loaded already. Failures are also
  // recorded in Rejected().
  Result<RegisteredBackend> LoadFile(const std::filesystem::path& file,
                                     loader::LoadTrace* trace = nullptr);

  std::vector<std::string> BackendIds() const;  // in registration order; withdrawn ids excluded
  std::optional<RegisteredBackend> Find(std::string_view id) const;
  std::vector<loader::RejectedFile> Rejected() const;  // bounded, oldest first
  const std::vector<std::filesystem::path>& directories() const { return directories_; }
  // Which content may load (null: any); its health is in the server's metrics.
  const std::shared_ptr<const loader::TrustPolicy>& trust() const { return trust_; }

  // A new instance of backend `id` for one runtime (the factory is called every time).
  Result<std::shared_ptr<loader::BackendInstance>> CreateInstance(std::string_view id);

  loader::Loader& loader() const { return *loader_; }
  // The generations in the process, to wait for after this registry is gone (LiveGenerations).
  LiveGenerations live_generations() const { return LiveGenerations(loader_); }

  // ---- Hot reload --------------------------------------------------------------------------
  // Looks at every backend directory again and applies what changed: a new file identity of a
  // registered file loads a new generation beside the active one, which every subscriber
  // prepares for and which then becomes active (or is rejected, the old one serving on); a new
  // file registers a new id; a deleted file withdraws its id. The watcher calls this.
  RescanResult Rescan();
  // Looks at the file of `id` now. kNotFound for an unknown id, kFailedPrecondition for a
  // static one. An operator's word: content of `id` suspected of a crash (SUSPECTED_CRASH) is
  // loaded again.
  Result<DeployOutcome> Reload(std::string_view id);
  // Makes the version before the active one active again, as a new generation loaded from the
  // copy kept for this. Returns its number; kFailedPrecondition when there is none or a
  // subscriber refuses it.
  Result<uint64_t> Rollback(std::string_view id);
  // A pinned id keeps its active generation; new files are noticed but not loaded until Unpin,
  // which looks at the file again at once. Both wait for a change in progress. An explicit
  // Rollback still applies to a pinned id.
  Status Pin(std::string_view id);
  Result<DeployOutcome> Unpin(std::string_view id);

  // ---- Progressive rollout (DeployPolicy::kProgressive) ------------------------------------
  // Makes the candidate of `id` active as any deploy does (every runtime prepares it anew, the
  // old generation drains). kFailedPrecondition when `id` has no candidate; a refusal (a runtime
  // cannot prepare it) drops the candidate, rejected with that reason.
  // `generation` (0: whichever): the candidate meant, so that a decision taken about one candidate
  // never applies to a newer one deployed meanwhile (kFailedPrecondition then).
  Result<DeployOutcome> Promote(std::string_view id, uint64_t generation = 0);
  // Rolls the candidate of `id` back: runtimes drop their bindings on it, it is recorded as
  // rejected (LoadReason::kRolledBack, `why` in the message) and unloads once its last request
  // ends; its file is not deployed again until the directory designates another one. Returns
  // the candidate's number; kFailedPrecondition when there is none.
  // `reason`: kCrashed when its worker died (CrashSupervisor).
  Result<uint64_t> DropCandidate(std::string_view id, const std::string& why,
                                 uint64_t generation = 0,
                                 LoadReason reason = LoadReason::kRolledBack);
  // The active generation `generation` of `id` ran in a worker process that died (isolation/):
  // loads its file again as a new generation, in a new worker, and activates it as any deploy
  // (every runtime prepares it; networks move onto it). When the file on disk no longer has the
  // content that crashed, that file is deployed instead, as a new file would be (Reload).
  // kFailedPrecondition when `generation` is not the active one any more.
  Result<DeployOutcome> Restart(std::string_view id, uint64_t generation);
  // The active generation `generation` of `id` died too often (CrashSupervisor) and there is no
  // other build to roll back to: withdrawn as a deleted file is (networks move to their next
  // preferred backend), and its file refused (CRASHED, `why`) until another file is published.
  Result<DeployOutcome> WithdrawCrashed(std::string_view id, uint64_t generation,
                                        const std::string& why);
  DeployPolicy deploy_policy() const { return deploy_policy_; }

  // What the state directory remembers (empty without BackendRegistryOptions::state_dir).
  std::vector<ActivationRecord> ActivationRecords() const;

  std::vector<BackendStatus> Describe() const;  // every id, in registration order
  std::optional<BackendStatus> Describe(std::string_view id) const;

  // Observers live as long as the registry; the returned number removes one. Observers are
  // called on the thread that made the change, or on the loader's reaper thread for kUnloaded
  // and kLeaked, after every registry lock is released; one may read the registry but must not
  // change it, nor add or remove an observer (the list's lock is held while observers run).
  // RemoveObserver waits for a call of that observer in progress, so state the observer uses may
  // be destroyed once it returns; after it, or after the registry is gone, the observer hears
  // nothing more, including the kUnloaded of the generations the registry held at its end (wait
  // for those with live_generations()).
  uint64_t AddObserver(GenerationObserver observer);
  void RemoveObserver(uint64_t observer_id);

  // Runs `attach` and subscribes `subscriber` in the change sequence, so that no change slips
  // between what `attach` reads and the subscription. The subscriber must outlive the returned
  // Subscription.
  Subscription Subscribe(BackendSubscriber& subscriber, const std::function<void()>& attach);

 private:
  friend class Subscription;
  using Candidate = registry_detail::Candidate;

  BackendRegistry(std::shared_ptr<loader::Loader> loader,
                  std::vector<std::filesystem::path> directories,
                  std::chrono::milliseconds settle_time,
                  std::shared_ptr<const loader::TrustPolicy> trust, DeployPolicy deploy_policy,
                  std::filesystem::path rollback_directory, bool durable_rollback,
                  std::unique_ptr<ActivationJournal> journal, bool sandbox_candidates,
                  bool baseline_generations);
  void Unsubscribe(uint64_t subscriber_id);

  // The change sequence: each of these runs with change_mutex_ held and reports what it did
  // through `events`, delivered by the caller once the mutex is released.
  // `settle_time`: how long an incomplete file may have been left alone and still be deferred
  // as one being written (zero: it is rejected).
  RescanResult RescanSettling(std::chrono::milliseconds settle_time)
      BACKPLANE_EXCLUDES(change_mutex_);
  DeployOutcome DeployIfChanged(const Candidate& candidate, std::chrono::milliseconds settle_time,
                                registry_detail::Events& events) BACKPLANE_REQUIRES(change_mutex_);
  // The loader's generation of `file`, but never one this registry has a record of.
  Result<loader::GenerationLease> LoadGeneration(
      const std::filesystem::path& file, loader::LoadTrace* trace,
      loader::Loader::Placement placement = loader::Loader::Placement::kAsConfigured);
  DeployOutcome Deploy(const Candidate& candidate, bool registering,
                       std::chrono::milliseconds settle_time, loader::LoadTrace* trace,
                       registry_detail::Events& events) BACKPLANE_REQUIRES(change_mutex_);
  enum class Activation {
    kDeploy,
    // A version that served before (Rollback, or the directory designating it again): not on
    // probation, an operator's choice of a known build.
    kRollback,
    // A worker's build restarted as itself: the outgoing generation does not become the one
    // Rollback returns to (the version before it stays).
    kRestart,
  };
  // `identity` is the file's as loaded; nullopt for a rollback that loads a kept copy.
  DeployOutcome Activate(const std::string& id, loader::GenerationLease next,
                         const Candidate& candidate, std::optional<loader::FileIdentity> identity,
                         registry_detail::Events& events, Activation kind = Activation::kDeploy)
      BACKPLANE_REQUIRES(change_mutex_);
  // `why`: what withdraws it ("" : its file was deleted).
  // `id`'s lineage while `generation` is its active one; kNotFound or kFailedPrecondition else.
  Result<registry_detail::LineageView> ActiveLineage(std::string_view id, uint64_t generation) const
      BACKPLANE_REQUIRES(change_mutex_);
  DeployOutcome Withdraw(const std::string& id, registry_detail::Events& events,
                         const std::string& why = "") BACKPLANE_REQUIRES(change_mutex_);
  // DeployPolicy::kProgressive: `next` becomes the candidate of `id` (replacing one under way).
  DeployOutcome Propose(const std::string& id, loader::GenerationLease next,
                        const Candidate& candidate, const loader::FileIdentity& identity,
                        registry_detail::Events& events) BACKPLANE_REQUIRES(change_mutex_);
  // `active`'s build loaded again, from its kept bytes, where candidates run: the baseline of
  // candidate generation `candidate`. Null (and a warning in `events` saying why) when it does
  // not load; the rollout goes on without one.
  loader::GenerationLease LoadBaseline(const std::string& id, const loader::GenerationLease& active,
                                       uint64_t candidate, registry_detail::Events& events)
      BACKPLANE_REQUIRES(change_mutex_);
  // The candidate of `id`, if any, leaves every runtime and is recorded as rejected with `why`.
  // Returns its number, 0 when there was none.
  uint64_t DropCandidateLocked(const std::string& id, Status why, registry_detail::Events& events)
      BACKPLANE_REQUIRES(change_mutex_);
  // `trust_revision`: the trust policy's revision read before the load that failed, remembered
  // with an UNTRUSTED refusal.
  DeployOutcome RejectDeploy(const Candidate& candidate, Status error, std::string backend_id,
                             uint64_t generation, registry_detail::Events& events,
                             uint64_t trust_revision = 0) BACKPLANE_REQUIRES(change_mutex_);
  // `next` is content the state directory suspects of a crash: refused; when `id` serves
  // nothing yet (the start after the crash), the version before it is served from the rollback
  // store's copy instead.
  DeployOutcome RefuseSuspected(const Candidate& candidate, loader::GenerationLease next,
                                const ActivationRecord& suspect, registry_detail::Events& events)
      BACKPLANE_REQUIRES(change_mutex_);
  // The trust policy's revision now (0 without one).
  uint64_t TrustRevision() const;
  Result<DeployOutcome> ReloadLocked(std::string_view id, registry_detail::Events& events)
      BACKPLANE_REQUIRES(change_mutex_);
  // Reload of an id that a suspected build kept from registering (nothing was kept to serve
  // instead): its refused file is deployed again.
  Result<DeployOutcome> ReloadRefusedSuspect(std::string_view id, registry_detail::Events& events)
      BACKPLANE_REQUIRES(change_mutex_);

  // Logs each event and tells the observers. Never with a lock held.
  void Deliver(registry_detail::Events& events) BACKPLANE_EXCLUDES(change_mutex_);
  void OnUnloaded(const loader::GenerationInfo& generation, bool leaked);

  const std::shared_ptr<loader::Loader> loader_;
  const std::vector<std::filesystem::path> directories_;
  const std::chrono::milliseconds settle_time_;
  const std::shared_ptr<const loader::TrustPolicy> trust_;
  const DeployPolicy deploy_policy_;
  // Where a candidate's code runs during its rollout (BackendRegistryOptions::sandbox_candidates).
  const loader::Loader::Placement candidate_placement_;
  // BackendRegistryOptions::baseline_generations, with a progressive policy.
  const bool baseline_generations_;
  uint64_t unload_listener_ = 0;

  // Orders changes: taken first, held across a whole change (backend code runs in it, observers
  // never do). Nothing on the request path takes it.
  Mutex change_mutex_;
  const std::unique_ptr<registry_detail::BackendScanner> scanner_
      BACKPLANE_GUARDED_BY(change_mutex_);
  const std::unique_ptr<registry_detail::ChangeCoordinator> coordinator_
      BACKPLANE_GUARDED_BY(change_mutex_);
  const std::unique_ptr<registry_detail::RollbackStore> rollback_store_
      BACKPLANE_GUARDED_BY(change_mutex_);
  // The file each candidate was deployed from, remembered as rejected when it is rolled back.
  std::map<std::string, std::unique_ptr<Candidate>, std::less<>> candidate_files_
      BACKPLANE_GUARDED_BY(change_mutex_);
  // Thread-safe on its own (one short lock): read by queries, written by changes.
  const std::unique_ptr<registry_detail::LineageTable> lineages_;
  // Thread-safe on its own; null without a state directory. Destroyed with the registry: a clean
  // end, nothing on probation is suspected.
  const std::unique_ptr<ActivationJournal> journal_;

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
