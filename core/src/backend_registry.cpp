#include "backplane/core/backend_registry.hpp"

#include <cstdlib>

#include "backplane/loader/logging.hpp"

namespace backplane {
namespace fs = std::filesystem;
using loader::LoadError;
using loader::LoadReason;

namespace {

const auto& Log() {
  static const auto logger = ModuleLogger("backplane.registry");
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
    Log()->info("dynamic backend loading is disabled by configuration");
  } else {
    const auto paths = options.backend_paths.value_or(DefaultBackendPaths());
    directories = loader::ValidBackendDirectories(paths);
    if (paths.empty()) {
      Log()->info("dynamic backend loading is disabled (the backend path list is empty)");
    } else if (directories.empty()) {
      Log()->warn("no dynamic backends: none of the {} backend path(s) is a usable directory",
                  paths.size());
    }
  }
  std::shared_ptr<BackendRegistry> registry(
      new BackendRegistry(std::move(shared_loader), std::move(directories)));

  {
    auto& list = StaticBackends();
    std::vector<std::pair<std::string, StaticBackendFactory>> statics;
    {
      std::lock_guard lock(list.mutex);
      statics = list.backends;
    }
    for (auto& [id, factory] : statics) {
      if (Status status = registry->RegisterStatic(id, factory); !status.ok()) {
        Log()->error("static backend {} not registered: {}", id, status.message());
      }
    }
  }

  if (!registry->directories_.empty()) {
    auto discovery = loader::DiscoverBackendFiles(registry->directories_,
                                                  registry->loader_->options().file_policy);
    for (auto& rejected : discovery.rejected)
      registry->Reject(std::move(rejected));
    for (const auto& file : discovery.files) {
      (void)registry->LoadFile(file.path);  // failures are recorded and logged by LoadFile
    }
  }
  return registry;
}

BackendRegistry::BackendRegistry(std::shared_ptr<loader::Loader> loader,
                                 std::vector<fs::path> directories)
    : loader_(std::move(loader)), directories_(std::move(directories)) {}

Status BackendRegistry::RegisterStatic(std::string id, StaticBackendFactory factory) {
  if (id.empty())
    return InvalidArgument("a static backend needs a non-empty id");
  if (!factory)
    return InvalidArgument("static backend " + id + " has no factory");
  std::lock_guard lock(mutex_);
  for (const auto& entry : entries_) {
    if (entry.backend.id == id) {
      return {StatusCode::kAlreadyExists, "backend id " + id + " is already registered"};
    }
  }
  entries_.push_back({RegisteredBackend{id, nullptr}, std::move(factory)});
  Log()->info("registered static backend {}", id);
  return Status::Ok();
}

loader::LoadResult<RegisteredBackend> BackendRegistry::LoadFile(const fs::path& file,
                                                                loader::LoadTrace* trace) {
  auto fail = [&](LoadError error) {
    Reject({file, error.reason, error.message});
    return error;
  };
  auto generation = loader_->Load(file, trace);
  if (!generation.ok())
    return fail(std::move(generation).error());

  const auto& info = generation.value()->info();
  std::optional<LoadError> duplicate;
  {
    std::lock_guard lock(mutex_);
    for (const auto& entry : entries_) {
      if (entry.backend.id != info.backend_id)
        continue;
      const bool same_file =
          entry.backend.generation && entry.backend.generation->info().real_path == info.real_path;
      duplicate =
          LoadError{LoadReason::kDuplicateId,
                    file.string() + " provides backend id " + info.backend_id + ", which " +
                        (same_file ? "this registry has loaded from this very file already"
                                   : "is already registered from " +
                                         (entry.backend.is_static()
                                              ? std::string("a static (linked-in) backend")
                                              : entry.backend.generation->info().file.string())) +
                        "; the first registration wins"};
      break;
    }
    if (!duplicate) {
      entries_.push_back({RegisteredBackend{info.backend_id, generation.value()}, nullptr});
    }
  }
  if (duplicate) {
    if (trace != nullptr)
      trace->Add({"register", false, duplicate->message});
    // The lease is released here; the reaper unloads the library unless another registry uses it.
    return fail(*std::move(duplicate));
  }
  if (trace != nullptr)
    trace->Add({"register", true, "backend id " + info.backend_id});
  Log()->info("registered backend {} generation {} from {} (API {}.{}{}{})", info.backend_id,
              info.number, file.string(), info.api_version.major, info.api_version.minor,
              info.release.empty() ? "" : ", release ", info.release);
  return RegisteredBackend{info.backend_id, std::move(generation).value()};
}

void BackendRegistry::Reject(loader::RejectedFile rejected) {
  Log()->error("backend file {} rejected: {}: {}", rejected.file.string(),
               loader::ToString(rejected.reason), rejected.message);
  std::lock_guard lock(mutex_);
  rejected_.push_back(std::move(rejected));
}

std::vector<std::string> BackendRegistry::BackendIds() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& entry : entries_)
    ids.push_back(entry.backend.id);
  return ids;
}

std::optional<RegisteredBackend> BackendRegistry::Find(std::string_view id) const {
  std::lock_guard lock(mutex_);
  for (const auto& entry : entries_) {
    if (entry.backend.id == id)
      return entry.backend;
  }
  return std::nullopt;
}

std::vector<loader::RejectedFile> BackendRegistry::Rejected() const {
  std::lock_guard lock(mutex_);
  return rejected_;
}

Result<std::shared_ptr<loader::BackendInstance>> BackendRegistry::CreateInstance(
    std::string_view id) {
  std::optional<Entry> found;
  {
    std::lock_guard lock(mutex_);
    for (const auto& entry : entries_) {
      if (entry.backend.id == id)
        found = entry;
    }
  }
  if (!found)
    return NotFound("no backend with id " + std::string(id) + " is registered");
  if (!found->backend.is_static()) {
    auto instance = loader_->CreateInstance(found->backend.generation);
    if (!instance.ok())
      return Internal(instance.error().ToString());
    return std::move(instance).value();
  }
  // A linked-in backend: same guards, no lease.
  std::unique_ptr<IBackend> backend;
  auto created = loader::GuardBackendCall(found->backend.id, "static factory", [&]() -> Status {
    backend = found->factory();
    return Status::Ok();
  });
  if (!created.ok())
    return created;
  if (backend == nullptr) {
    return Internal("static backend " + found->backend.id + ": factory returned null");
  }
  return loader::MakeBackendInstance(found->backend.id, std::move(backend), nullptr,
                                     loader_->reaper());
}

}  // namespace backplane
