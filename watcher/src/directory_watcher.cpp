#include "backplane/watcher/directory_watcher.hpp"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <uv.h>

#include <cassert>
#include <cerrno>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_name.hpp"

namespace backplane::watcher {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.watcher");
  return logger;
}

// How many names of one directory may have open debounce windows for an event to still scan at
// once (see NoteFileEvent): two per publish by rename, with room for two at a time.
constexpr size_t kLeadingNames = 4;

uint64_t ToLoopMillis(milliseconds duration) {
  return duration.count() > 0 ? static_cast<uint64_t>(duration.count()) : 0;
}

// The name of the file system `directory` is on when inotify cannot be trusted there, else
// nullptr. inotify sees only changes made through this kernel's VFS: on a network file system
// another machine replaces a backend without any event here, and a FUSE daemon may do the same.
const char* RemoteFileSystemName(const std::string& directory) {
  struct statfs info {};
  if (statfs(directory.c_str(), &info) != 0)
    return nullptr;  // the watch attempt that follows reports the real problem
  // f_type magic numbers from linux/magic.h (and the file systems' own headers for the rest).
  struct Magic {
    uint32_t value;
    const char* name;
  };
  static constexpr Magic kRemote[] = {
      {0x6969, "NFS"},      {0x517B, "SMB"},       {0xFF534D42, "CIFS"},   {0xFE534D42, "SMB2"},
      {0x564C, "NCP"},      {0x65735546, "FUSE"},  {0x01021997, "9P"},     {0x00C36400, "Ceph"},
      {0x73757245, "Coda"}, {0x5346414F, "AFS"},   {0x6B414653, "kAFS"},   {0x0BD00BD0, "Lustre"},
      {0x01161970, "GFS2"}, {0x7461636F, "OCFS2"}, {0x786F4256, "vboxsf"},
  };
  // f_type is a signed word; the magics are 32-bit patterns (CIFS's is negative as an int).
  const auto type = static_cast<uint32_t>(info.f_type);
  for (const Magic& magic : kRemote) {
    if (magic.value == type)
      return magic.name;
  }
  return nullptr;
}

// Absolute and without "." / ".." / a trailing separator, so that one directory has one key and
// `parent / name` from an event rebuilds exactly that key. Symlinks are deliberately not
// resolved: the link itself may be replaced, and its parent is the one to watch for that.
std::string NormalizedKey(const fs::path& path) {
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  if (error)
    absolute = path;
  absolute = absolute.lexically_normal();
  if (!absolute.has_filename() && absolute != absolute.root_path())
    absolute = absolute.parent_path();
  return absolute.string();
}

std::string_view EventKind(int events) {
  if ((events & UV_RENAME) && (events & UV_CHANGE))
    return "rename+change";
  return (events & UV_RENAME) ? "rename" : "change";
}

// Why uv_fs_event_start failed, with the fix where the error code alone misleads.
std::string WatchFailureReason(int uv_error) {
  if (uv_error == UV_ENOSPC)
    return "the inotify watch limit is reached (raise fs.inotify.max_user_watches)";
  if (uv_error == UV_EMFILE)
    return "no inotify instance or file descriptor left (fs.inotify.max_user_instances, ulimit -n)";
  return uv_strerror(uv_error);
}

}  // namespace

// Everything libuv. Loop-thread only, except where a member says otherwise: Start() initialises
// it before the thread exists, the thread owns it while it runs, the destructor reads it after
// joining.
//
// Traps kept in mind here:
// - A handle's memory must stay valid until its close callback: heap handles are deleted there,
//   never right after uv_close.
// - libuv caches the loop's clock per iteration; after a long scan callback the cached time is
//   stale and a timer started from it fires early, hence uv_update_time after each scan.
// - inode numbers are reused: a directory deleted and re-created between two loop iterations
//   often gets the same inode number on ext4, so dev/inode alone cannot tell that the old watch is
//   dead. A create/delete/move of the directory's entry seen by the parent watch (or the
//   directory's own "deleted" event) forces a re-arm as well.
// - inotify drops events silently when its queue overflows (libuv ignores IN_Q_OVERFLOW), which is
//   why the periodic rescan exists.
struct DirectoryWatcher::Loop {
  enum class State {
    kWatched,  // an fs_event handle watches it
    kMissing,  // not there (or not a directory): looked for every poll_interval
    kPolled,   // there but cannot be watched: scanned every poll_interval
  };

  // A uv_fs_event_t on the heap, deleted by its close callback.
  struct FsEvent {
    uv_fs_event_t handle{};
    Loop* loop = nullptr;
    std::string path;
  };

  struct Directory {
    std::string path;  // the normalized key
    State state = State::kMissing;
    FsEvent* event = nullptr;  // while kWatched
    dev_t device = 0;          // of the directory `event` was armed on
    ino_t inode = 0;
    bool ever_watched = false;    // so that a later arm counts as a re-arm
    bool entry_replaced = false;  // its entry was created/deleted/moved since it was armed
    std::string warned_reason;    // the last reason logged for not watching it, to warn once
  };

  // A watch on a directory's parent, shared by the watched directories that live in it.
  struct Parent {
    FsEvent* event = nullptr;
    std::map<std::string, std::string> children;  // entry name -> watched directory key
    bool failure_logged = false;
  };

  // A name with recent events. Its window stays open until the name has been quiet for a
  // debounce period; the timer is restarted by each event on it.
  struct QuietTimer {
    uv_timer_t handle{};
    Loop* loop = nullptr;
    std::string key;        // "<directory>/<name>", or a watched directory's own key
    std::string directory;  // the watched directory `key` is a file in; empty for a directory key
    uint64_t last_event_before_scan = 0;  // scans_started when the name's last event came
  };

  Loop(ScanCallback scan_callback, DirectoryWatcherOptions watcher_options)
      : scan(std::move(scan_callback)), options(watcher_options) {}

  // Only reached with the loop still open when the thread never ran (Start failed after Init).
  ~Loop() {
    if (!loop_open)
      return;
    CloseAllHandles();
    uv_run(&uv, UV_RUN_DEFAULT);  // runs the close callbacks
    FinishLoop();
  }

  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Caller thread, before the watcher thread exists. Returns a libuv error code.
  int Init() {
    if (const int error = uv_loop_init(&uv); error != 0)
      return error;
    if (const int error = uv_async_init(&uv, &wake, OnWake); error != 0) {
      uv_loop_close(&uv);
      return error;
    }
    loop_open = true;
    wake.data = this;
    for (uv_timer_t* timer : {&scan_timer, &poll_timer, &rescan_timer}) {
      uv_timer_init(&uv, timer);
      timer->data = this;
    }
    return 0;
  }

  // The watcher thread's body.
  void Run(std::vector<fs::path> initial_directories, std::promise<void> armed) {
    NameThisThread("bp-watcher");
    SetWatchedDirectories(initial_directories);
    RequestScan(milliseconds(0));  // the initial scan, run by the loop like every other one
    armed.set_value();             // from here on no event on an existing directory is missed
    uv_run(&uv, UV_RUN_DEFAULT);   // returns once OnWake has closed every handle
    FinishLoop();
  }

  // Any thread.
  void RequestStop() {
    stop_requested.store(true, std::memory_order_release);
    uv_async_send(&wake);
  }
  void RequestScanFromAnyThread() {
    scan_requested.store(true, std::memory_order_release);
    uv_async_send(&wake);
  }

  // ---- loop thread from here on ----

  static void OnWake(uv_async_t* handle) noexcept {
    Loop& loop = *static_cast<Loop*>(handle->data);
    if (loop.stop_requested.load(std::memory_order_acquire)) {
      loop.CloseAllHandles();
      return;
    }
    // uv_async_send coalesces wake-ups; the flag is what says a scan was asked for.
    if (loop.scan_requested.exchange(false, std::memory_order_acq_rel))
      loop.RequestScan(milliseconds(0));
  }

  // Asks for a scan within `delay`; an earlier pending request wins. Every scan goes through the
  // one scan timer, so requests from events, polls, rescans and ScanNow coalesce.
  void RequestScan(milliseconds delay) {
    if (closing)
      return;
    const uint64_t delay_ms = ToLoopMillis(delay);
    if (uv_is_active(reinterpret_cast<uv_handle_t*>(&scan_timer)) &&
        uv_timer_get_due_in(&scan_timer) <= delay_ms)
      return;
    uv_timer_start(&scan_timer, OnScanTimer, delay_ms, 0);
  }

  static void OnScanTimer(uv_timer_t* handle) noexcept {
    static_cast<Loop*>(handle->data)->RunScan();
  }

  void RunScan() {
    uv_timer_stop(&scan_timer);
    ++scans_started;  // events from here on are not seen by this scan
    std::optional<ScanResult> result;
    try {
      result = scan();
    } catch (const std::exception& error) {
      Log().error("the directory scan failed: {}; the watcher carries on", error.what());
    } catch (...) {
      Log().error(
          "the directory scan failed with a non-standard exception; the watcher carries on");
    }
    uv_update_time(&uv);  // the callback may have run long: see the trap above
    // The periodic rescan counts from the last scan, so that a busy directory is not rescanned
    // for nothing; after a failed scan it is also the retry.
    if (options.rescan_interval.count() > 0)
      uv_timer_start(&rescan_timer, OnRescanTimer, ToLoopMillis(options.rescan_interval), 0);
    if (!result)
      return;
    if (!result->directories.empty())
      SetWatchedDirectories(result->directories);
    if (result->retry_soon)
      RequestScan(options.debounce);
    // Last, so that whoever sees the count also sees the watched set the scan asked for.
    stats.scans.fetch_add(1, std::memory_order_release);
  }

  static void OnRescanTimer(uv_timer_t* handle) noexcept {
    static_cast<Loop*>(handle->data)->RequestScan(milliseconds(0));
  }

  // Replaces the watched set. Directories already watched keep their handles (and their pending
  // events); no scan is requested: the scan that asked for the set has just looked at it.
  void SetWatchedDirectories(const std::vector<fs::path>& paths) {
    std::set<std::string> wanted;
    for (const fs::path& path : paths) {
      if (!path.empty())
        wanted.insert(NormalizedKey(path));
    }
    for (auto it = directories.begin(); it != directories.end();) {
      if (wanted.contains(it->first)) {
        ++it;
        continue;
      }
      Log().info("no longer watching backend directory {}", it->first);
      Forget(it->second);
      it = directories.erase(it);
    }
    for (const std::string& key : wanted) {
      auto [it, inserted] = directories.try_emplace(key);
      if (!inserted)
        continue;
      it->second.path = key;
      Log().debug("watching backend directory {}", key);
      CheckDirectory(it->second);
    }
    UpdatePolling();
  }

  // Stops everything about `directory` before it leaves the set.
  void Forget(Directory& directory) {
    CloseFsEvent(directory.event);
    const std::string parent_key = fs::path(directory.path).parent_path().string();
    auto parent = parents.find(parent_key);
    if (parent == parents.end())
      return;
    parent->second.children.erase(fs::path(directory.path).filename().string());
    if (parent->second.children.empty()) {
      CloseFsEvent(parent->second.event);
      parents.erase(parent);
    }
  }

  // Looks at `directory` as it is now and watches it if it should be. True when it was (re-)armed,
  // which calls for a scan: files may have arrived while nothing watched.
  bool CheckDirectory(Directory& directory) {
    WatchParent(directory);
    struct stat info {};
    std::string missing_reason;
    if (stat(directory.path.c_str(), &info) != 0)
      missing_reason = std::error_code(errno, std::generic_category()).message();
    else if (!S_ISDIR(info.st_mode))
      missing_reason = "not a directory";
    if (!missing_reason.empty()) {
      CloseFsEvent(directory.event);
      directory.state = State::kMissing;
      WarnNotWatched(directory, missing_reason);
      UpdatePolling();
      return false;
    }
    if (directory.state == State::kWatched && !directory.entry_replaced &&
        info.st_dev == directory.device && info.st_ino == directory.inode)
      return false;  // the watch we have is on this very directory
    return Arm(directory, info);
  }

  bool Arm(Directory& directory, const struct stat& info) {
    // Closed first: when the inode is the same and its watch still alive, libuv then simply
    // adds a new inotify watch; when the watch died with the old directory, removing it is a no-op.
    CloseFsEvent(directory.event);
    std::string reason;
    if (const char* remote = RemoteFileSystemName(directory.path)) {
      reason = std::string("it is on a ") + remote +
               " file system, where inotify misses changes made elsewhere";
    } else {
      int error = 0;
      directory.event = StartFsEvent(directory.path, OnDirectoryEvent, &error);
      if (directory.event == nullptr)
        reason = "cannot watch it: " + WatchFailureReason(error);
    }
    if (!reason.empty()) {
      directory.state = State::kPolled;
      WarnNotWatched(directory, reason);
      UpdatePolling();
      return false;
    }
    const bool rearm = directory.ever_watched;
    directory.state = State::kWatched;
    directory.device = info.st_dev;
    directory.inode = info.st_ino;
    directory.entry_replaced = false;
    directory.ever_watched = true;
    if (rearm)
      Log().info("backend directory {} was replaced; watching the new one", directory.path);
    else if (!directory.warned_reason.empty())
      Log().info("backend directory {} is watched now", directory.path);
    directory.warned_reason.clear();
    UpdatePolling();
    // After `polled`, so that whoever sees the re-arm counted also sees the directory watched.
    if (rearm)
      stats.rearms.fetch_add(1, std::memory_order_release);
    return true;
  }

  void WarnNotWatched(Directory& directory, const std::string& reason) {
    if (directory.warned_reason == reason)
      return;  // warn once per reason, not once per poll
    directory.warned_reason = reason;
    if (directory.state == State::kMissing) {
      Log().warn("backend directory {} is not there ({}); looking for it every {} ms",
                 directory.path, reason, options.poll_interval.count());
    } else {
      Log().warn("backend directory {} is polled: {}; scanning it every {} ms", directory.path,
                 reason, options.poll_interval.count());
    }
  }

  // The parent watch is what sees the directory deleted and re-created (its own watch dies with
  // it). Without one (parent missing or unwatchable) re-creation is still found by polling.
  void WatchParent(const Directory& directory) {
    const fs::path path(directory.path);
    const fs::path parent_path = path.parent_path();
    if (parent_path.empty() || parent_path == path)
      return;  // the root has no parent to watch
    Parent& parent = parents[parent_path.string()];
    parent.children[path.filename().string()] = directory.path;
    if (parent.event != nullptr)
      return;
    int error = 0;
    parent.event = StartFsEvent(parent_path.string(), OnParentEvent, &error);
    if (parent.event == nullptr && !parent.failure_logged) {
      parent.failure_logged = true;
      Log().debug(
          "cannot watch {}, the parent of backend directory {}: {}; a re-created {} is "
          "found by polling only",
          parent_path.string(), directory.path, WatchFailureReason(error), directory.path);
    }
  }

  void UpdatePolling() {
    uint64_t not_watched = 0;
    for (const auto& [key, directory] : directories) {
      if (directory.state != State::kWatched)
        ++not_watched;
    }
    stats.polled.store(not_watched, std::memory_order_relaxed);
    if (closing)
      return;
    const bool active = uv_is_active(reinterpret_cast<uv_handle_t*>(&poll_timer));
    if (not_watched > 0 && !active) {
      const uint64_t interval = ToLoopMillis(options.poll_interval);
      uv_timer_start(&poll_timer, OnPollTimer, interval, interval);
    } else if (not_watched == 0 && active) {
      uv_timer_stop(&poll_timer);
    }
  }

  static void OnPollTimer(uv_timer_t* handle) noexcept {
    Loop& loop = *static_cast<Loop*>(handle->data);
    bool scan_needed = false;
    for (auto& [key, directory] : loop.directories) {
      if (directory.state == State::kWatched)
        continue;
      if (loop.CheckDirectory(directory))
        scan_needed = true;  // appeared (or became watchable): look at what is in it
      if (directory.state == State::kPolled)
        scan_needed = true;  // events cannot tell us, so look
    }
    if (scan_needed)
      loop.RequestScan(milliseconds(0));
  }

  // Events on a watched directory: the name's window (NoteFileEvent), and for events on the
  // directory itself its quiet timer.
  static void OnDirectoryEvent(uv_fs_event_t* handle, const char* filename, int events,
                               int status) noexcept {
    auto* watch = static_cast<FsEvent*>(handle->data);
    Loop& loop = *watch->loop;
    if (status < 0) {
      Log().warn("watch on backend directory {} failed: {}; checking it again", watch->path,
                 uv_strerror(status));
      loop.RestartQuietTimer(watch->path);
      return;
    }
    loop.stats.events.fetch_add(1, std::memory_order_relaxed);
    const std::string name = filename != nullptr ? filename : "";
    Log().debug("file event: {} {} in {}", EventKind(events), name, watch->path);
    // Events on the directory itself (deleted, moved away) carry no name in inotify; libuv passes
    // the directory's own base name instead. A file of that name inside looks the same; mistaking
    // it costs one needless re-arm.
    const fs::path path(watch->path);
    if (name.empty() || ((events & UV_RENAME) && name == path.filename().string())) {
      if (auto directory = loop.directories.find(watch->path); directory != loop.directories.end())
        directory->second.entry_replaced = true;
      loop.RestartQuietTimer(watch->path);
      if (name.empty())
        return;
    }
    loop.NoteFileEvent(watch->path, (path / name).string(), events);
  }

  // Events in a parent directory: only those on a watched directory's own entry matter; the rest
  // (siblings, often a busy /tmp or /opt) are dropped without a log line.
  static void OnParentEvent(uv_fs_event_t* handle, const char* filename, int events,
                            int status) noexcept {
    auto* watch = static_cast<FsEvent*>(handle->data);
    Loop& loop = *watch->loop;
    if (status < 0 || filename == nullptr)
      return;
    auto parent = loop.parents.find(watch->path);
    if (parent == loop.parents.end())
      return;
    auto child = parent->second.children.find(filename);
    if (child == parent->second.children.end())
      return;
    loop.stats.events.fetch_add(1, std::memory_order_relaxed);
    Log().debug("file event: {} {} in {}", EventKind(events), filename, watch->path);
    if (events & UV_RENAME) {
      if (auto directory = loop.directories.find(child->second);
          directory != loop.directories.end())
        directory->second.entry_replaced = true;
    }
    loop.RestartQuietTimer(child->second);  // the directory is checked once things are quiet
  }

  // Debounce, leading and trailing edge. The first event on a file name scans at once: a rename
  // (or `ln -sfn`) publishes a complete file, and waiting out the debounce only delays the
  // deploy. A file still being written does not make this early scan unsafe: the scan checks
  // completeness itself (lease probe, fstat before and after the copy, complete-ELF check), takes
  // an unfinished file as a deferral, not a rejection, and asks for `retry_soon`. Further events on
  // the name within its window coalesce into one trailing scan once the name has been quiet for the
  // debounce period, so a writer that keeps writing gets a scan after it stops, and a burst of
  // writes to one name leads to at most two scans.
  //
  // A RENAME event (created, deleted, moved in or out: the entry itself changed) scans at once
  // even inside the window: a deploy script renaming new versions over one name in quick
  // succession gets each one seen. Writes (CHANGE) cannot say when the writer is done, which is
  // what the window waits for.
  //
  // Many names at once (1000 files copied in) must not lead to a scan each: once more than
  // kLeadingNames names of a directory have open windows, its events only wait for the trailing
  // scan. A publish by rename touches two names (the temporary one and the target).
  void NoteFileEvent(const std::string& directory, const std::string& key, int events) {
    if (closing)
      return;
    auto [timer, opened] = OpenWindow(key, directory);
    const bool replaced = (events & UV_RENAME) != 0;
    if ((opened || replaced) && open_windows[directory] <= kLeadingNames)
      RequestScan(milliseconds(0));
    timer->last_event_before_scan = scans_started;
    uv_timer_start(&timer->handle, OnQuiet, ToLoopMillis(options.debounce), 0);
  }

  // For a watched directory's own key (deleted, moved, re-created, its watch failed): checked
  // and scanned once things are quiet, as before; only a quiet directory is worth re-arming.
  void RestartQuietTimer(const std::string& key) {
    if (closing)
      return;
    QuietTimer* timer = OpenWindow(key, "").first;
    timer->last_event_before_scan = scans_started;
    uv_timer_start(&timer->handle, OnQuiet, ToLoopMillis(options.debounce), 0);
  }

  // The window of `key`, created when there is none (the bool says so).
  std::pair<QuietTimer*, bool> OpenWindow(const std::string& key, const std::string& directory) {
    auto [it, inserted] = quiet_timers.try_emplace(key, nullptr);
    if (inserted) {
      auto* timer = new QuietTimer;
      timer->loop = this;
      timer->key = key;
      timer->directory = directory;
      uv_timer_init(&uv, &timer->handle);
      timer->handle.data = timer;
      it->second = timer;
      if (!directory.empty())
        ++open_windows[directory];
    }
    return {it->second, inserted};
  }

  // True when a scan started after the name's last event, so that scan saw what the event did.
  bool Seen(const QuietTimer& timer) const { return scans_started > timer.last_event_before_scan; }

  static void OnQuiet(uv_timer_t* handle) noexcept {
    auto* timer = static_cast<QuietTimer*>(handle->data);
    Loop& loop = *timer->loop;
    const std::string key = timer->key;
    const bool seen = loop.Seen(*timer);
    if (!timer->directory.empty()) {
      if (auto open = loop.open_windows.find(timer->directory); --open->second == 0)
        loop.open_windows.erase(open);
    }
    loop.quiet_timers.erase(key);
    CloseAndDelete(timer);
    // A watched directory's key (possibly also a name in another watched directory) is checked
    // and scanned whatever the scans since: its events say the watch itself may be dead.
    if (auto directory = loop.directories.find(key); directory != loop.directories.end())
      loop.CheckDirectory(directory->second);
    else if (seen)
      return;  // the leading scan (or a later one) came after the last event: nothing new
    // Coalescing: names that went quiet at about the same time (1000 files copied at once) must
    // lead to one scan, not one each. Timers due in this pass all run before a 0-ms timer
    // started now; names still waiting for a scan are waited for, but at most one more debounce
    // period, so that one file written forever does not starve the others.
    bool others_waiting = false;
    for (const auto& [other_key, other] : loop.quiet_timers) {
      if (!loop.Seen(*other)) {
        others_waiting = true;
        break;
      }
    }
    loop.RequestScan(others_waiting ? loop.options.debounce : milliseconds(0));
  }

  FsEvent* StartFsEvent(const std::string& path, uv_fs_event_cb callback, int* error) {
    auto* watch = new FsEvent;
    watch->loop = this;
    watch->path = path;
    uv_fs_event_init(&uv, &watch->handle);
    watch->handle.data = watch;
    *error = uv_fs_event_start(&watch->handle, callback, path.c_str(), 0);
    if (*error != 0) {
      CloseAndDelete(watch);
      return nullptr;
    }
    return watch;
  }

  static void CloseFsEvent(FsEvent*& watch) {
    if (watch == nullptr)
      return;
    CloseAndDelete(watch);
    watch = nullptr;
  }

  // Hands `wrapper` to libuv, which calls back once it no longer touches the handle; the memory
  // goes there and not before.
  template <typename Wrapper>
  static void CloseAndDelete(Wrapper* wrapper) {
    uv_close(reinterpret_cast<uv_handle_t*>(&wrapper->handle),
             [](uv_handle_t* handle) noexcept { delete static_cast<Wrapper*>(handle->data); });
  }

  // Shutdown: after this no handle is active, so uv_run returns once the close callbacks ran.
  void CloseAllHandles() {
    closing = true;
    for (auto& [key, directory] : directories)
      CloseFsEvent(directory.event);
    directories.clear();
    for (auto& [key, parent] : parents)
      CloseFsEvent(parent.event);
    parents.clear();
    for (auto& [key, timer] : quiet_timers)
      CloseAndDelete(timer);
    quiet_timers.clear();
    open_windows.clear();
    // Members of Loop: their memory outlives the loop, so no close callback is needed.
    for (uv_timer_t* timer : {&scan_timer, &poll_timer, &rescan_timer})
      uv_close(reinterpret_cast<uv_handle_t*>(timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wake), nullptr);
  }

  void FinishLoop() {
    int error = uv_loop_close(&uv);
    if (error == UV_EBUSY) {
      // A handle this file forgot: a bug, but closing it beats leaving libuv with dangling memory.
      Log().error("directory watcher: libuv handles still open at shutdown; closing them");
      uv_walk(
          &uv,
          [](uv_handle_t* handle, void*) noexcept {
            if (!uv_is_closing(handle))
              uv_close(handle, nullptr);
          },
          nullptr);
      uv_run(&uv, UV_RUN_DEFAULT);
      error = uv_loop_close(&uv);
    }
    assert(error == 0 && "uv_loop_close failed after closing every handle");
    loop_open = false;
  }

  const ScanCallback scan;
  const DirectoryWatcherOptions options;
  DirectoryWatcherStats stats;  // any thread (atomics)

  // Set by other threads, read by OnWake.
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> scan_requested{false};

  uv_loop_t uv{};
  bool loop_open = false;
  bool closing = false;
  uv_async_t wake{};  // the only way in from other threads
  uv_timer_t scan_timer{};
  uv_timer_t poll_timer{};
  uv_timer_t rescan_timer{};

  std::map<std::string, Directory> directories;               // by normalized path
  std::map<std::string, Parent> parents;                      // by parent path
  std::unordered_map<std::string, QuietTimer*> quiet_timers;  // the open windows, by key
  std::unordered_map<std::string, size_t> open_windows;       // file windows per directory
  uint64_t scans_started = 0;

  std::thread thread;  // runs Run(); joined by ~DirectoryWatcher
};

Result<std::unique_ptr<DirectoryWatcher>> DirectoryWatcher::Start(
    std::vector<std::filesystem::path> directories, ScanCallback scan,
    DirectoryWatcherOptions options) {
  if (!scan)
    return InvalidArgument("DirectoryWatcher::Start: the scan callback is empty");
  if (options.debounce.count() < 0 || options.rescan_interval.count() < 0 ||
      options.poll_interval.count() <= 0)
    return InvalidArgument(
        "DirectoryWatcher::Start: debounce and rescan_interval must not be negative and "
        "poll_interval must be positive");

  auto loop = std::make_unique<Loop>(std::move(scan), options);
  if (const int error = loop->Init(); error != 0)
    return Internal(std::string("DirectoryWatcher::Start: cannot create the libuv event loop: ") +
                    uv_strerror(error));

  std::promise<void> armed;
  std::future<void> armed_future = armed.get_future();
  try {
    loop->thread = std::thread(&Loop::Run, loop.get(), std::move(directories), std::move(armed));
  } catch (const std::system_error& error) {
    // ~Loop closes the handles and the loop on this thread; the watcher thread never ran.
    return Internal(std::string("DirectoryWatcher::Start: cannot start the watcher thread: ") +
                    error.what());
  }
  // Waiting for the watches makes "Start returned" mean "changes from now on are seen", which is
  // what callers (and tests) expect; the initial scan itself is not waited for.
  armed_future.wait();
  return std::unique_ptr<DirectoryWatcher>(new DirectoryWatcher(std::move(loop)));
}

DirectoryWatcher::DirectoryWatcher(std::unique_ptr<Loop> loop) : loop_(std::move(loop)) {}

DirectoryWatcher::~DirectoryWatcher() {
  // Destroying the watcher from its own scan callback would join the thread from itself.
  assert(std::this_thread::get_id() != loop_->thread.get_id() &&
         "a DirectoryWatcher must not be destroyed from its scan callback");
  loop_->RequestStop();
  loop_->thread.join();  // waits for a scan in progress, then for every handle to be closed
}

void DirectoryWatcher::ScanNow() {
  loop_->RequestScanFromAnyThread();
}

const DirectoryWatcherStats& DirectoryWatcher::stats() const {
  return loop_->stats;
}

}  // namespace backplane::watcher
