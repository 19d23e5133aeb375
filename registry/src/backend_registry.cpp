#include "backplane/registry/backend_registry.hpp"

#include <cstdlib>
#include <ctime>
#include <thread>

#include "backend_scan.hpp"
#include "change_coordinator.hpp"
#include "lineage.hpp"
#include "registry_log.hpp"
#include "rollback_store.hpp"

namespace backplane {
namespace fs = std::filesystem;
using registry_detail::Candidate;
using registry_detail::Events;
using registry_detail::Log;

namespace registry_detail {

// What a change did, to be logged and told to observers once every lock is released: each entry
// is a log line, and most are an event too.
struct Events {
  struct Entry {
    spdlog::level::level_enum level;
    std::string line;
    std::optional<GenerationEvent> event;
  };
  std::vector<Entry> entries;

  void Add(spdlog::level::level_enum level, std::string line,
           std::optional<GenerationEvent> event = std::nullopt) {
    entries.push_back({level, std::move(line), std::move(event)});
  }
};

}  // namespace registry_detail

namespace {

struct StaticBackendList {
  Mutex mutex;
  std::vector<std::pair<std::string, StaticBackendFactory>> backends BACKPLANE_GUARDED_BY(mutex);
};

StaticBackendList& StaticBackends() {
  static StaticBackendList list;
  return list;
}

// Whether a failed load says more about the moment than about the file: its writer is still at
// work (it holds the file, or the file changed while copied), or the file is an incomplete ELF
// that was written to within `settle_time`. Such a file is deferred, not rejected.
bool StillBeingWritten(const Status& error, const fs::path& file,
                       std::chrono::milliseconds settle_time) {
  const auto reason = error.reason();
  if (reason == LoadReason::kFileBusy || reason == LoadReason::kFileChanged)
    return true;
  if (reason != LoadReason::kElfTruncated && reason != LoadReason::kNotElf)
    return false;
  const auto identity = loader::ReadFileIdentity(file);
  if (!identity)
    return false;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  const int64_t last_write_ns = std::max(identity->mtime_ns, identity->ctime_ns);
  return now_ns - last_write_ns < std::chrono::nanoseconds(settle_time).count();
}

// The rollback store's key for the build that served when the last probation of `id` began: what
// the start after a crash serves instead of the suspect. Apart from the key Rollback uses (the
// version before the active one), which a progressive rollout does not change: its candidate runs
// beside the active generation, and that is the one to go back to.
std::string ServedBeforeProbationKey(const std::string& id) {
  return "before-probation/" + id;
}

// The rollback store's key for the copy a rollout's baseline is loaded from when no copy of the
// stable build's bytes is kept already. Kept until the next baseline of the id replaces it (the
// loader needs it only once, but what the baseline's record names as its file must hold its
// bytes: a crash capture copies the build that died from there).
std::string BaselineKey(const std::string& id) {
  return "baseline/" + id;
}

// A unique directory for one registry's rollback copies inside the loader's shadow directory.
fs::path RollbackDirectory(const loader::Loader& loader) {
  static std::atomic<uint64_t> next{1};
  return loader.shadow_directory().path() / ("rollback-" + std::to_string(next++));
}

}  // namespace

bool RegisterStaticBackend(std::string id, StaticBackendFactory factory) {
  auto& list = StaticBackends();
  MutexLock lock(list.mutex);
  list.backends.emplace_back(std::move(id), std::move(factory));
  return true;
}

bool RunsFromTheBuildTree() {
  std::error_code error;
  const fs::path program = fs::read_symlink("/proc/self/exe", error);
  return !error && fs::equivalent(program.parent_path(), BACKPLANE_BUILD_TREE_BIN_DIR, error);
}

std::vector<fs::path> DefaultBackendPaths() {
  if (const char* paths = std::getenv("BACKPLANE_BACKEND_PATHS")) {
    return loader::SplitPathList(paths);
  }
  std::vector<fs::path> paths = loader::SplitPathList(BACKPLANE_DEFAULT_BACKEND_PATHS);
  // Only a program in the build tree's bin/ may load what the build tree holds: an installed
  // copy loading from a build tree would run whatever a later build leaves there.
  if (RunsFromTheBuildTree())
    paths.insert(paths.begin(), BACKPLANE_BUILD_TREE_BACKENDS);
  return paths;
}

std::string_view ToString(GenerationState state) {
  switch (state) {
    case GenerationState::kLoading:
      return "loading";
    case GenerationState::kActive:
      return "active";
    case GenerationState::kCandidate:
      return "candidate";
    case GenerationState::kBaseline:
      return "baseline";
    case GenerationState::kDraining:
      return "draining";
    case GenerationState::kUnloaded:
      return "unloaded";
    case GenerationState::kLeaked:
      return "leaked";
    case GenerationState::kRejected:
      return "rejected";
  }
  return "unknown";
}

std::string_view ToString(DeployOutcome::Action action) {
  using Action = DeployOutcome::Action;
  switch (action) {
    case Action::kUnchanged:
      return "unchanged";
    case Action::kActivated:
      return "activated";
    case Action::kCandidate:
      return "candidate";
    case Action::kRejected:
      return "rejected";
    case Action::kDeferred:
      return "deferred";
    case Action::kPinned:
      return "pinned";
    case Action::kWithdrawn:
      return "withdrawn";
  }
  return "unknown";
}

std::string_view ToString(GenerationEvent::Kind kind) {
  using Kind = GenerationEvent::Kind;
  switch (kind) {
    case Kind::kLoaded:
      return "loaded";
    case Kind::kActivated:
      return "activated";
    case Kind::kCandidate:
      return "candidate";
    case Kind::kRejected:
      return "rejected";
    case Kind::kDraining:
      return "draining";
    case Kind::kUnloaded:
      return "unloaded";
    case Kind::kLeaked:
      return "leaked";
    case Kind::kWithdrawn:
      return "withdrawn";
    case Kind::kPinned:
      return "pinned";
    case Kind::kUnpinned:
      return "unpinned";
  }
  return "unknown";
}

Result<std::shared_ptr<BackendRegistry>> BackendRegistry::Create(BackendRegistryOptions options) {
  std::shared_ptr<loader::Loader> shared_loader = std::move(options.loader);
  if (shared_loader == nullptr) {
    auto created = loader::Loader::Shared();
    if (!created.ok())
      return std::move(created).error();
    shared_loader = std::move(created).value();
  }
  std::vector<fs::path> directories;
  if (!options.dynamic_backends) {
    Log().info("dynamic backend loading is disabled by configuration");
  } else {
    const auto paths = options.backend_paths.value_or(DefaultBackendPaths());
    directories = loader::ValidBackendDirectories(paths);
    if (paths.empty()) {
      Log().info("dynamic backend loading is disabled (the backend path list is empty)");
    } else if (directories.empty()) {
      Log().warn("no dynamic backends: none of the {} backend path(s) is a usable directory",
                 paths.size());
    }
  }
  // Before anything is loaded: the journal says what the previous process may not load again.
  std::unique_ptr<ActivationJournal> journal;
  fs::path rollback_directory = RollbackDirectory(*shared_loader);
  if (!options.state_dir.empty()) {
    auto opened = ActivationJournal::Open(options.state_dir, options.crash_grace);
    if (!opened.ok())
      return std::move(opened).error();
    journal = std::move(opened).value();
    rollback_directory = options.state_dir / "rollback";
  }
  const bool durable_rollback = journal != nullptr;
  const bool sandbox_candidates =
      options.sandbox_candidates && options.deploy_policy == DeployPolicy::kProgressive;
  if (sandbox_candidates && !shared_loader->options().out_of_process) {
    return FailedPrecondition(
        "candidates cannot be sandboxed: the registry's loader starts no worker processes (give "
        "it an out_of_process runner)");
  }
  std::shared_ptr<BackendRegistry> registry(new BackendRegistry(
      std::move(shared_loader), std::move(directories), options.settle_time,
      std::move(options.trust), options.deploy_policy, std::move(rollback_directory),
      durable_rollback, std::move(journal), sandbox_candidates,
      options.baseline_generations && options.deploy_policy == DeployPolicy::kProgressive));
  // The reaper tells when a drained generation has left the process (or leaked).
  registry->unload_listener_ = registry->loader_->stats().unload_listeners.Add(
      [raw = registry.get()](const loader::GenerationInfo& generation, bool leaked) {
        // Raw, not a locked weak_ptr: a strong reference taken here could make the reaper thread
        // the registry's last owner. The destructor's Remove waits for a call in progress.
        raw->OnUnloaded(generation, leaked);
      });

  std::vector<std::pair<std::string, StaticBackendFactory>> statics;
  {
    auto& list = StaticBackends();
    MutexLock lock(list.mutex);
    statics = list.backends;
  }
  for (auto& [id, factory] : statics) {
    if (Status status = registry->RegisterStatic(id, factory); !status.ok())
      Log().error("static backend {} not registered: {}", id, status.message());
  }

  // Failures are recorded and logged. Nobody would look again at a deferred file (there is no
  // watcher yet), so what is there now is final.
  if (!registry->directories_.empty())
    (void)registry->RescanSettling(std::chrono::milliseconds::zero());
  return registry;
}

BackendRegistry::BackendRegistry(std::shared_ptr<loader::Loader> loader,
                                 std::vector<fs::path> directories,
                                 std::chrono::milliseconds settle_time,
                                 std::shared_ptr<const loader::TrustPolicy> trust,
                                 DeployPolicy deploy_policy, fs::path rollback_directory,
                                 bool durable_rollback, std::unique_ptr<ActivationJournal> journal,
                                 bool sandbox_candidates, bool baseline_generations)
    : loader_(std::move(loader)),
      directories_(std::move(directories)),
      settle_time_(settle_time),
      trust_(std::move(trust)),
      deploy_policy_(deploy_policy),
      candidate_placement_(sandbox_candidates ? loader::Loader::Placement::kWorker
                                              : loader::Loader::Placement::kAsConfigured),
      baseline_generations_(baseline_generations),
      scanner_(std::make_unique<registry_detail::BackendScanner>(directories_,
                                                                 loader_->options().file_policy)),
      coordinator_(std::make_unique<registry_detail::ChangeCoordinator>()),
      rollback_store_(std::make_unique<registry_detail::RollbackStore>(
          std::move(rollback_directory), durable_rollback)),
      lineages_(std::make_unique<registry_detail::LineageTable>()),
      journal_(std::move(journal)) {}

uint64_t LiveGenerations::count() const {
  return loader_->stats().live.load(std::memory_order_acquire);
}

bool LiveGenerations::WaitForNone(std::chrono::milliseconds timeout) const {
  // Polled: the count drops on the reaper thread, which has no one to tell once the registry is
  // gone. A millisecond is nothing beside an unload (dlclose, verification, malloc_trim).
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (count() != 0) {
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

BackendRegistry::~BackendRegistry() {
  loader_->stats().unload_listeners.Remove(unload_listener_);
}

Status BackendRegistry::RegisterStatic(std::string id, StaticBackendFactory factory) {
  if (id.empty())
    return InvalidArgument("a static backend needs a non-empty id");
  if (!factory)
    return InvalidArgument("static backend " + id + " has no factory");
  BACKPLANE_RETURN_IF_ERROR(lineages_->AddStatic(id, std::move(factory)));
  Log().info("registered static backend {}", id);
  return Status::Ok();
}

Result<RegisteredBackend> BackendRegistry::LoadFile(const fs::path& file,
                                                    loader::LoadTrace* trace) {
  Events events;
  DeployOutcome outcome = [&] {
    MutexLock change(change_mutex_);
    return Deploy(
        {loader::BackendFamily(file), file, Status::Ok(), registry_detail::FileFingerprint(file)},
        /*registering=*/true, std::chrono::milliseconds::zero(), trace, events);
  }();
  Deliver(events);
  if (outcome.action != DeployOutcome::Action::kActivated)
    return outcome.error;
  return *Find(outcome.backend_id);
}

RescanResult BackendRegistry::Rescan() {
  return RescanSettling(settle_time_);
}

RescanResult BackendRegistry::RescanSettling(std::chrono::milliseconds settle_time) {
  Events events;
  RescanResult result;
  {
    MutexLock change(change_mutex_);
    registry_detail::Scan scan = scanner_->ScanAll();
    const auto misnamed = scanner_->NotYetSaid(scan.misnamed);
    for (const fs::path& file : misnamed.to_say) {
      events.Add(spdlog::level::info, fmt::format("ignoring {} in a backend directory: {}",
                                                  file.string(), loader::MisnamedReason()));
    }
    result.retry_soon = misnamed.second_look_due;
    std::vector<fs::path> present;
    for (const auto& candidate : scan.candidates) {
      present.push_back(candidate.family);
      DeployOutcome outcome = DeployIfChanged(candidate, settle_time, events);
      if (outcome.action == DeployOutcome::Action::kUnchanged)
        continue;
      result.retry_soon |= outcome.action == DeployOutcome::Action::kDeferred;
      result.outcomes.push_back(std::move(outcome));
    }
    for (const auto& id : lineages_->ActiveIdsMissingFrom(present))
      result.outcomes.push_back(Withdraw(id, events));
    result.watch_directories = std::move(scan.watch_directories);
  }
  Deliver(events);
  return result;
}

DeployOutcome BackendRegistry::DeployIfChanged(const Candidate& candidate,
                                               std::chrono::milliseconds settle_time,
                                               Events& events) {
  const auto lineage = lineages_->ByFile(candidate.family);
  const std::string known_id = lineage ? lineage->id : "";
  if (!candidate.unusable.ok()) {
    // Gone since the listing (its directory being removed): a deletion, which the next scan sees,
    // not a broken deploy.
    std::error_code error;
    if (!fs::exists(fs::symlink_status(candidate.path, error)))
      return {DeployOutcome::Action::kUnchanged, known_id, candidate.path};
    // A name that fails before opening (unsafe permissions, a FIFO, a dangling symlink...) is
    // a rejected deploy: whatever the id offers now keeps serving.
    if (scanner_->RejectedAndUnchanged(candidate))
      return {DeployOutcome::Action::kUnchanged, known_id, candidate.path};
    return RejectDeploy(candidate, candidate.unusable, known_id, 0, events);
  }
  const auto identity = loader::ReadFileIdentity(candidate.path);
  if (!identity)  // gone since the listing: the next scan sees what replaced it
    return {DeployOutcome::Action::kUnchanged, known_id, candidate.path};
  if (lineage && lineage->active != nullptr) {
    if (lineage->candidate != nullptr && lineage->candidate_identity == identity) {
      return {DeployOutcome::Action::kUnchanged, known_id, candidate.path,
              lineage->candidate->info().number,
              candidate.path.string() + " is the candidate of a rollout under way"};
    }
    // Device and inode pin down the real file, so a retargeted symlink counts as a change.
    if (lineage->identity == identity) {
      // The directory designates the stable generation's file again (a link re-pointed back):
      // the rollout under way is over.
      if (lineage->candidate != nullptr) {
        const uint64_t dropped = DropCandidateLocked(
            known_id,
            {LoadReason::kRolledBack, "the directory designates the stable generation's file " +
                                          candidate.path.string() + " again"},
            events);
        return {DeployOutcome::Action::kRejected, known_id, candidate.path, dropped,
                "rollout ended: " + candidate.path.string() +
                    " designates the stable generation again"};
      }
      return {DeployOutcome::Action::kUnchanged, known_id, candidate.path,
              lineage->active->info().number,
              candidate.path.string() + " is unchanged since its generation was loaded"};
    }
    if (lineage->pinned) {
      const uint64_t number = lineage->active->info().number;
      if (!lineages_->NotePinnedSeen(known_id, *identity))  // said once per new file
        return {DeployOutcome::Action::kUnchanged, known_id, candidate.path, number};
      events.Add(spdlog::level::info,
                 fmt::format("backend {} is pinned to generation {}: new file {} ignored until "
                             "unpinned",
                             known_id, number, candidate.path.string()));
      return {DeployOutcome::Action::kPinned, known_id, candidate.path, number,
              "backend " + known_id + " is pinned; the new file is ignored"};
    }
  }
  // An untrusted file stays refused while neither it nor the trusted list changes.
  if (scanner_->RejectedAndUnchanged(candidate, TrustRevision()))
    return {DeployOutcome::Action::kUnchanged, known_id, candidate.path};
  return Deploy(candidate, /*registering=*/false, settle_time, nullptr, events);
}

Result<loader::GenerationLease> BackendRegistry::LoadGeneration(
    const fs::path& file, loader::LoadTrace* trace, loader::Loader::Placement placement) {
  // Another registry's live generation of the same unchanged file is shared. One of ours is not:
  // re-activation is one state machine, and a file designated again while a generation of ours
  // from it still drains (a link re-pointed back, a second rollback) becomes a new generation
  // with a new number, never that generation's record brought back to life.
  auto loaded =
      loader_->Load(file, trace, loader::Loader::Reuse::kLiveUnchanged, trust_.get(), placement);
  if (loaded.ok() && lineages_->Recorded(loaded->info()))
    return loader_->Load(file, trace, loader::Loader::Reuse::kNever, trust_.get(), placement);
  return loaded;
}

DeployOutcome BackendRegistry::Deploy(const Candidate& candidate, bool registering,
                                      std::chrono::milliseconds settle_time,
                                      loader::LoadTrace* trace, Events& events) {
  const fs::path& file = candidate.path;
  const auto by_file = lineages_->ByFile(candidate.family);
  const uint64_t trust_revision = TrustRevision();  // before the load: the verdict's revision
  // A file that will be a rollout's candidate loads where candidates run (a worker, when they
  // are sandboxed); should it turn out not to be one, it is loaded again as configured below.
  const bool sandboxed = candidate_placement_ == loader::Loader::Placement::kWorker &&
                         !registering && by_file && by_file->active != nullptr;
  auto loaded = LoadGeneration(
      file, trace, sandboxed ? candidate_placement_ : loader::Loader::Placement::kAsConfigured);
  if (!loaded.ok()) {
    Status error = std::move(loaded).error();
    if (!registering && StillBeingWritten(error, file, settle_time)) {
      events.Add(spdlog::level::info,
                 fmt::format("backend file {} not loaded yet: {}", file.string(), error.message()));
      return {DeployOutcome::Action::kDeferred,
              by_file ? by_file->id : "",
              file,
              0,
              "not loaded yet, looking again soon: " + error.message(),
              error};
    }
    return RejectDeploy(candidate, std::move(error), by_file ? by_file->id : "", 0, events,
                        trust_revision);
  }
  loader::GenerationLease next = std::move(loaded).value();
  const auto& info = next->info();
  const auto by_id = lineages_->ById(info.backend_id);

  Status refused;
  if (by_file && by_file->id != info.backend_id && !registering) {
    refused = {LoadReason::kInvalidId, file.string() + " now provides backend id " +
                                           info.backend_id + " but provided " + by_file->id +
                                           " before; a backend file keeps its id (publish " +
                                           info.backend_id + " under a file name of its own)"};
  } else if (by_id && by_id->offered() && (registering || by_id->file != candidate.family)) {
    const bool same_file =
        by_id->active != nullptr && by_id->active->info().real_path == info.real_path;
    refused = {LoadReason::kDuplicateId,
               file.string() + " provides backend id " + info.backend_id + ", which " +
                   (same_file ? "this registry has loaded from this very file already"
                              : "is already registered from " +
                                    (by_id->is_static ? std::string("a static (linked-in) backend")
                                                      : by_id->file.string())) +
                   "; the first registration wins"};
  }
  if (!refused.ok()) {
    if (trace != nullptr)
      trace->Add({"register", false, refused.message()});
    return RejectDeploy(candidate, std::move(refused), info.backend_id, 0, events);
  }
  if (trace != nullptr)
    trace->Add({"register", true, "backend id " + info.backend_id});
  const std::string id = info.backend_id;
  if (journal_ != nullptr) {
    if (auto suspect = journal_->Suspected(id, info.sha256)) {
      if (trace != nullptr)
        trace->Add({"crash journal", false, "suspected of a crash"});
      return RefuseSuspected(candidate, std::move(next), *suspect, events);
    }
    // Another file of the id was published: whatever the old one was suspected of is over.
    for (const auto& dropped : journal_->Forget(id)) {
      events.Add(spdlog::level::info,
                 fmt::format("backend {}: sha256 {} is no longer suspected of a crash: {} "
                             "(sha256 {}) was published since",
                             id, dropped.sha256, file.string(), info.sha256));
    }
  }
  const loader::FileIdentity identity = info.identity;
  // A deploy over a generation that serves is rolled out progressively when so configured; a
  // new id, or one coming back after its file was deleted, has nothing to compare with, and
  // content identical to the active generation's (the previous file restored after a stopped
  // fleet rollout) has nothing to roll out: it is activated at once, ending a rollout under way.
  // Nor has the version the active generation replaced (a link re-pointed back to the previous
  // file): it served before and is kept for rollback, so it comes back at once, as POST
  // …/rollback would bring it, instead of a rollout that may take minutes at low traffic.
  Activation kind = Activation::kDeploy;
  if (deploy_policy_ == DeployPolicy::kProgressive && !registering && by_id &&
      by_id->active != nullptr) {
    const std::string& sha256 = next->info().sha256;
    const auto previous = rollback_store_->Find(id);
    const bool served_before = previous && previous->sha256 == sha256;
    if (sha256 != by_id->active->info().sha256 && !served_before)
      return Propose(id, std::move(next), candidate, identity, events);
    DropCandidateLocked(
        id,
        {LoadReason::kRolledBack,
         served_before ? "the directory designates " + file.string() + ", the version generation " +
                             std::to_string(by_id->active->info().number) +
                             " replaced, again: rolled back to it"
                       : "the directory designates the stable generation's content again (" +
                             file.string() + ")"},
        events);
    if (served_before) {
      kind = Activation::kRollback;
      events.Add(spdlog::level::info,
                 fmt::format("backend {}: {} (sha256 {}) is the version generation {} replaced, "
                             "kept for rollback: activated at once, without a rollout",
                             id, file.string(), sha256, by_id->active->info().number));
    }
  }
  if (sandboxed) {  // not a candidate after all: where the id's generations run
    const std::string sha256 = next->info().sha256;
    auto placed = LoadGeneration(file, trace);
    if (!placed.ok())
      return RejectDeploy(candidate, std::move(placed).error(), id, 0, events, trust_revision);
    if (placed->info().sha256 != sha256) {
      return {DeployOutcome::Action::kDeferred,
              id,
              file,
              0,
              "changed while it was loading, looking again soon",
              FailedPrecondition(file.string() + " changed while it was loading")};
    }
    next = std::move(placed).value();
  }
  return Activate(id, std::move(next), candidate, identity, events, kind);
}

DeployOutcome BackendRegistry::Propose(const std::string& id, loader::GenerationLease next,
                                       const Candidate& candidate,
                                       const loader::FileIdentity& identity, Events& events) {
  const auto& info = next->info();
  if (lineages_->ById(id)->candidate != nullptr) {
    DropCandidateLocked(id,
                        {LoadReason::kRolledBack, "superseded: the directory designates " +
                                                      candidate.path.string() + " (generation " +
                                                      std::to_string(info.number) + ") now"},
                        events);
  }
  loader::GenerationLease active = lineages_->BeginLoading(id, candidate.family, next);
  events.Add(
      spdlog::level::debug,
      fmt::format("backend {} generation {} loaded from {}", id, info.number, info.file.string()),
      GenerationEvent{GenerationEvent::Kind::kLoaded, id, info.number, info.file});
  // On probation before any request reaches it (shadow traffic runs its code at once).
  if (journal_ != nullptr) {
    (void)rollback_store_->Retain(ServedBeforeProbationKey(id), *active);
    journal_->Activated(id, info.sha256, info.real_path, info.number);
  }
  loader::GenerationLease baseline;
  if (baseline_generations_) {
    baseline = LoadBaseline(id, active, info.number, events);
    if (baseline != nullptr)
      (void)lineages_->BeginLoading(id, candidate.family, baseline);
  }
  Status applied =
      coordinator_->Apply({id, next, active, BackendChange::Target::kCandidate, baseline});
  if (!applied.ok() && baseline != nullptr) {
    // A runtime may have refused the baseline, not the candidate: the rollout goes on without
    // one rather than lose a candidate to its yardstick. A candidate refused on its own merits
    // is refused again.
    const uint64_t number = baseline->info().number;
    const Status with_baseline = std::move(applied);
    baseline.reset();
    applied = coordinator_->Apply({id, next, active, BackendChange::Target::kCandidate});
    if (applied.ok()) {
      lineages_->Reject(id, number,
                        with_baseline.WithContext("refused as the rollout's baseline: "));
      events.Add(spdlog::level::warn,
                 fmt::format("backend {}: candidate generation {} has no baseline (it is judged "
                             "against the stable generation): the runtimes refused baseline "
                             "generation {}: {}",
                             id, info.number, number, with_baseline.ToString()));
    } else {
      lineages_->Reject(id, number, applied.WithContext("its candidate was refused: "));
    }
  }
  if (!applied.ok()) {
    if (journal_ != nullptr)
      journal_->Abandoned(id, info.sha256);
    return RejectDeploy(candidate, std::move(applied), id, info.number, events);
  }
  lineages_->Propose(id, next, identity, baseline);
  candidate_files_.insert_or_assign(id, std::make_unique<Candidate>(candidate));
  const std::string message = "candidate beside generation " +
                              std::to_string(active->info().number) + " (progressive deploy)";
  events.Add(spdlog::level::info,
             fmt::format("backend {} generation {} is a {} from {}{}, sha256 {}{}", id, info.number,
                         message, info.file.string(),
                         info.real_path == info.file ? "" : " -> " + info.real_path.string(),
                         info.sha256, info.release.empty() ? "" : ", release " + info.release),
             GenerationEvent{GenerationEvent::Kind::kCandidate, id, info.number, info.file,
                             Status::Ok(), message});
  if (baseline != nullptr) {
    const auto& copy = baseline->info();
    events.Add(
        spdlog::level::info,
        fmt::format("backend {} generation {} is the rollout's baseline: generation {}'s "
                    "build (sha256 {}) loaded again {}, beside candidate generation {}",
                    id, copy.number, active->info().number, copy.sha256,
                    copy.runs_in.empty() ? "in the server" : "in a " + copy.runs_in, info.number));
  }
  return {DeployOutcome::Action::kCandidate, id, candidate.path, info.number, message};
}

loader::GenerationLease BackendRegistry::LoadBaseline(const std::string& id,
                                                      const loader::GenerationLease& active,
                                                      uint64_t candidate, Events& events) {
  const loader::GenerationInfo& stable = active->info();
  // From the sealed bytes that ran, never from the file: by now the file may hold the candidate
  // (copied over in place), and a baseline of other bytes would judge nothing. The copy kept for
  // the start after a crash was made from `active` a moment ago when there is a state directory;
  // else a copy of its own.
  std::string key = ServedBeforeProbationKey(id);
  auto retained = rollback_store_->Find(key);
  const bool own_copy = !retained || retained->sha256 != stable.sha256;
  if (own_copy) {
    key = BaselineKey(id);
    retained = rollback_store_->Retain(key, *active) ? rollback_store_->Find(key) : std::nullopt;
  }
  Status failed;
  loader::GenerationLease baseline;
  if (!retained) {
    failed = Internal("its bytes could not be copied (see the warning before)");
  } else {
    // kNever: a mapping (or worker) of its own, as cold as the candidate's, never the active
    // generation shared.
    auto loaded = loader_->Load(retained->copy, nullptr, loader::Loader::Reuse::kNever,
                                trust_.get(), candidate_placement_);
    if (!loaded.ok()) {
      failed = std::move(loaded).error();
    } else if (loaded->info().sha256 != stable.sha256) {
      failed = Internal("the copy " + retained->copy.string() + " holds sha256 " +
                        loaded->info().sha256 + ", not the stable build's");
    } else {
      baseline = std::move(loaded).value();
    }
  }
  if (!failed.ok()) {
    events.Add(spdlog::level::warn,
               fmt::format("backend {}: candidate generation {} has no baseline (it is judged "
                           "against the stable generation): generation {}'s build (sha256 {}) "
                           "does not load again: {}",
                           id, candidate, stable.number, stable.sha256, failed.ToString()));
    return nullptr;
  }
  const auto& info = baseline->info();
  events.Add(spdlog::level::debug,
             fmt::format("backend {} generation {} loaded from {} (generation {}'s kept bytes)", id,
                         info.number, info.file.string(), stable.number),
             GenerationEvent{GenerationEvent::Kind::kLoaded, id, info.number, info.file});
  return baseline;
}

uint64_t BackendRegistry::DropCandidateLocked(const std::string& id, Status why, Events& events) {
  const auto lineage = lineages_->ById(id);
  if (!lineage || lineage->candidate == nullptr)
    return 0;
  // Cannot be refused: runtimes only let go of their bindings on it.
  coordinator_->ApplyRegardless(
      {id, nullptr, lineage->candidate, BackendChange::Target::kCandidate});
  const loader::GenerationLease dropped = lineages_->DropCandidate(id);
  const uint64_t number = dropped->info().number;
  auto file = candidate_files_.extract(id);
  const Candidate remembered =
      file ? *file.mapped()
           : Candidate{lineage->file, dropped->info().file, Status::Ok(),
                       registry_detail::FileFingerprint(dropped->info().file)};
  RejectDeploy(remembered, std::move(why), id, number, events);
  return number;
}

namespace {

Status CheckCandidate(std::string_view id, const loader::GenerationLease& candidate,
                      uint64_t generation, std::string_view verb) {
  if (candidate == nullptr) {
    return FailedPrecondition("backend " + std::string(id) + " has no candidate generation to " +
                              std::string(verb));
  }
  if (generation != 0 && candidate->info().number != generation) {
    return FailedPrecondition("backend " + std::string(id) + ": generation " +
                              std::to_string(generation) + " is no longer its candidate (" +
                              std::to_string(candidate->info().number) + " is)");
  }
  return Status::Ok();
}

}  // namespace

Result<DeployOutcome> BackendRegistry::Promote(std::string_view id, uint64_t generation) {
  Events events;
  auto outcome = [&]() -> Result<DeployOutcome> {
    MutexLock change(change_mutex_);
    const auto lineage = lineages_->ById(id);
    if (!lineage)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    BACKPLANE_RETURN_IF_ERROR(CheckCandidate(id, lineage->candidate, generation, "promote"));
    // Checked in the change sequence, where Pin sets it: a promotion decided before a pin and
    // carried after it must not switch what the pin holds.
    if (lineage->pinned) {
      return FailedPrecondition("backend " + lineage->id + " is pinned to generation " +
                                std::to_string(lineage->active->info().number) +
                                ": candidate generation " +
                                std::to_string(lineage->candidate->info().number) +
                                " is not promoted until it is unpinned");
    }
    loader::GenerationLease next = lineage->candidate;
    if (candidate_placement_ == loader::Loader::Placement::kWorker) {
      // The build that survived its rollout in a sandbox, loaded again where its id's generations
      // run (the same content, or nothing is promoted).
      const loader::GenerationInfo& tried = lineage->candidate->info();
      auto placed = loader_->Load(tried.file, nullptr, loader::Loader::Reuse::kNever, trust_.get());
      Status refused;
      if (!placed.ok()) {
        refused = placed.error().WithContext("the candidate does not load again to be promoted: ");
      } else if (placed->info().sha256 != tried.sha256) {
        refused = FailedPrecondition(tried.file.string() + " changed during the rollout (sha256 " +
                                     placed->info().sha256 + ", the candidate's " + tried.sha256 +
                                     "); the new content is deployed as any");
      }
      if (!refused.ok()) {
        DropCandidateLocked(lineage->id, refused, events);
        return refused;
      }
      next = std::move(placed).value();
    }
    auto file = candidate_files_.extract(lineage->id);
    const Candidate candidate =
        file ? *file.mapped()
             : Candidate{lineage->file, lineage->candidate->info().file, Status::Ok(),
                         registry_detail::FileFingerprint(lineage->candidate->info().file)};
    DeployOutcome promoted =
        Activate(lineage->id, next, candidate, lineage->candidate_identity, events);
    if (promoted.action == DeployOutcome::Action::kActivated) {
      for (auto& entry : events.entries) {
        if (entry.event && entry.event->kind == GenerationEvent::Kind::kActivated)
          entry.event->promoted_candidate = lineage->candidate->info().number;
      }
      // The runtimes ended its rollout with the change; its worker goes when its requests drain.
      if (next != lineage->candidate)
        (void)lineages_->RetireCandidate(lineage->id);
    }
    if (promoted.action != DeployOutcome::Action::kActivated) {
      // Refused by a runtime: the rollout is over, and RejectDeploy recorded why.
      coordinator_->ApplyRegardless(
          {lineage->id, nullptr, lineage->candidate, BackendChange::Target::kCandidate});
      (void)lineages_->DropCandidate(lineage->id);
    }
    return promoted;
  }();
  Deliver(events);
  return outcome;
}

Result<uint64_t> BackendRegistry::DropCandidate(std::string_view id, const std::string& why,
                                                uint64_t generation, LoadReason reason) {
  Events events;
  auto dropped = [&]() -> Result<uint64_t> {
    MutexLock change(change_mutex_);
    const auto lineage = lineages_->ById(id);
    if (!lineage)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    BACKPLANE_RETURN_IF_ERROR(CheckCandidate(id, lineage->candidate, generation, "roll back"));
    return DropCandidateLocked(lineage->id, {reason, why}, events);
  }();
  Deliver(events);
  return dropped;
}

Result<registry_detail::LineageView> BackendRegistry::ActiveLineage(std::string_view id,
                                                                    uint64_t generation) const {
  auto lineage = lineages_->ById(id);
  if (!lineage)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (lineage->active == nullptr || lineage->active->info().number != generation) {
    return FailedPrecondition("backend " + std::string(id) + ": generation " +
                              std::to_string(generation) + " is not the active one any more");
  }
  return std::move(*lineage);
}

Result<DeployOutcome> BackendRegistry::Restart(std::string_view id, uint64_t generation) {
  Events events;
  auto restarted = [&]() -> Result<DeployOutcome> {
    MutexLock change(change_mutex_);
    auto lineage = ActiveLineage(id, generation);
    if (!lineage.ok())
      return std::move(lineage).error();
    const loader::GenerationInfo& crashed = lineage->active->info();
    auto loaded = loader_->Load(crashed.file, nullptr, loader::Loader::Reuse::kNever, trust_.get());
    if (loaded.ok() && loaded->info().sha256 != crashed.sha256)
      return ReloadLocked(id, events);  // another content is on disk: a deploy, as any
    if (!loaded.ok()) {
      return loaded.error().WithContext("backend " + lineage->id + ": generation " +
                                        std::to_string(generation) + " does not load again: ");
    }
    events.Add(spdlog::level::warn,
               fmt::format("backend {}: generation {}'s worker died; restarting it as generation "
                           "{} from {}",
                           lineage->id, generation, loaded->info().number, crashed.file.string()));
    return Activate(
        lineage->id, std::move(loaded).value(),
        {lineage->file, crashed.file, Status::Ok(), registry_detail::FileFingerprint(crashed.file)},
        crashed.identity, events, Activation::kRestart);
  }();
  Deliver(events);
  return restarted;
}

DeployOutcome BackendRegistry::Activate(const std::string& id, loader::GenerationLease next,
                                        const Candidate& candidate,
                                        std::optional<loader::FileIdentity> identity,
                                        Events& events, Activation kind) {
  const auto& info = next->info();
  loader::GenerationLease previous = lineages_->BeginLoading(id, candidate.family, next);
  events.Add(
      spdlog::level::debug,
      fmt::format("backend {} generation {} loaded from {}", id, info.number, info.file.string()),
      GenerationEvent{GenerationEvent::Kind::kLoaded, id, info.number, info.file});

  // A new build over one that served is on probation (durably) before its code is asked to do
  // anything: runtimes prepare on it next, and a crash from here on is its. A build found at start
  // is not (a crash soon after a start says nothing about any one build, and refusing it would
  // leave its id nothing to serve), nor is a rollback (an operator's choice of a known build).
  const bool probation = journal_ != nullptr && previous != nullptr && identity.has_value() &&
                         kind != Activation::kRollback;
  if (probation) {
    (void)rollback_store_->Retain(ServedBeforeProbationKey(id), *previous);
    journal_->Activated(id, info.sha256, info.real_path, info.number);
  }
  // Every runtime prepares (instances, contexts, networks) before anything switches.
  Status applied = coordinator_->Apply({id, next, previous});
  if (!applied.ok()) {
    if (probation)
      journal_->Abandoned(id, info.sha256);
    return RejectDeploy(candidate, std::move(applied), id, info.number, events);
  }

  // Keep the outgoing version's code for Rollback, so that the generation itself can leave the
  // process once it drains.
  // process once it drains. Not a restarted worker's build: the version before it stays the one a
  // rollback returns to.
  if (previous != nullptr && kind != Activation::kRestart)
    (void)rollback_store_->Retain(id, *previous);
  lineages_->Activate(id, next, identity);

  std::string message = previous == nullptr
                            ? "new backend id"
                            : "replaces generation " + std::to_string(previous->info().number);
  if (!identity || kind == Activation::kRollback)
    message = "rollback; " + message;
  events.Add(spdlog::level::info,
             fmt::format("backend {} generation {} active ({}) from {}{}, sha256 {}{}", id,
                         info.number, message, info.file.string(),
                         info.real_path == info.file ? "" : " -> " + info.real_path.string(),
                         info.sha256, info.release.empty() ? "" : ", release " + info.release),
             GenerationEvent{GenerationEvent::Kind::kActivated, id, info.number, info.file,
                             Status::Ok(), message});
  if (previous != nullptr) {
    const auto& old = previous->info();
    events.Add(spdlog::level::debug,
               fmt::format("backend {} generation {} draining", id, old.number),
               GenerationEvent{GenerationEvent::Kind::kDraining, id, old.number, old.file});
  }
  return {DeployOutcome::Action::kActivated, id, candidate.path, info.number, message};
}

DeployOutcome BackendRegistry::RejectDeploy(const Candidate& candidate, Status error,
                                            std::string backend_id, uint64_t generation,
                                            Events& events, uint64_t trust_revision) {
  if (error.reason() == LoadReason::kUntrusted)
    scanner_->RememberRejected(candidate, trust_revision, error);
  else
    scanner_->RememberRejected(candidate, std::nullopt, error);
  if (generation != 0)
    lineages_->Reject(backend_id, generation, error);
  // The versioned file behind a link is what was refused: after `ln -sfn`, the link's own name
  // says nothing of which build that was.
  const fs::path resolved = registry_detail::ResolvedFile(candidate);
  lineages_->AddRejected({candidate.path, error, backend_id, resolved});
  // Said only of an id that serves: a brand-new id that is refused has nothing to keep.
  const std::optional<BackendStatus> known =
      backend_id.empty() ? std::nullopt : lineages_->Describe(backend_id);
  const std::string keeps = known && known->active_generation != 0
                                ? "; backend " + backend_id + " keeps what it was serving"
                                : "";
  events.Add(spdlog::level::err,
             fmt::format("backend file {}{} rejected: {}{}", candidate.path.string(),
                         resolved == candidate.path ? "" : " -> " + resolved.string(),
                         error.ToString(), keeps),
             GenerationEvent{GenerationEvent::Kind::kRejected, backend_id, generation,
                             candidate.path, error, error.message()});
  return {DeployOutcome::Action::kRejected,
          std::move(backend_id),
          candidate.path,
          generation,
          error.ToString(),
          error};
}

DeployOutcome BackendRegistry::RefuseSuspected(const Candidate& candidate,
                                               loader::GenerationLease next,
                                               const ActivationRecord& suspect, Events& events) {
  const std::string id = next->info().backend_id;
  const std::string sha256 = next->info().sha256;
  next.reset();  // never offered: it unloads
  Status why{LoadReason::kSuspectedCrash,
             fmt::format("{} (sha256 {}) is suspected of a crash: the process that activated it as "
                         "generation {} ended without a clean shutdown before it had survived its "
                         "crash grace; not loaded again until another file is published or an "
                         "operator reloads backend {}",
                         candidate.path.string(), sha256, suspect.generation, id)};
  const auto lineage = lineages_->ById(id);
  if (lineage && lineage->offered())
    return RejectDeploy(candidate, std::move(why), id, 0, events);

  // The start after the crash: the id serves nothing yet. The build that served when the suspect
  // went on probation was kept in the state directory then, whatever has been copied over its
  // file since (the suspect itself, in place).
  const auto retained = rollback_store_->Find(ServedBeforeProbationKey(id));
  if (!retained || retained->sha256 == sha256) {
    events.Add(spdlog::level::warn,
               fmt::format("backend {}: no previous version is kept in {} to serve instead of the "
                           "suspected build",
                           id, journal_->directory().string()));
    return RejectDeploy(candidate, std::move(why), id, 0, events);
  }
  auto loaded = LoadGeneration(retained->copy, nullptr);
  if (!loaded.ok() || loaded->info().sha256 != retained->sha256) {
    events.Add(spdlog::level::err,
               fmt::format("backend {}: the previous version kept in {} does not load: {}", id,
                           retained->copy.string(),
                           loaded.ok() ? "its content changed" : loaded.error().ToString()));
    return RejectDeploy(candidate, std::move(why), id, 0, events);
  }
  DeployOutcome served = Activate(id, std::move(loaded).value(),
                                  {candidate.family, retained->copy, Status::Ok(),
                                   registry_detail::FileFingerprint(retained->copy)},
                                  std::nullopt, events);
  if (served.action == DeployOutcome::Action::kActivated) {
    events.Add(spdlog::level::warn,
               fmt::format("backend {} serves its previous version (generation {}, sha256 {}, kept "
                           "as {}, from {}) instead of the build suspected of a crash",
                           id, served.generation, retained->sha256, retained->copy.string(),
                           retained->resolved_file.string()));
  }
  return RejectDeploy(candidate, std::move(why), id, 0, events);
}

uint64_t BackendRegistry::TrustRevision() const {
  return trust_ ? trust_->Revision() : 0;
}

DeployOutcome BackendRegistry::Withdraw(const std::string& id, Events& events,
                                        const std::string& why) {
  DropCandidateLocked(
      id, {LoadReason::kRolledBack, why.empty() ? "the backend's file was deleted" : why}, events);
  const auto lineage = lineages_->ById(id);
  // Withdrawing cannot be refused: the file is gone (or its code is). Runtimes move what they
  // can.
  coordinator_->ApplyRegardless({id, nullptr, lineage->active});
  const loader::GenerationLease leaving = lineages_->Withdraw(id);
  const uint64_t number = leaving->info().number;
  const std::string message = (why.empty() ? lineage->file.string() + " was deleted" : why) +
                              ": no new network uses backend " + id +
                              "; networks move to their next preferred backend";
  events.Add(spdlog::level::warn,
             fmt::format("backend {} generation {} withdrawn: {}", id, number, message),
             GenerationEvent{GenerationEvent::Kind::kWithdrawn, id, number, lineage->file,
                             Status::Ok(), message});
  return {DeployOutcome::Action::kWithdrawn, id, lineage->file, number, message};
}

Result<DeployOutcome> BackendRegistry::WithdrawCrashed(std::string_view id, uint64_t generation,
                                                       const std::string& why) {
  Events events;
  auto withdrawn = [&]() -> Result<DeployOutcome> {
    MutexLock change(change_mutex_);
    auto lineage = ActiveLineage(id, generation);
    if (!lineage.ok())
      return std::move(lineage).error();
    const fs::path file = lineage->active->info().file;
    // Refused like a broken deploy until the file changes: a rescan must not load it again.
    const Candidate crashed{lineage->file, file, Status::Ok(),
                            registry_detail::FileFingerprint(file)};
    scanner_->RememberRejected(crashed);
    lineages_->AddRejected({file, {LoadReason::kCrashed, why}, lineage->id});
    return Withdraw(lineage->id, events, why);
  }();
  Deliver(events);
  return withdrawn;
}

Result<DeployOutcome> BackendRegistry::Reload(std::string_view id) {
  Events events;
  auto outcome = [&] {
    MutexLock change(change_mutex_);
    if (journal_ != nullptr) {
      const auto dropped = journal_->Forget(id);
      for (const auto& record : dropped) {
        events.Add(spdlog::level::warn,
                   fmt::format("backend {}: reloaded by an operator: sha256 {} ({}) is no longer "
                               "suspected of a crash and may load again",
                               id, record.sha256, record.file.string()));
      }
      // The start after the crash had no previous version to serve instead: the id was never
      // registered, and its refused file is known only as a rejected one.
      if (!dropped.empty() && !lineages_->ById(id))
        return ReloadRefusedSuspect(id, events);
    }
    return ReloadLocked(id, events);
  }();
  Deliver(events);
  return outcome;
}

Result<DeployOutcome> BackendRegistry::ReloadLocked(std::string_view id, Events& events) {
  const auto lineage = lineages_->ById(id);
  if (!lineage)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (lineage->is_static) {
    return FailedPrecondition("backend " + std::string(id) +
                              " is linked in (static): it has no file to reload");
  }
  const auto candidate = scanner_->ScanFamily(lineage->file);
  if (!candidate) {
    if (lineage->active != nullptr)
      return Withdraw(lineage->id, events);
    return DeployOutcome{DeployOutcome::Action::kUnchanged, lineage->id, lineage->file, 0,
                         lineage->file.string() + " does not exist"};
  }
  // A build rolled back stays refused until another file is published (a new rollout of it is a
  // new publish, which an operator can make): the reload says so and loads nothing.
  if (const auto rolled_back = scanner_->RolledBackAndUnchanged(*candidate)) {
    const fs::path resolved = registry_detail::ResolvedFile(*candidate);
    const std::string named =
        candidate->path.string() + (resolved == candidate->path ? "" : " -> " + resolved.string());
    Status refused{LoadReason::kRolledBack,
                   named + " was rolled back (" + rolled_back->message() +
                       ") and stays refused until another file is published; publish it again "
                       "(write a new file, rename it into place) to roll it out anew"};
    events.Add(spdlog::level::warn,
               fmt::format("backend {}: reload refused: {}", lineage->id, refused.message()));
    return DeployOutcome{DeployOutcome::Action::kRejected,
                         lineage->id,
                         candidate->path,
                         0,
                         refused.ToString(),
                         refused};
  }
  // An explicit reload looks again even at a rejected file, says again that it is pinned, and
  // takes the file as it is now: an incomplete one is rejected, not deferred.
  scanner_->ForgetRejected(candidate->path);
  lineages_->ForgetPinnedSeen(id);
  return DeployIfChanged(*candidate, std::chrono::milliseconds::zero(), events);
}

Result<DeployOutcome> BackendRegistry::ReloadRefusedSuspect(std::string_view id, Events& events) {
  for (const auto& rejected : lineages_->Rejected()) {
    if (rejected.backend_id != id || rejected.error.reason() != LoadReason::kSuspectedCrash)
      continue;
    const auto candidate = scanner_->ScanFamily(loader::BackendFamily(rejected.file));
    if (!candidate)
      continue;
    scanner_->ForgetRejected(candidate->path);
    return DeployIfChanged(*candidate, std::chrono::milliseconds::zero(), events);
  }
  return NotFound("no backend with id " + std::string(id) + " is registered");
}

Result<uint64_t> BackendRegistry::Rollback(std::string_view id) {
  Events events;
  auto result = [&]() -> Result<uint64_t> {
    MutexLock change(change_mutex_);
    const auto lineage = lineages_->ById(id);
    if (!lineage)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    if (lineage->is_static)
      return FailedPrecondition("backend " + std::string(id) + " is linked in (static)");
    const auto retained = rollback_store_->Find(lineage->id);
    if (!retained || lineage->active == nullptr) {
      return FailedPrecondition("backend " + std::string(id) +
                                " has no previous generation to roll back to");
    }
    auto loaded = LoadGeneration(retained->copy, nullptr);
    if (!loaded.ok()) {
      return loaded.error().WithContext("backend " + lineage->id +
                                        ": the previous version does not load again: ");
    }
    if (loaded->info().sha256 != retained->sha256) {
      return Internal("backend " + lineage->id + ": the copy kept for rollback (" +
                      retained->copy.string() + ") no longer has the content of " +
                      retained->resolved_file.string() + " (sha256 " + retained->sha256 +
                      "); nothing was changed");
    }
    DropCandidateLocked(
        lineage->id,
        {LoadReason::kRolledBack, "the backend was rolled back to its previous version"}, events);
    // The lineage keeps following its file: the version on disk is still the one it rolled
    // back from, and is not loaded again until it changes.
    DeployOutcome outcome = Activate(lineage->id, std::move(loaded).value(),
                                     {lineage->file, retained->copy, Status::Ok(),
                                      registry_detail::FileFingerprint(retained->copy)},
                                     std::nullopt, events, Activation::kRollback);
    if (outcome.action != DeployOutcome::Action::kActivated)
      return outcome.error.WithContext("backend " + lineage->id + ": rollback refused: ");
    return outcome.generation;
  }();
  Deliver(events);
  return result;
}

Status BackendRegistry::Pin(std::string_view id) {
  {
    // In the change sequence: once Pin returns, no change already under way can still switch.
    MutexLock change(change_mutex_);
    BACKPLANE_RETURN_IF_ERROR(lineages_->SetPinned(id, true));
  }
  const auto lineage = lineages_->ById(id);
  const uint64_t generation = lineage->active ? lineage->active->info().number : 0;
  Events events;
  events.Add(spdlog::level::info, fmt::format("backend {} pinned to generation {}", id, generation),
             GenerationEvent{GenerationEvent::Kind::kPinned, std::string(id), generation});
  Deliver(events);
  return Status::Ok();
}

Result<DeployOutcome> BackendRegistry::Unpin(std::string_view id) {
  Events events;
  auto outcome = [&]() -> Result<DeployOutcome> {
    MutexLock change(change_mutex_);
    BACKPLANE_RETURN_IF_ERROR(lineages_->SetPinned(id, false));
    events.Add(spdlog::level::info, fmt::format("backend {} unpinned", id),
               GenerationEvent{GenerationEvent::Kind::kUnpinned, std::string(id)});
    return ReloadLocked(id, events);  // whatever was published meanwhile takes effect now
  }();
  Deliver(events);
  return outcome;
}

void BackendRegistry::OnUnloaded(const loader::GenerationInfo& generation, bool leaked) {
  const auto drained = lineages_->Unloaded(generation, leaked);
  if (!drained)
    return;  // never registered (a duplicate, an unchanged reload)
  Events events;
  const auto kind = leaked ? GenerationEvent::Kind::kLeaked : GenerationEvent::Kind::kUnloaded;
  events.Add(leaked ? spdlog::level::warn : spdlog::level::debug,
             fmt::format("backend {} generation {} {}", generation.backend_id, generation.number,
                         leaked ? "leaked: still mapped after dlclose" : "left the process"),
             GenerationEvent{kind, generation.backend_id, generation.number, generation.file,
                             Status::Ok(), "", *drained});
  Deliver(events);
}

void BackendRegistry::Deliver(Events& events) {
  for (auto& entry : events.entries) {
    Log().log(entry.level, entry.line);
    if (entry.event)
      observers_.Notify(*entry.event);
  }
  events.entries.clear();
}

uint64_t BackendRegistry::AddObserver(GenerationObserver observer) {
  return observers_.Add(std::move(observer));
}

void BackendRegistry::RemoveObserver(uint64_t observer_id) {
  observers_.Remove(observer_id);
}

Subscription BackendRegistry::Subscribe(BackendSubscriber& subscriber,
                                        const std::function<void()>& attach) {
  MutexLock change(change_mutex_);
  attach();
  return Subscription(weak_from_this(), coordinator_->Subscribe(subscriber));
}

void BackendRegistry::Unsubscribe(uint64_t subscriber_id) {
  MutexLock change(change_mutex_);
  coordinator_->Unsubscribe(subscriber_id);
}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = std::move(other.registry_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void Subscription::Reset() {
  if (auto registry = registry_.lock(); registry && id_ != 0)
    registry->Unsubscribe(id_);
  registry_.reset();
  id_ = 0;
}

std::vector<std::string> BackendRegistry::BackendIds() const {
  return lineages_->OfferedIds();
}

std::optional<RegisteredBackend> BackendRegistry::Find(std::string_view id) const {
  auto offer = lineages_->FindOffer(id);
  if (!offer)
    return std::nullopt;
  return std::move(offer->backend);
}

std::vector<loader::RejectedFile> BackendRegistry::Rejected() const {
  return lineages_->Rejected();
}

std::vector<ActivationRecord> BackendRegistry::ActivationRecords() const {
  return journal_ != nullptr ? journal_->Records() : std::vector<ActivationRecord>{};
}

namespace {

void AddActivations(BackendStatus& status, const std::vector<ActivationRecord>& records) {
  for (const auto& record : records) {
    if (record.backend_id == status.id)
      status.activations.push_back(record);
  }
}

}  // namespace

std::vector<BackendStatus> BackendRegistry::Describe() const {
  auto statuses = lineages_->Describe();
  const auto records = ActivationRecords();
  for (auto& status : statuses)
    AddActivations(status, records);
  return statuses;
}

std::optional<BackendStatus> BackendRegistry::Describe(std::string_view id) const {
  auto status = lineages_->Describe(id);
  if (status)
    AddActivations(*status, ActivationRecords());
  return status;
}

Result<std::shared_ptr<loader::BackendInstance>> BackendRegistry::CreateInstance(
    std::string_view id) {
  auto offer = lineages_->FindOffer(id);
  if (!offer)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (!offer->backend.is_static())
    return loader_->CreateInstance(offer->backend.generation);
  // A linked-in backend: same guards, no lease.
  std::unique_ptr<IBackend> backend;
  auto created = GuardBackendCall(offer->backend.id, "static factory", [&]() -> Status {
    backend = offer->factory();
    return Status::Ok();
  });
  if (!created.ok())
    return created;
  if (backend == nullptr)
    return Internal("static backend " + offer->backend.id + ": factory returned null");
  return loader::MakeBackendInstance(offer->backend.id, std::move(backend), nullptr,
                                     loader_->reaper());
}

}  // namespace backplane
