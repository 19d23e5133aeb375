#include "backplane/registry/backend_registry.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "backplane/core/logging.hpp"

namespace backplane {
namespace fs = std::filesystem;
using loader::LoadError;
using loader::LoadReason;

namespace {

spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.registry");
  return logger;
}

struct StaticBackendList {
  std::mutex mutex;
  std::vector<std::pair<std::string, StaticBackendFactory>> backends;  // guarded by mutex
};

StaticBackendList& StaticBackends() {
  static StaticBackendList list;
  return list;
}

}  // namespace

bool RegisterStaticBackend(std::string id, StaticBackendFactory factory) {
  auto& list = StaticBackends();
  std::lock_guard lock(list.mutex);
  list.backends.emplace_back(std::move(id), std::move(factory));
  return true;
}

std::vector<fs::path> DefaultBackendPaths() {
  if (const char* paths = std::getenv("BACKPLANE_BACKEND_PATHS")) {
    return loader::SplitPathList(paths);
  }
  return loader::SplitPathList(BACKPLANE_DEFAULT_BACKEND_PATHS);
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
  std::shared_ptr<BackendRegistry> registry(
      new BackendRegistry(std::move(shared_loader), std::move(directories)));
  // The reaper tells when a drained generation has left the process (or leaked).
  registry->unload_listener_ = registry->loader_->stats().unload_listeners.Add(
      [raw = registry.get()](const loader::GenerationInfo& generation, bool leaked) {
        // Raw, not a locked weak_ptr: a strong reference taken here could make the reaper thread
        // the registry's last owner. The destructor's Remove waits for a call in progress.
        raw->OnUnloaded(generation, leaked);
      });

  {
    auto& list = StaticBackends();
    std::vector<std::pair<std::string, StaticBackendFactory>> statics;
    {
      std::lock_guard lock(list.mutex);
      statics = list.backends;
    }
    for (auto& [id, factory] : statics) {
      if (Status status = registry->RegisterStatic(id, factory); !status.ok()) {
        Log().error("static backend {} not registered: {}", id, status.message());
      }
    }
  }

  if (!registry->directories_.empty()) {
    (void)registry->Rescan();  // failures are recorded and logged
  }
  return registry;
}

namespace {

constexpr std::size_t kHistoryLimit = 16;   // generation records kept per id
constexpr std::size_t kRejectedLimit = 64;  // rejected files kept

using SteadyClock = std::chrono::steady_clock;

// What makes a rejected file worth looking at again: any change of what the path resolves to.
std::string Fingerprint(const fs::path& real_path, const loader::FileIdentity& identity) {
  return real_path.string() + "|" + std::to_string(identity.device) + ":" +
         std::to_string(identity.inode) + ":" + std::to_string(identity.size) + ":" +
         std::to_string(identity.mtime_ns) + ":" + std::to_string(identity.ctime_ns);
}

}  // namespace

std::string_view ToString(GenerationState state) {
  switch (state) {
    case GenerationState::kLoading:
      return "loading";
    case GenerationState::kActive:
      return "active";
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

// One generation as the registry remembers it, after its lease may be long gone.
struct GenerationRecord {
  GenerationStatus status;
  std::weak_ptr<const loader::Generation> generation;
  std::optional<SteadyClock::time_point> deactivated_at;
};

// One backend id: where its code comes from and the generations it has had.
struct BackendRegistry::Lineage {
  std::string id;
  StaticBackendFactory factory;    // static backends only
  loader::GenerationLease active;  // what the id offers; null: static, withdrawn, never active
  fs::path file;                   // the backend file its generations come from (as found)
  std::optional<loader::FileIdentity> identity;  // of `file` when `active` was loaded from it
  fs::path rollback_file;                        // a retained copy of the version before `active`
  bool pinned = false;
  std::optional<loader::FileIdentity> pinned_seen;  // the newest identity ignored while pinned
  std::deque<GenerationRecord> history;             // newest first, bounded

  bool is_static() const { return factory != nullptr; }
  bool offered() const { return is_static() || active != nullptr; }
  GenerationRecord* Record(uint64_t number) {
    for (auto& record : history) {
      if (record.status.generation == number)
        return &record;
    }
    return nullptr;
  }
  void AddRecord(GenerationRecord record) {
    history.push_front(std::move(record));
    // Forget the oldest generations that are over (unloaded, leaked or rejected and gone).
    for (auto it = history.end(); history.size() > kHistoryLimit && it != history.begin();) {
      --it;
      const auto state = it->status.state;
      const bool over = state == GenerationState::kUnloaded || state == GenerationState::kLeaked ||
                        (state == GenerationState::kRejected && it->generation.expired());
      if (over)
        it = history.erase(it);
    }
  }
};

// A generation on its way to becoming active.
struct BackendRegistry::Deployment {
  std::string id;
  loader::GenerationLease next;
  fs::path file;                  // the lineage's file from now on
  loader::FileIdentity identity;  // of `file` as loaded
  bool rollback = false;          // the lineage keeps its file and identity
};

BackendRegistry::BackendRegistry(std::shared_ptr<loader::Loader> loader,
                                 std::vector<fs::path> directories)
    : loader_(std::move(loader)), directories_(std::move(directories)) {}

BackendRegistry::~BackendRegistry() {
  loader_->stats().unload_listeners.Remove(unload_listener_);
  std::lock_guard lock(mutex_);
  for (const auto& lineage : lineages_) {
    if (!lineage->rollback_file.empty())
      unlink(lineage->rollback_file.c_str());
  }
}

Status BackendRegistry::RegisterStatic(std::string id, StaticBackendFactory factory) {
  if (id.empty())
    return InvalidArgument("a static backend needs a non-empty id");
  if (!factory)
    return InvalidArgument("static backend " + id + " has no factory");
  std::lock_guard lock(mutex_);
  if (FindLineage(id) != nullptr)
    return {StatusCode::kAlreadyExists, "backend id " + id + " is already registered"};
  auto lineage = std::make_unique<Lineage>();
  lineage->id = id;
  lineage->factory = std::move(factory);
  lineages_.push_back(std::move(lineage));
  Log().info("registered static backend {}", id);
  return Status::Ok();
}

loader::LoadResult<RegisteredBackend> BackendRegistry::LoadFile(const fs::path& file,
                                                                loader::LoadTrace* trace) {
  std::lock_guard change(change_mutex_);
  DeployOutcome outcome = Deploy(file, DeployMode::kRegister, trace);
  if (outcome.action != DeployOutcome::Action::kActivated) {
    std::lock_guard lock(mutex_);
    const auto& last = rejected_.back();  // Deploy recorded why
    return LoadError{last.reason, last.message};
  }
  return *Find(outcome.backend_id);
}

RescanResult BackendRegistry::Rescan() {
  std::lock_guard change(change_mutex_);
  RescanResult result;
  auto discovery = loader::DiscoverBackendFiles(directories_, loader_->options().file_policy);
  for (auto& rejected : discovery.rejected) {
    auto identity = loader::ReadFileIdentity(rejected.file).value_or(loader::FileIdentity{});
    std::string fingerprint =
        std::string(loader::ToString(rejected.reason)) + Fingerprint(rejected.file, identity);
    auto& last = rejected_fingerprints_[rejected.file];
    if (last != fingerprint) {
      last = std::move(fingerprint);
      Reject(std::move(rejected));
    }
  }

  std::set<fs::path> present;
  std::set<fs::path> watch(directories_.begin(), directories_.end());
  for (const auto& file : discovery.files) {
    present.insert(file.path);
    watch.insert(file.real_path.parent_path());  // rule 7: where symlinks point is watched too
    if (auto outcome = DeployIfChanged(file)) {
      result.retry_soon |= outcome->action == DeployOutcome::Action::kDeferred;
      result.outcomes.push_back(std::move(*outcome));
    }
  }
  std::erase_if(rejected_fingerprints_,
                [&](const auto& entry) { return !fs::exists(entry.first); });

  std::vector<std::string> vanished;
  {
    std::lock_guard lock(mutex_);
    for (const auto& lineage : lineages_) {
      if (lineage->active != nullptr && !lineage->file.empty() && !present.contains(lineage->file))
        vanished.push_back(lineage->id);
    }
  }
  for (const auto& id : vanished)
    result.outcomes.push_back(Withdraw(id));
  result.watch_directories.assign(watch.begin(), watch.end());
  return result;
}

std::optional<DeployOutcome> BackendRegistry::DeployIfChanged(const loader::BackendFile& file) {
  auto identity = loader::ReadFileIdentity(file.path);
  if (!identity)
    return std::nullopt;  // gone since the listing: the next scan withdraws it
  {
    std::lock_guard lock(mutex_);
    if (Lineage* lineage = FindLineageByFile(file.path)) {
      // Device and inode pin down the real file, so a retargeted symlink counts as a change.
      if (lineage->active != nullptr && lineage->identity == identity)
        return std::nullopt;
      if (lineage->pinned && lineage->active != nullptr) {
        if (lineage->pinned_seen == identity)
          return std::nullopt;
        lineage->pinned_seen = identity;
        Log().info("backend {} is pinned to generation {}: new file {} ignored until unpinned",
                    lineage->id, lineage->active->info().number, file.path.string());
        return DeployOutcome{DeployOutcome::Action::kPinned, lineage->id, file.path,
                             lineage->active->info().number,
                             "backend " + lineage->id + " is pinned; the new file is ignored"};
      }
    }
  }
  auto it = rejected_fingerprints_.find(file.path);
  if (it != rejected_fingerprints_.end() && it->second == Fingerprint(file.real_path, *identity))
    return std::nullopt;  // rejected already, and unchanged since
  return Deploy(file.path, DeployMode::kReplace);
}

DeployOutcome BackendRegistry::Deploy(const fs::path& file, DeployMode mode,
                                      loader::LoadTrace* trace) {
  std::string known_id;
  {
    std::lock_guard lock(mutex_);
    if (const Lineage* lineage = FindLineageByFile(file))
      known_id = lineage->id;
  }
  auto loaded = loader_->Load(file, trace);
  if (!loaded.ok()) {
    auto error = std::move(loaded).error();
    if (mode == DeployMode::kReplace &&
        (error.reason == LoadReason::kFileBusy || error.reason == LoadReason::kFileChanged)) {
      // Not a verdict on the file: its writer is still at work. Look again soon.
      Log().info("backend file {} not loaded yet: {}", file.string(), error.message);
      return {DeployOutcome::Action::kDeferred, known_id, file, 0, error.message};
    }
    return RejectDeploy(file, std::move(error), known_id);
  }
  loader::GenerationLease next = std::move(loaded).value();
  const auto& info = next->info();

  std::optional<LoadError> refused;
  {
    std::lock_guard lock(mutex_);
    const Lineage* by_file = FindLineageByFile(file);
    const Lineage* by_id = FindLineage(info.backend_id);
    if (by_file != nullptr && by_file->id != info.backend_id && mode == DeployMode::kReplace) {
      refused =
          LoadError{LoadReason::kInvalidId, file.string() + " now provides backend id " +
                                                info.backend_id + " but provided " + by_file->id +
                                                " before; a backend file keeps its id (publish " +
                                                info.backend_id + " under a file name of its own)"};
    } else if (by_id != nullptr && by_id->offered() &&
               (mode == DeployMode::kRegister || by_id->file != file)) {
      const bool same_file =
          by_id->active != nullptr && by_id->active->info().real_path == info.real_path;
      refused = LoadError{
          LoadReason::kDuplicateId,
          file.string() + " provides backend id " + info.backend_id + ", which " +
              (same_file ? "this registry has loaded from this very file already"
                         : "is already registered from " +
                               (by_id->is_static() ? std::string("a static (linked-in) backend")
                                                   : by_id->file.string())) +
              "; the first registration wins"};
    }
    if (!refused && by_id != nullptr && by_id->active == next) {
      return {DeployOutcome::Action::kUnchanged, info.backend_id, file, info.number,
              "generation " + std::to_string(info.number) + " is this file already"};
    }
  }
  if (refused) {
    if (trace != nullptr)
      trace->Add({"register", false, refused->message});
    return RejectDeploy(file, *std::move(refused), info.backend_id);
  }
  if (trace != nullptr)
    trace->Add({"register", true, "backend id " + info.backend_id});
  const std::string id = info.backend_id;
  return Activate({id, std::move(next), file, info.identity});
}

DeployOutcome BackendRegistry::Activate(Deployment deployment) {
  const auto& info = deployment.next->info();
  const std::string& id = deployment.id;
  loader::GenerationLease previous;
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    if (lineage == nullptr) {
      lineages_.push_back(std::make_unique<Lineage>());
      lineage = lineages_.back().get();
      lineage->id = id;
      lineage->file = deployment.file;
    }
    previous = lineage->active;
    lineage->AddRecord({.status = {.generation = info.number,
                                   .state = GenerationState::kLoading,
                                   .file = info.file,
                                   .release = info.release,
                                   .api_version = info.api_version,
                                   .build_id = info.build_id,
                                   .loaded_at = info.loaded_at},
                        .generation = deployment.next});
  }
  Notify({GenerationEvent::Kind::kLoaded, id, info.number, info.file});

  // Every runtime prepares (instances, contexts, networks) before anything switches.
  std::vector<CommitChange> commits;
  for (const auto& [subscriber_id, subscriber] : subscribers_) {
    auto prepared = subscriber->PrepareChange({id, deployment.next, previous});
    if (!prepared.ok()) {
      return RejectDeploy(deployment.file, std::move(prepared).error(), id, info.number);
    }
    commits.push_back(std::move(prepared).value());
  }
  for (auto& commit : commits)
    commit();

  // Keep the outgoing version's code for Rollback, so that the generation itself can leave the
  // process. A copy, not a hard link: unlinking the shadow changes a shared inode's ctime, which
  // the loader would take for a writer at work.
  fs::path retained;
  if (previous != nullptr) {
    retained = RetainedCopyPath(*FindLineage(id), previous->info());
    std::error_code error;
    fs::create_directories(retained.parent_path(), error);
    fs::copy_file(previous->info().shadow_path, retained, fs::copy_options::overwrite_existing,
                  error);
    if (error) {
      Log().warn("backend {}: cannot keep generation {} for rollback ({}): {}", id,
                  previous->info().number, retained.string(), error.message());
      retained.clear();
    }
  }
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    lineage->active = deployment.next;
    if (!deployment.rollback) {
      lineage->file = deployment.file;
      lineage->identity = deployment.identity;
    }
    lineage->pinned_seen.reset();
    if (!retained.empty()) {
      if (!lineage->rollback_file.empty() && lineage->rollback_file != retained)
        unlink(lineage->rollback_file.c_str());
      lineage->rollback_file = retained;
    }
    lineage->Record(info.number)->status.state = GenerationState::kActive;
    if (previous != nullptr) {
      if (GenerationRecord* old = lineage->Record(previous->info().number)) {
        old->status.state = GenerationState::kDraining;
        old->deactivated_at = SteadyClock::now();
      }
    }
  }
  std::string message = previous == nullptr
                            ? "new backend id"
                            : "replaces generation " + std::to_string(previous->info().number);
  if (deployment.rollback)
    message = "rollback; " + message;
  Log().info("backend {} generation {} active ({}) from {}{}", id, info.number, message,
              info.file.string(), info.release.empty() ? "" : ", release " + info.release);
  Notify({GenerationEvent::Kind::kActivated, id, info.number, info.file, std::nullopt, message});
  if (previous != nullptr) {
    Notify({GenerationEvent::Kind::kDraining, id, previous->info().number, previous->info().file});
  }
  return {DeployOutcome::Action::kActivated, id, deployment.file, info.number, message};
}

DeployOutcome BackendRegistry::RejectDeploy(const fs::path& file, LoadError error,
                                            std::string backend_id, uint64_t generation) {
  if (auto identity = loader::ReadFileIdentity(file)) {
    std::error_code ignored;
    rejected_fingerprints_[file] = Fingerprint(fs::canonical(file, ignored), *identity);
  }
  if (generation != 0) {
    std::lock_guard lock(mutex_);
    if (Lineage* lineage = FindLineage(backend_id)) {
      if (GenerationRecord* record = lineage->Record(generation)) {
        record->status.state = GenerationState::kRejected;
        record->status.reason = error.ToString();
      }
    }
  }
  Reject({file, error.reason, error.message, backend_id});
  Notify({GenerationEvent::Kind::kRejected, backend_id, generation, file, error.reason,
          error.message});
  return {DeployOutcome::Action::kRejected, std::move(backend_id), file, generation,
          error.ToString()};
}

DeployOutcome BackendRegistry::Withdraw(const std::string& id) {
  loader::GenerationLease leaving;
  fs::path file;
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    leaving = lineage->active;
    file = lineage->file;
  }
  // Withdrawing cannot be refused: the file is gone. Runtimes move what they can.
  std::vector<CommitChange> commits;
  for (const auto& [subscriber_id, subscriber] : subscribers_) {
    auto prepared = subscriber->PrepareChange({id, nullptr, leaving});
    if (prepared.ok())
      commits.push_back(std::move(prepared).value());
    else
      Log().warn("backend {}: a runtime could not prepare for its withdrawal: {}", id,
                  prepared.error().ToString());
  }
  for (auto& commit : commits)
    commit();
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    lineage->active = nullptr;
    lineage->identity.reset();
    if (GenerationRecord* record = lineage->Record(leaving->info().number)) {
      record->status.state = GenerationState::kDraining;
      record->deactivated_at = SteadyClock::now();
    }
  }
  const std::string message = file.string() + " was deleted: no new network uses backend " + id +
                              "; networks move to their next preferred backend";
  Log().warn("backend {} generation {} withdrawn: {}", id, leaving->info().number, message);
  Notify(
      {GenerationEvent::Kind::kWithdrawn, id, leaving->info().number, file, std::nullopt, message});
  return {DeployOutcome::Action::kWithdrawn, id, file, leaving->info().number, message};
}

Result<DeployOutcome> BackendRegistry::Reload(std::string_view id) {
  std::lock_guard change(change_mutex_);
  fs::path file;
  {
    std::lock_guard lock(mutex_);
    const Lineage* lineage = FindLineage(id);
    if (lineage == nullptr)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    if (lineage->is_static())
      return FailedPrecondition("backend " + std::string(id) +
                                " is linked in (static): it has no file to reload");
    file = lineage->file;
  }
  auto resolved = loader::ResolveBackendFile(file, loader_->options().file_policy);
  if (!resolved.ok()) {
    bool offered = false;
    {
      std::lock_guard lock(mutex_);
      offered = FindLineage(id)->active != nullptr;
    }
    if (resolved.error().reason == LoadReason::kNotFound && offered)
      return Withdraw(std::string(id));
    return RejectDeploy(file, std::move(resolved).error(), std::string(id));
  }
  // An explicit reload looks again even at a rejected file, and says again that it is pinned.
  rejected_fingerprints_.erase(file);
  {
    std::lock_guard lock(mutex_);
    FindLineage(id)->pinned_seen.reset();
  }
  if (auto outcome = DeployIfChanged(*resolved))
    return *outcome;
  std::lock_guard lock(mutex_);
  const Lineage* lineage = FindLineage(id);
  return DeployOutcome{DeployOutcome::Action::kUnchanged, std::string(id), file,
                       lineage->active ? lineage->active->info().number : 0,
                       file.string() + " is unchanged since its generation was loaded"};
}

Result<uint64_t> BackendRegistry::Rollback(std::string_view id) {
  std::lock_guard change(change_mutex_);
  fs::path retained;
  fs::path file;
  loader::FileIdentity identity;
  {
    std::lock_guard lock(mutex_);
    const Lineage* lineage = FindLineage(id);
    if (lineage == nullptr)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    if (lineage->is_static())
      return FailedPrecondition("backend " + std::string(id) + " is linked in (static)");
    if (lineage->rollback_file.empty() || lineage->active == nullptr)
      return FailedPrecondition("backend " + std::string(id) +
                                " has no previous generation to roll back to");
    retained = lineage->rollback_file;
    file = lineage->file;
    identity = lineage->identity.value_or(loader::FileIdentity{});
  }
  auto loaded = loader_->Load(retained);
  if (!loaded.ok()) {
    return FailedPrecondition(
        "backend " + std::string(id) +
        ": the previous version does not load again: " + loaded.error().ToString());
  }
  DeployOutcome outcome =
      Activate({std::string(id), std::move(loaded).value(), file, identity, /*rollback=*/true});
  if (outcome.action != DeployOutcome::Action::kActivated) {
    return FailedPrecondition("backend " + std::string(id) +
                              ": rollback refused: " + outcome.message);
  }
  return outcome.generation;
}

Status BackendRegistry::Pin(std::string_view id) {
  uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    if (lineage == nullptr)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    if (lineage->is_static())
      return FailedPrecondition("backend " + std::string(id) +
                                " is linked in (static): it has no generations to pin");
    lineage->pinned = true;
    generation = lineage->active ? lineage->active->info().number : 0;
  }
  Log().info("backend {} pinned to generation {}", id, generation);
  Notify({GenerationEvent::Kind::kPinned, std::string(id), generation});
  return Status::Ok();
}

Result<DeployOutcome> BackendRegistry::Unpin(std::string_view id) {
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(id);
    if (lineage == nullptr)
      return NotFound("no backend with id " + std::string(id) + " is registered");
    if (lineage->is_static())
      return FailedPrecondition("backend " + std::string(id) + " is linked in (static)");
    lineage->pinned = false;
    lineage->pinned_seen.reset();
  }
  Log().info("backend {} unpinned", id);
  Notify({GenerationEvent::Kind::kUnpinned, std::string(id)});
  return Reload(id);  // whatever was published meanwhile takes effect now
}

void BackendRegistry::OnUnloaded(const loader::GenerationInfo& generation, bool leaked) {
  std::optional<double> drain_ms;
  {
    std::lock_guard lock(mutex_);
    Lineage* lineage = FindLineage(generation.backend_id);
    GenerationRecord* record = lineage ? lineage->Record(generation.number) : nullptr;
    if (record == nullptr)
      return;  // never registered (a duplicate, an unchanged reload)
    if (record->deactivated_at) {
      drain_ms =
          std::chrono::duration<double, std::milli>(SteadyClock::now() - *record->deactivated_at)
              .count();
      record->status.drain_ms = drain_ms;
    }
    if (record->status.state != GenerationState::kRejected)
      record->status.state = leaked ? GenerationState::kLeaked : GenerationState::kUnloaded;
  }
  Notify({leaked ? GenerationEvent::Kind::kLeaked : GenerationEvent::Kind::kUnloaded,
          generation.backend_id, generation.number, generation.file, std::nullopt, "", drain_ms});
}

void BackendRegistry::Reject(loader::RejectedFile rejected) {
  Log().error("backend file {} rejected: {}: {}", rejected.file.string(),
               loader::ToString(rejected.reason), rejected.message);
  std::lock_guard lock(mutex_);
  rejected_.push_back(std::move(rejected));
  if (rejected_.size() > kRejectedLimit)
    rejected_.pop_front();
}

void BackendRegistry::Notify(const GenerationEvent& event) const {
  observers_.Notify(event);
}

uint64_t BackendRegistry::AddObserver(GenerationObserver observer) {
  return observers_.Add(std::move(observer));
}

void BackendRegistry::RemoveObserver(uint64_t observer_id) {
  observers_.Remove(observer_id);
}

Subscription BackendRegistry::Subscribe(BackendSubscriber& subscriber,
                                        const std::function<void()>& attach) {
  std::lock_guard change(change_mutex_);
  attach();
  const uint64_t id = next_subscriber_id_++;
  subscribers_.emplace(id, &subscriber);
  return Subscription(weak_from_this(), id);
}

void BackendRegistry::Unsubscribe(uint64_t subscriber_id) {
  std::lock_guard change(change_mutex_);
  subscribers_.erase(subscriber_id);
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

BackendRegistry::Lineage* BackendRegistry::FindLineage(std::string_view id) {
  for (auto& lineage : lineages_) {
    if (lineage->id == id)
      return lineage.get();
  }
  return nullptr;
}

const BackendRegistry::Lineage* BackendRegistry::FindLineage(std::string_view id) const {
  return const_cast<BackendRegistry*>(this)->FindLineage(id);
}

BackendRegistry::Lineage* BackendRegistry::FindLineageByFile(const fs::path& file) {
  for (auto& lineage : lineages_) {
    if (!lineage->is_static() && lineage->file == file)
      return lineage.get();
  }
  return nullptr;
}

fs::path BackendRegistry::RetainedCopyPath(const Lineage& lineage,
                                           const loader::GenerationInfo& generation) const {
  // Named like a backend file (the loader checks the scheme), inside the private shadow
  // directory (so a dead process's copies are cleaned with it). One per registry and id.
  return loader_->shadow_directory().path() /
         ("rollback-" + std::to_string(reinterpret_cast<uintptr_t>(this))) / lineage.id /
         generation.real_path.filename();
}

std::vector<std::string> BackendRegistry::BackendIds() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& lineage : lineages_) {
    if (lineage->offered())
      ids.push_back(lineage->id);
  }
  return ids;
}

std::optional<RegisteredBackend> BackendRegistry::Find(std::string_view id) const {
  std::lock_guard lock(mutex_);
  const Lineage* lineage = FindLineage(id);
  if (lineage == nullptr || !lineage->offered())
    return std::nullopt;
  return RegisteredBackend{lineage->id, lineage->active};
}

std::vector<loader::RejectedFile> BackendRegistry::Rejected() const {
  std::lock_guard lock(mutex_);
  return {rejected_.begin(), rejected_.end()};
}

BackendStatus BackendRegistry::DescribeLocked(const Lineage& lineage) const {
  BackendStatus status{
      .id = lineage.id,
      .is_static = lineage.is_static(),
      .active_generation = lineage.active ? lineage.active->info().number : 0,
      .pinned = lineage.pinned,
      .withdrawn = !lineage.offered() && !lineage.history.empty() &&
                   lineage.history.front().status.state != GenerationState::kRejected,
      .file = lineage.file};
  for (const auto& record : lineage.history) {
    GenerationStatus generation = record.status;
    generation.refcount = record.generation.use_count();
    status.generations.push_back(std::move(generation));
  }
  for (auto it = rejected_.rbegin(); it != rejected_.rend(); ++it) {
    if (it->backend_id == lineage.id || (!lineage.file.empty() && it->file == lineage.file))
      status.rejected.push_back(*it);
  }
  return status;
}

std::vector<BackendStatus> BackendRegistry::Describe() const {
  std::lock_guard lock(mutex_);
  std::vector<BackendStatus> statuses;
  for (const auto& lineage : lineages_)
    statuses.push_back(DescribeLocked(*lineage));
  return statuses;
}

std::optional<BackendStatus> BackendRegistry::Describe(std::string_view id) const {
  std::lock_guard lock(mutex_);
  const Lineage* lineage = FindLineage(id);
  if (lineage == nullptr)
    return std::nullopt;
  return DescribeLocked(*lineage);
}

Result<std::shared_ptr<loader::BackendInstance>> BackendRegistry::CreateInstance(
    std::string_view id) {
  std::optional<RegisteredBackend> found;
  StaticBackendFactory factory;
  {
    std::lock_guard lock(mutex_);
    const Lineage* lineage = FindLineage(id);
    if (lineage != nullptr && lineage->offered()) {
      found = RegisteredBackend{lineage->id, lineage->active};
      factory = lineage->factory;
    }
  }
  if (!found)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (!found->is_static()) {
    auto instance = loader_->CreateInstance(found->generation);
    if (!instance.ok())
      return Internal(instance.error().ToString());
    return std::move(instance).value();
  }
  // A linked-in backend: same guards, no lease.
  std::unique_ptr<IBackend> backend;
  auto created = GuardBackendCall(found->id, "static factory", [&]() -> Status {
    backend = factory();
    return Status::Ok();
  });
  if (!created.ok())
    return created;
  if (backend == nullptr)
    return Internal("static backend " + found->id + ": factory returned null");
  return loader::MakeBackendInstance(found->id, std::move(backend), nullptr, loader_->reaper());
}

}  // namespace backplane
