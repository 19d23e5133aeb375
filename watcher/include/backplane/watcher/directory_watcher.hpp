// The directory watcher: one thread running a libuv loop that turns file events in backend
// directories into "look again" calls, debounced on the leading and the trailing edge
// (docs/loading-rules.md rule 7: events are hints, not facts).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane::watcher {

struct DirectoryWatcherOptions {
  // The first event on a file name scans at once; further events on it coalesce into one more
  // scan once the name has been quiet this long (a writer that keeps writing keeps postponing
  // it). A rename onto the name scans at once again. Also the delay of `retry_soon`.
  std::chrono::milliseconds debounce{200};
  // A full scan even without events (inotify drops events silently when its queue overflows);
  // zero disables it.
  std::chrono::milliseconds rescan_interval{std::chrono::seconds(30)};
  // How often directories that cannot be watched (missing, no permission, network file
  // systems) are scanned instead.
  std::chrono::milliseconds poll_interval{std::chrono::seconds(1)};
};

// What a scan asks of the watcher.
struct ScanResult {
  // The directories to watch from now on (the backend directories and the directories their
  // symlinks point into); empty keeps the current set.
  std::vector<std::filesystem::path> directories;
  // Scan again after one debounce period even without an event (a file was still being
  // written: no event says when its writer closes it).
  bool retry_soon = false;
};

// Counters for tests and metrics. Thread-safe.
struct DirectoryWatcherStats {
  std::atomic<uint64_t> events{0};  // file events received
  std::atomic<uint64_t> scans{0};   // calls of the scan callback that returned
  std::atomic<uint64_t> rearms{0};  // directories watched again after being deleted and re-created
  std::atomic<uint64_t> polled{0};  // directories currently polled instead of watched
};

// Owns the watcher thread. Thread-safe: the public methods may be called from any thread; they
// reach the loop only through uv_async_send. The scan callback runs on the watcher thread, one
// call at a time.
class DirectoryWatcher {
 public:
  using ScanCallback = std::function<ScanResult()>;

  // Watches `directories` (each one, and its parent so that a deleted and re-created directory
  // is re-armed) and calls `scan` once at start, at once on the first event on a file name (and
  // on each rename onto it), once more after the name's later events are followed by a debounce
  // period of quiet, after a re-arm, every rescan_interval, every poll_interval while some
  // directory is polled, and on ScanNow(). Events for many names at once lead to a few scans:
  // only the first few names of a burst scan at once, the rest wait for the quiet.
  static Result<std::unique_ptr<DirectoryWatcher>> Start(
      std::vector<std::filesystem::path> directories, ScanCallback scan,
      DirectoryWatcherOptions options = {});
  // Stops the loop, closes every handle (freed in its close callback), joins the thread.
  ~DirectoryWatcher();
  DirectoryWatcher(const DirectoryWatcher&) = delete;
  DirectoryWatcher& operator=(const DirectoryWatcher&) = delete;

  // Asks for a scan as soon as possible.
  void ScanNow();

  const DirectoryWatcherStats& stats() const;

 private:
  struct Loop;  // the libuv side; lives on the watcher thread
  explicit DirectoryWatcher(std::unique_ptr<Loop> loop);
  std::unique_ptr<Loop> loop_;
};

}  // namespace backplane::watcher
