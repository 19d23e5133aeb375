// Runtime: the embedder's entry point (ArmNN's IRuntime). Holds one instance of every available
// backend, created by that backend's factory for this runtime alone; runtimes share the loaded
// libraries through the registry and the loader.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/backend_registry.hpp"
#include "backplane/loader/backend_instance.hpp"

namespace backplane {

struct RuntimeOptions {
  // Backend directories; nullopt means DefaultBackendPaths(). Ignored when `registry` is given.
  std::optional<std::vector<std::filesystem::path>> backend_paths;
  // false: only static (linked-in) backends. Ignored when `registry` is given.
  bool dynamic_backends = true;
  // Options per backend id, applied right after each instance is created. An id that no backend
  // has, an unknown key or a wrong type fails Create.
  std::map<std::string, BackendOptions, std::less<>> backend_options;
  // Share a registry between runtimes; null creates one from the fields above.
  std::shared_ptr<BackendRegistry> registry;
};

// Thread-safe.
class Runtime {
 public:
  // Fails (kFailedPrecondition) when no backend is available at all: a runtime that cannot run
  // anything is a configuration error best reported at once.
  static Result<std::unique_ptr<Runtime>> Create(RuntimeOptions options = {});
  ~Runtime();

  std::vector<std::string> BackendIds() const;
  // This runtime's instance of backend `id`, or null.
  std::shared_ptr<loader::BackendInstance> Backend(std::string_view id) const;

  // Validated by the backend: an unknown key or a wrong type applies nothing.
  Status UpdateBackendOptions(std::string_view id, const BackendOptions& changes);

  const BackendRegistry& registry() const { return *registry_; }

 private:
  struct BackendSlot {
    std::shared_ptr<loader::BackendInstance> instance;
    std::unique_ptr<IBackendContext> context;  // destroyed before the instance (declared after)
  };
  explicit Runtime(std::shared_ptr<BackendRegistry> registry);

  const std::shared_ptr<BackendRegistry> registry_;
  std::map<std::string, BackendSlot, std::less<>> backends_;  // immutable after Create
};

}  // namespace backplane
