// What the registry reports: where each generation of a backend id is in its life, what a deploy
// did, and the events observers receive.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/loader/backend_file.hpp"
#include "backplane/registry/activation_journal.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane {

// Where one generation of a backend id is in its life (docs/hot-reload.md).
enum class GenerationState {
  kLoading,  // being copied, inspected, loaded, or prepared by the runtimes
  kActive,   // what new work of this id runs on
  // Loaded beside the active one during a progressive rollout (DeployPolicy::kProgressive): the
  // runtimes bind their networks on it and send it the share of requests they are told to.
  kCandidate,
  // The active generation's build loaded again beside a candidate, placed as the candidate is
  // (BackendRegistryOptions::baseline_generations): the arm the candidate is judged against.
  // Never offered to new work; it drains when the candidate is promoted or dropped.
  kBaseline,
  kDraining,  // replaced; still mapped while networks or requests hold leases on it
  kUnloaded,  // dlclosed and verified gone from the process
  kLeaked,    // dlclosed but still mapped (docs/loading-rules.md rule 3); counted and warned
  kRejected,  // failed a step; never became active
};
std::string_view ToString(GenerationState state);  // "loading", "active", ...

struct GenerationStatus {
  uint64_t generation = 0;
  GenerationState state = GenerationState::kLoading;
  std::filesystem::path file;           // the name that spoke (maybe a symlink)
  std::filesystem::path resolved_file;  // the real file it resolved to and was copied from
  std::string sha256;                   // of the content loaded (the shadow copy): what runs
  std::string release;
  BackendApiVersion api_version;
  std::string build_id;
  // Where its code runs or ran: "worker process 1234" (backend_isolation); "" in this process.
  std::string runs_in;
  long refcount = 0;  // leases held right now (networks, instances, the registry itself)
  std::chrono::system_clock::time_point loaded_at;
  // From the moment it stopped being active to the moment it was unmapped; set once unloaded.
  std::optional<double> drain_ms;
  Status rejection;  // kRejected: why
};

struct BackendStatus {
  std::string id;
  bool is_static = false;
  uint64_t active_generation = 0;     // 0 for a static backend or when withdrawn
  uint64_t candidate_generation = 0;  // 0 unless a progressive rollout is under way
  uint64_t baseline_generation = 0;   // the candidate's (GenerationState::kBaseline); 0: none
  bool pinned = false;
  bool withdrawn = false;                      // its file was deleted: offered to no new load
  std::filesystem::path file;                  // the file its generations come from
  std::vector<GenerationStatus> generations;   // newest first, bounded history
  std::vector<loader::RejectedFile> rejected;  // rejected deploys of `file`, newest first
  // What the state directory records for this id: content on probation, and content suspected of
  // a crash (refused until another file is published or the backend is reloaded).
  std::vector<ActivationRecord> activations;
};

// What a rescan or a reload did about one backend file.
struct DeployOutcome {
  enum class Action {
    kUnchanged,  // same file identity as the active generation
    kActivated,  // a new generation (or a new id) is active
    kCandidate,  // a new generation is loaded beside the active one: a progressive rollout starts
    kRejected,   // the new file failed a step; the old generation keeps serving
    kDeferred,   // a writer is still at work on the file: look again soon
    kPinned,     // a new file was seen but the id is pinned
    kWithdrawn,  // the file was deleted
  };
  Action action = Action::kUnchanged;
  std::string backend_id;  // empty when the file never got as far as naming its id
  std::filesystem::path file;
  uint64_t generation = 0;  // the generation activated or rejected
  std::string message;      // what happened, for people
  Status error;             // kRejected and kDeferred: why
};
std::string_view ToString(DeployOutcome::Action action);

struct RescanResult {
  std::vector<DeployOutcome> outcomes;  // only files whose state changed
  // Some file was deferred, or a misnamed one waits for a second look before it is said.
  bool retry_soon = false;
  // Every directory worth watching: the backend directories and the directories their
  // symlinks point into.
  std::vector<std::filesystem::path> watch_directories;
};

// A lifecycle event, delivered to observers after every lock of the registry is released (on the
// thread that caused it, or on the reaper thread for kUnloaded and kLeaked). Observers must not
// block; they may read the registry but not change it (BackendRegistry::AddObserver says why).
struct GenerationEvent {
  enum class Kind {
    kLoaded,
    kActivated,
    kCandidate,  // a generation became the candidate of a progressive rollout
    kRejected,
    kDraining,
    kUnloaded,
    kLeaked,
    kWithdrawn,
    kPinned,
    kUnpinned
  };
  Kind kind;
  std::string backend_id;
  uint64_t generation = 0;
  std::filesystem::path file;
  Status error;  // kRejected: why (its reason() is set)
  std::string message;
  std::optional<double> drain_ms;  // kUnloaded, kLeaked
  // kActivated by a promotion: the rollout candidate promoted (this generation, or the sandboxed
  // candidate whose build this generation is, loaded again where its backend runs); else 0.
  uint64_t promoted_candidate = 0;
};
std::string_view ToString(GenerationEvent::Kind kind);
using GenerationObserver = std::function<void(const GenerationEvent&)>;

}  // namespace backplane
