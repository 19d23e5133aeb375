// crash_dir (docs/operators.md, "Backends that crash"): each request whose backend's worker
// process died under it is kept as a directory an author can replay, with `backplane run`, against
// the very build that died:
//
//   <crash_dir>/20261206T182455.123Z-TestCrash-g3-1/
//     input_0.pb ...   the request's inputs as ONNX TensorProto files, in the network's order
//     replay.sh        one `backplane run` command line: the model, the copy of the build, inputs
//     crash.json       the crash message (backend, generation, file, sha256, how it died), model
//   <crash_dir>/backends/<sha256>/<file name>
//                    the build, copied once per content: the file may be replaced after the crash
//
// Traps kept in mind here:
// - The runtime tells of a crash on the request's own thread, before it runs the request again:
//   only the inputs are copied there; finding the model and the build and writing happen on a
//   thread of this class's, and at most kMaxPending captures wait for it (more are dropped).
// - A crash loop must not fill the disk: the oldest captures (and copies no capture names any more)
//   are removed beyond kMaxCaptures or kMaxBytes.
// - A write that fails is logged once, not for every crash of a loop, until one succeeds again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/runtime.hpp"

namespace backplane::server {

class ModelRepository;

struct CrashCaptureLimits {
  std::size_t max_captures = 100;
  uint64_t max_bytes = uint64_t{1} << 30;  // captures and build copies together
  std::size_t max_pending = 4;             // captures copied but not yet written
};

// Thread-safe.
class CrashCapture {
 public:
  // Creates `dir` when missing and checks that a file can be written in it: kFailedPrecondition
  // "crash_dir <path>: why" otherwise. `default_preferences`: the server's backend_preferences, the
  // replay's for a model that names none. Starts the writing thread.
  static Result<std::unique_ptr<CrashCapture>> Create(std::filesystem::path dir,
                                                      const BackendRegistry& registry,
                                                      std::vector<std::string> default_preferences,
                                                      CrashCaptureLimits limits = {});
  ~CrashCapture();  // Stop()
  CrashCapture(const CrashCapture&) = delete;
  CrashCapture& operator=(const CrashCapture&) = delete;

  // Which model a network is: set once the repository exists (a crash reported before it is
  // kept without a model, and so without replay.sh).
  void AttachModels(const ModelRepository& repository) BACKPLANE_EXCLUDES(mutex_);
  // RuntimeOptions::on_crashed_request: copies the inputs and returns; never throws.
  void OnCrashedRequest(const CrashedRequest& request) BACKPLANE_EXCLUDES(mutex_);
  // Writes what is queued, then ignores later crashes. Before the repository goes.
  void Stop() BACKPLANE_EXCLUDES(mutex_);

 private:
  struct Pending;
  CrashCapture(std::filesystem::path dir, const BackendRegistry& registry,
               std::vector<std::string> default_preferences, CrashCaptureLimits limits);
  void Run();
  Status Write(const Pending& pending, const ModelRepository* repository);
  Result<std::filesystem::path> CopyBuild(const GenerationStatus& generation);
  void Prune();

  const std::filesystem::path dir_;
  const BackendRegistry& registry_;
  const std::vector<std::string> default_preferences_;
  const CrashCaptureLimits limits_;
  const std::string backplane_;  // replay.sh's default executable
  mutable Mutex mutex_;
  std::condition_variable_any changed_;
  std::deque<std::unique_ptr<Pending>> queue_ BACKPLANE_GUARDED_BY(mutex_);
  const ModelRepository* repository_ BACKPLANE_GUARDED_BY(mutex_) = nullptr;
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  bool dropped_logged_ BACKPLANE_GUARDED_BY(mutex_) = false;
  // The writing thread's own.
  uint64_t written_ = 0;
  bool failure_logged_ = false;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace backplane::server
