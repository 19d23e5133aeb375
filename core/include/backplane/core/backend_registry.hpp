// The backend registry: which backend ids exist, where each comes from (linked in, or a loaded
// generation of a file), and every file that was rejected with its reason.
#pragma once

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

// One registered backend id.
struct RegisteredBackend {
  std::string id;
  loader::GenerationLease generation;  // null for a static backend
  bool is_static() const { return generation == nullptr; }
};

// Thread-safe. Never calls backend code while holding its lock.
class BackendRegistry {
 public:
  // Registers the static backends, then discovers and loads the backend files of the configured
  // directories in order; files that fail are kept in Rejected() and logged, never fatal.
  static Result<std::shared_ptr<BackendRegistry>> Create(BackendRegistryOptions options = {});

  // kInvalidArgument for an empty id or null factory, kAlreadyExists for a registered id.
  Status RegisterStatic(std::string id, StaticBackendFactory factory);

  // Loads one backend file and registers its id. kDuplicateId when the id is registered already
  // (the first registration wins) or when this very file is loaded already. Failures are also
  // recorded in Rejected().
  loader::LoadResult<RegisteredBackend> LoadFile(const std::filesystem::path& file,
                                                 loader::LoadTrace* trace = nullptr);

  std::vector<std::string> BackendIds() const;  // in registration order
  std::optional<RegisteredBackend> Find(std::string_view id) const;
  std::vector<loader::RejectedFile> Rejected() const;
  const std::vector<std::filesystem::path>& directories() const { return directories_; }

  // A new instance of backend `id` for one runtime (the factory is called every time).
  Result<std::shared_ptr<loader::BackendInstance>> CreateInstance(std::string_view id);

  loader::Loader& loader() const { return *loader_; }

 private:
  BackendRegistry(std::shared_ptr<loader::Loader> loader,
                  std::vector<std::filesystem::path> directories);
  void Reject(loader::RejectedFile rejected);

  const std::shared_ptr<loader::Loader> loader_;
  const std::vector<std::filesystem::path> directories_;

  struct Entry {
    RegisteredBackend backend;
    StaticBackendFactory factory;  // static backends only
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;                  // guarded by mutex_
  std::vector<loader::RejectedFile> rejected_;  // guarded by mutex_
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
