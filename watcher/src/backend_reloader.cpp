#include "backplane/watcher/backend_reloader.hpp"

namespace backplane::watcher {

Result<std::unique_ptr<BackendReloader>> BackendReloader::Start(
    std::shared_ptr<BackendRegistry> registry, DirectoryWatcherOptions options) {
  if (registry == nullptr || registry->directories().empty()) {
    return FailedPrecondition(
        "hot reload needs at least one backend directory, and this registry has none");
  }
  std::unique_ptr<BackendReloader> reloader(new BackendReloader());
  reloader->registry_ = std::move(registry);
  // The watcher is destroyed before registry_ is released, so the raw pointer outlives it.
  BackendRegistry* watched = reloader->registry_.get();
  auto watcher = DirectoryWatcher::Start(
      watched->directories(),
      [watched] {
        RescanResult rescan = watched->Rescan();
        return ScanResult{.directories = std::move(rescan.watch_directories),
                          .retry_soon = rescan.retry_soon};
      },
      options);
  if (!watcher.ok())
    return std::move(watcher).error();
  reloader->watcher_ = std::move(watcher).value();
  return reloader;
}

BackendReloader::~BackendReloader() = default;

void BackendReloader::RescanNow() {
  watcher_->ScanNow();
}

const DirectoryWatcherStats& BackendReloader::stats() const {
  return watcher_->stats();
}

}  // namespace backplane::watcher
