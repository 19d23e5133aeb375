// Progressive rollouts of backend versions inside one server (docs/hot-reload.md, "Progressive
// rollout"): when the registry makes a new generation a candidate (deploy_policy
// "progressive"), this walks it through shadow and canary steps by the numbers the runtime
// measures, and promotes it or rolls it back without a person; the admin API can advance, pause,
// resume or abort it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/registry/backend_registry.hpp"
#include "backplane/runtime/runtime.hpp"
#include "config/rollout_policy.hpp"

namespace backplane::server {

enum class RolloutPhase { kNone, kShadow, kCanary, kPaused, kPromoted, kRolledBack };
// Named so, not ToString: a server::ToString would hide backplane::ToString(Shape) and the
// others in every file of the server that includes this.
std::string_view PhaseName(RolloutPhase phase);  // "none", "shadow", "canary", ...

// One backend id's rollout as the admin API shows it.
struct RolloutView {
  std::string backend_id;
  // kNone also after a rollback made another generation active: the record starts afresh.
  RolloutPhase phase = RolloutPhase::kNone;
  RolloutPhase paused_in = RolloutPhase::kNone;  // kPaused: the phase it resumes
  uint64_t stable_generation = 0;
  uint64_t candidate_generation = 0;
  // Once promoted: the generation that became active, the candidate itself or (a candidate tried
  // in a worker, rollout.candidate_isolation) its build loaded again in the server.
  uint64_t promoted_generation = 0;
  // The rollout's baseline (the stable build loaded again, placed as the candidate is, and given
  // as many requests; policy.baseline), 0 when it has none; its arm is in `window` and `totals`.
  uint64_t baseline_generation = 0;
  // Its worker died: canary steps judge the candidate against the stable generation since.
  bool baseline_lost = false;
  double weight_percent = 0;  // the candidate's share of requests now
  std::size_t step = 0;       // canary: index into policy.steps
  // Candidate runs observed in the current phase or step (shadow samples in shadow, candidate
  // requests in canary): the phase may advance at policy.min_samples.
  uint64_t samples = 0;
  // "policy" (the numbers decided), "operator" (the admin API), "deploy" (a later deploy ended
  // it) or "registry" (a runtime refused the promotion); empty while undecided.
  std::string decided_by;
  std::string reason;  // why it ended, or why the last transition happened
  RolloutPolicy policy;
  // The current window's numbers, and the cumulative ones since the candidate arrived.
  RolloutStats window;
  std::optional<RolloutStats> totals;
  // After a rollback: the candidate's record (state "rejected"), until another candidate comes.
  std::optional<GenerationStatus> rejected;
  struct Transition {
    std::chrono::system_clock::time_point at;
    RolloutPhase to;
    double weight_percent = 0;
    std::string why;
  };
  std::vector<Transition> history;  // the newest, oldest first
  uint64_t history_dropped = 0;     // older transitions no longer kept
  bool pinned = false;              // the backend is pinned: the rollout holds
};

// Thread-safe. Owns one thread that looks at every rollout each `tick`; decisions that change
// the registry (promote, roll back) are made without its lock. Must be destroyed before the
// runtime and the registry it is given.
class RolloutController {
 public:
  RolloutController(Runtime& runtime, BackendRegistry& registry, RolloutPolicy policy,
                    std::chrono::milliseconds tick = std::chrono::milliseconds(20));
  ~RolloutController();
  RolloutController(const RolloutController&) = delete;
  RolloutController& operator=(const RolloutController&) = delete;

  // kNotFound for an id the registry does not know; phase kNone when it never had a rollout.
  Result<RolloutView> View(std::string_view backend_id) const BACKPLANE_EXCLUDES(mutex_);
  std::vector<RolloutView> Views() const BACKPLANE_EXCLUDES(mutex_);  // every rollout on record

  // The admin API's verbs. kFailedPrecondition when no rollout is under way (or, for resume,
  // none is paused; for advance, the backend is pinned, or the registry refused the promotion:
  // a pin that came after the decision). Advance moves to the next phase or step
  // now, promoting after the last; pause holds the traffic where it is (automatic rollback still
  // applies, as while the backend is pinned); abort rolls back.
  Status Advance(std::string_view backend_id) BACKPLANE_EXCLUDES(mutex_, decision_mutex_);
  Status Pause(std::string_view backend_id) BACKPLANE_EXCLUDES(mutex_);
  Status Resume(std::string_view backend_id) BACKPLANE_EXCLUDES(mutex_);
  Status Abort(std::string_view backend_id) BACKPLANE_EXCLUDES(mutex_, decision_mutex_);
  // Replaces the policy of the rollout under way (the server's default stays as it is). A canary
  // keeps its share of requests and goes on from the first new step at or above it.
  Status SetPolicy(std::string_view backend_id, const RolloutPolicy& policy)
      BACKPLANE_EXCLUDES(mutex_);

  // The Prometheus text of every rollout on record (appended to /metrics).
  std::string RenderMetrics() const BACKPLANE_EXCLUDES(mutex_);

 private:
  struct Rollout;
  // What the thread or a verb asks of the registry, done without mutex_.
  struct Decision {
    enum class Kind { kNone, kPromote, kRollBack } kind = Kind::kNone;
    std::string backend_id;
    uint64_t candidate = 0;
  };

  void OnGenerationEvent(const GenerationEvent& event) BACKPLANE_EXCLUDES(mutex_);
  // `activated` made another generation active than the rollout's promotion (a rollback through
  // the API or the directory, a restart): the rollout's record starts afresh, phase kNone, on
  // record in its history.
  void Reset(Rollout& rollout, const GenerationEvent& activated) BACKPLANE_REQUIRES(mutex_);
  void Run();
  // Looks at one rollout's numbers: moves it on within the runtime, or asks for a decision.
  Decision Evaluate(Rollout& rollout) BACKPLANE_REQUIRES(mutex_);
  // The next phase or step, or the promotion after the last step (a decision to carry).
  Decision MoveOn(Rollout& rollout, std::string decided_by, std::string why)
      BACKPLANE_REQUIRES(mutex_);
  // The current step's time limit (step_max_duration_s) counts from now.
  void StartStepClock(Rollout& rollout) BACKPLANE_REQUIRES(mutex_);
  // Moves `rollout` to `phase` (and `step`), applies its traffic and starts a new window.
  void EnterPhase(Rollout& rollout, RolloutPhase phase, std::size_t step, std::string why)
      BACKPLANE_REQUIRES(mutex_);
  // The rollout's phase now, on record: its history, the transition counter and the log.
  void Record(Rollout& rollout, std::string why) BACKPLANE_REQUIRES(mutex_);
  // On record in its history and the log only: the phase stays (a pin, a hold, a policy edit).
  void Note(Rollout& rollout, std::string why) BACKPLANE_REQUIRES(mutex_);
  Decision Decide(Rollout& rollout, Decision::Kind kind, std::string decided_by, std::string why)
      BACKPLANE_REQUIRES(mutex_);
  // What the registry answered (ok for kNone).
  Status Carry(const Decision& decision) BACKPLANE_EXCLUDES(mutex_, decision_mutex_);
  void ApplyTraffic(const Rollout& rollout) BACKPLANE_REQUIRES(mutex_);
  RolloutView ViewOf(const Rollout& rollout) const BACKPLANE_REQUIRES(mutex_);
  Rollout* Find(std::string_view backend_id) BACKPLANE_REQUIRES(mutex_);
  Rollout* FindUnderWay(std::string_view backend_id, Status* error) BACKPLANE_REQUIRES(mutex_);

  Runtime& runtime_;
  BackendRegistry& registry_;
  const RolloutPolicy default_policy_;
  const std::chrono::milliseconds tick_;

  // Taken around each registry call a decision makes, never with mutex_ held: one decision at a
  // time, and the registry's events (which take mutex_) may arrive inside it.
  Mutex decision_mutex_;
  mutable Mutex mutex_;
  std::map<std::string, std::unique_ptr<Rollout>, std::less<>> rollouts_
      BACKPLANE_GUARDED_BY(mutex_);
  std::map<std::pair<std::string, RolloutPhase>, uint64_t> transitions_
      BACKPLANE_GUARDED_BY(mutex_);
  bool stopping_ BACKPLANE_GUARDED_BY(mutex_) = false;
  std::condition_variable_any wake_;
  uint64_t observer_ = 0;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace backplane::server
