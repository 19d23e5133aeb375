#include "backplane/registry/backend_reloader.hpp"

namespace backplane {

Result<std::unique_ptr<BackendReloader>> BackendReloader::Start(
    std::shared_ptr<BackendRegistry> registry, watcher::DirectoryWatcherOptions options) {
  if (registry == nullptr || registry->directories().empty()) {
    return FailedPrecondition(
        "hot reload needs at least one backend directory, and this registry has none");
  }
  std::unique_ptr<BackendReloader> reloader(new BackendReloader());
  reloader->registry_ = std::move(registry);
  // The watcher is destroyed before registry_ is released, so the raw pointer outlives it.
  BackendRegistry* watched = reloader->registry_.get();
  auto started = watcher::DirectoryWatcher::Start(
      watched->directories(),
      [watched] {
        RescanResult rescan = watched->Rescan();
        return watcher::ScanResult{.directories = std::move(rescan.watch_directories),
                                   .retry_soon = rescan.retry_soon};
      },
      options);
  if (!started.ok())
    return std::move(started).error();
  reloader->watcher_ = std::move(started).value();
  return reloader;
}

BackendReloader::~BackendReloader() = default;

void BackendReloader::RescanNow() {
  watcher_->ScanNow();
}

const watcher::DirectoryWatcherStats& BackendReloader::stats() const {
  return watcher_->stats();
}

}  // namespace backplane
