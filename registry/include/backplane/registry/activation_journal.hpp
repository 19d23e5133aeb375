// What the registry remembers across restarts about the generations it activated, so that a build
// that took the process down is not loaded again by the next start (docs/operators.md,
// "Crash loops and state_dir").
//
// A process that dies by a signal can write nothing reliably, so intent is recorded before and
// cleared after: a generation activated over one that served is written down "on probation"
// (durably: temp file, fsync, rename, fsync of the directory) before it takes requests; once it
// has survived the crash grace, or the process shuts down cleanly, the record goes. The next
// start finds a record still on probation only when the process ended inside the grace without
// a clean shutdown: whatever ended it (SIGSEGV, abort, the OOM killer, kill -9, exit() from
// inside a backend), that content is suspected of it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"

namespace backplane {

struct ActivationRecord {
  enum class State {
    kProbation,  // activated less than the crash grace ago by a process still running
    // The process that activated it ended inside the grace without a clean shutdown: refused
    // (SUSPECTED_CRASH) until another file of its id is published or an operator reloads it.
    kSuspected,
  };
  State state = State::kProbation;
  std::string backend_id;
  std::string sha256;          // the content: what is suspected, whatever file holds it
  std::filesystem::path file;  // the real file it was loaded from, for people
  uint64_t generation = 0;     // its number in the process that activated it
  std::chrono::system_clock::time_point activated_at;
};
std::string_view ToString(ActivationRecord::State state);  // "probation", "suspected"

// What a state directory holds, read without changing it (`backplane check --config`).
struct ActivationJournalContents {
  std::vector<ActivationRecord> records;
  // A process has the directory open now: its records on probation are its own, not suspects.
  bool in_use = false;
  Status problem;  // not Ok: the journal was unreadable or corrupt, and is read as empty
};
ActivationJournalContents ReadActivationJournal(const std::filesystem::path& state_dir);

// Thread-safe. One per state directory at a time (an exclusive lock on `<state_dir>/lock`, which
// the kernel drops when the process dies however it dies). Writes happen on activations, on its
// own timer thread when a grace ends, and at a clean end; never on the request path. A write
// that fails is logged and leaves the previous journal in place.
class ActivationJournal {
 public:
  // Creates `state_dir` if needed, takes its lock, reads the journal left by the previous
  // process and turns every record it left on probation into a suspect (logged, with the
  // reason). A corrupt journal is logged and ignored (set aside as `activations.corrupt`), never
  // fatal. kInvalidArgument naming `state_dir` when it cannot be created, locked or written.
  static Result<std::unique_ptr<ActivationJournal>> Open(std::filesystem::path state_dir,
                                                         std::chrono::milliseconds grace);
  // A clean end: nothing on probation is suspected of anything (EndCleanly).
  ~ActivationJournal();
  ActivationJournal(const ActivationJournal&) = delete;
  ActivationJournal& operator=(const ActivationJournal&) = delete;

  const std::filesystem::path& directory() const { return directory_; }
  std::chrono::milliseconds grace() const { return grace_; }

  // The suspicion on this content of `backend_id`, if any.
  std::optional<ActivationRecord> Suspected(std::string_view backend_id,
                                            std::string_view sha256) const
      BACKPLANE_EXCLUDES(mutex_);
  // Content `sha256` of `backend_id` started taking requests beside or instead of a generation
  // that served: on probation until the grace passes.
  void Activated(const std::string& backend_id, const std::string& sha256,
                 const std::filesystem::path& file, uint64_t generation) BACKPLANE_EXCLUDES(mutex_);
  // The activation of `sha256` did not happen after all (a runtime refused it): no probation.
  void Abandoned(std::string_view backend_id, std::string_view sha256) BACKPLANE_EXCLUDES(mutex_);
  // Drops every suspicion on `backend_id` (another file was published, or an operator reloads
  // it); returns what was dropped.
  std::vector<ActivationRecord> Forget(std::string_view backend_id) BACKPLANE_EXCLUDES(mutex_);
  // Every record on probation survived: the process is ending in order.
  void EndCleanly() BACKPLANE_EXCLUDES(mutex_);

  std::vector<ActivationRecord> Records() const BACKPLANE_EXCLUDES(mutex_);

 private:
  struct Entry {
    ActivationRecord record;
    std::chrono::steady_clock::time_point survives_at;  // kProbation only
  };
  ActivationJournal(std::filesystem::path directory, std::chrono::milliseconds grace, int lock_fd,
                    std::vector<ActivationRecord> records);
  void RunTimer() BACKPLANE_EXCLUDES(mutex_);
  void WriteLocked() BACKPLANE_REQUIRES(mutex_);

  const std::filesystem::path directory_;
  const std::chrono::milliseconds grace_;
  const int lock_fd_;
  mutable Mutex mutex_;
  std::condition_variable_any wake_;
  std::vector<Entry> entries_ BACKPLANE_GUARDED_BY(mutex_);
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  std::thread timer_;  // last: started once everything it reads exists
};

}  // namespace backplane
