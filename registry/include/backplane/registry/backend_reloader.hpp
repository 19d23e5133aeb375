// Hot reload: a DirectoryWatcher over a registry's backend directories whose scans call
// BackendRegistry::Rescan, so that a backend file published into a directory becomes the active
// generation of its id while everything keeps serving.
#pragma once

#include <memory>

#include "backplane/registry/backend_registry.hpp"
#include "backplane/watcher/directory_watcher.hpp"

namespace backplane {

// Thread-safe. Stops watching when destroyed (a rescan in progress finishes first).
class BackendReloader {
 public:
  // kFailedPrecondition when the registry has no backend directory to watch.
  static Result<std::unique_ptr<BackendReloader>> Start(
      std::shared_ptr<BackendRegistry> registry, watcher::DirectoryWatcherOptions options = {});
  ~BackendReloader();

  // Asks for a rescan as soon as possible (the admin API's "reload" of a directory).
  void RescanNow();
  const watcher::DirectoryWatcherStats& stats() const;

 private:
  BackendReloader() = default;
  std::shared_ptr<BackendRegistry> registry_;
  std::unique_ptr<watcher::DirectoryWatcher>
      watcher_;  // after registry_: stops before it is released
};

}  // namespace backplane
