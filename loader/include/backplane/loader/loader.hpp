// The loader: turns a backend file into a generation, stage by stage, refusing what the loading
// rules (docs/loading-rules.md) say would crash or leak.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backplane/core/listener_list.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/backend_file.hpp"
#include "backplane/loader/backend_instance.hpp"
#include "backplane/loader/generation.hpp"
#include "backplane/loader/reaper.hpp"
#include "backplane/loader/sealed_image.hpp"
#include "backplane/loader/shadow_directory.hpp"
#include "backplane/loader/trust.hpp"

namespace backplane::loader {

struct LoaderOptions {
  // The backend API the host implements; tests pretend to be other hosts.
  BackendApiVersion host_api = kBackendApiVersion;
  FilePolicy file_policy;
  std::filesystem::path shadow_root;  // empty: see ShadowDirectory::Create
  // A larger backend file is refused (TOO_LARGE) before it is read: every load reads the whole
  // file into memory, so a sparse or endless file must cost a bounded read.
  uint64_t max_file_bytes = SealedImage::kDefaultMaxBytes;
  // A backend file not opened and read by then fails to load (IO_ERROR) instead of holding the
  // registry's change sequence for as long as a stalled file system takes.
  std::chrono::milliseconds read_timeout = SealedImage::kDefaultReadTimeout;
  // Runs checked generations out of process when it says so (isolation::MakeWorkerRunner);
  // empty: every generation is mapped here.
  OutOfProcessRunner out_of_process;
};

// What GetBackendId may return: 1 to 64 letters, digits, '_', '-' or '.'.
bool IsValidBackendId(std::string_view id);

// One line of `backplane check`: a loading stage and how it went.
struct LoadStage {
  std::string name;  // "file", "permissions", "copy", "elf", "dependencies", "dlopen", ...
  bool ok = false;
  std::string detail;    // what was found, or the error message
  bool warning = false;  // ok, but not as backplane_add_backend() builds it (detail says why)
};
struct LoadTrace {
  std::vector<LoadStage> stages;
  // Called as each stage ends, before the next one starts (`check` streams stages to survive a
  // backend that crashes the process in its constructors or factory).
  std::function<void(const LoadStage&)> on_stage;

  void Add(LoadStage stage) {
    if (on_stage)
      on_stage(stage);
    stages.push_back(std::move(stage));
  }
};

// Counters for metrics and tests, and who to tell when a generation leaves. Thread-safe.
class LoaderStats {
 public:
  std::atomic<uint64_t> loaded{0};    // generations mapped
  std::atomic<uint64_t> unloaded{0};  // generations verified gone after dlclose
  std::atomic<uint64_t> leaked{0};    // generations still mapped after dlclose
  std::atomic<uint64_t> live{0};      // generations not yet destroyed

  // Told on the reaper thread once a generation is closed; `leaked` when glibc kept it mapped.
  // Must not block.
  ListenerList<GenerationInfo, bool> unload_listeners{"unload listener"};
};

// Thread-safe. Shared by every registry and runtime of a process (Shared()), so that a file is
// mapped once however many runtimes use it.
class Loader : public std::enable_shared_from_this<Loader> {
 public:
  static Result<std::shared_ptr<Loader>> Create(LoaderOptions options = {});
  // The process-wide loader with default options, created on first use and destroyed when the
  // last user releases it.
  static Result<std::shared_ptr<Loader>> Shared();

  // Whether Load may hand out a live generation of the same unchanged file (same real path and
  // identity) instead of mapping it again.
  enum class Reuse {
    kLiveUnchanged,  // share: runtimes of separate registries map one copy
    // Always a new generation. A registry designating again a file that one of its own draining
    // generations came from asks for this: re-activation is a new generation, never an old
    // record brought back to life.
    kNever,
  };
  // Where the generation's code runs.
  enum class Placement {
    kAsConfigured,  // as LoaderOptions::out_of_process decides (in this process without one)
    // In a worker process whatever the backend id (a rollout candidate tried in a sandbox):
    // never shared with, nor reused by, a load as configured. kFailedPrecondition without an
    // out_of_process runner.
    kWorker,
  };

  // Loads `file` as a new generation, or (kLiveUnchanged) returns the live generation of the same
  // unchanged file. With `trace`, appends one LoadStage per stage run. The factory is
  // probed once (an instance created and destroyed) so that a broken factory fails here.
  // With `trust`, the content must pass it (stage "trust", UNTRUSTED otherwise): asked with the
  // digest of the sealed copy, before the copy is inspected or mapped; a live generation that
  // would be shared is asked about too, since the policies of callers differ.
  Result<GenerationLease> Load(const std::filesystem::path& file, LoadTrace* trace = nullptr,
                               Reuse reuse = Reuse::kLiveUnchanged,
                               const TrustPolicy* trust = nullptr,
                               Placement placement = Placement::kAsConfigured)
      BACKPLANE_EXCLUDES(mutex_);

  // A new instance from `generation`'s factory; kFactoryFailed when it throws or returns null
  // (with the backend's own message when it has GetBackendFactoryError), kInvalidId when the
  // instance reports another id than GetBackendId.
  Result<std::shared_ptr<BackendInstance>> CreateInstance(const GenerationLease& generation);

  const LoaderOptions& options() const { return options_; }
  const std::shared_ptr<Reaper>& reaper() const { return reaper_; }
  const LoaderStats& stats() const { return *stats_; }
  LoaderStats& stats() { return *stats_; }
  const ShadowDirectory& shadow_directory() const { return *shadows_; }

  // Blocks until every generation released so far is unloaded (or recorded as leaked).
  void WaitForUnloads() { reaper_->WaitIdle(); }

 private:
  Loader(LoaderOptions options, std::shared_ptr<ShadowDirectory> shadows);
  Result<GenerationLease> LoadNew(const BackendFile& file, LoadTrace* trace,
                                  const TrustPolicy* trust, Placement placement);

  const LoaderOptions options_;
  const std::shared_ptr<ShadowDirectory> shadows_;
  const std::shared_ptr<LoaderStats> stats_ = std::make_shared<LoaderStats>();
  const std::shared_ptr<Reaper> reaper_ = std::make_shared<Reaper>();

  Mutex mutex_;
  // Live generations by real path, to map an unchanged file once.
  std::map<std::filesystem::path, std::weak_ptr<const Generation>> live_
      BACKPLANE_GUARDED_BY(mutex_);
};

}  // namespace backplane::loader
