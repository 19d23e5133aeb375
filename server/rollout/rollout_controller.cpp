#include "rollout/rollout_controller.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/format.h>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_name.hpp"
#include "metrics/metrics.hpp"
#include "rollout/rollout_arms.hpp"
#include "rollout/rollout_judge.hpp"

namespace backplane::server {

namespace {

spdlog::logger& Log() {
  static spdlog::logger& logger = ModuleLogger("backplane.rollout");
  return logger;
}

constexpr RolloutPhase kPhases[] = {RolloutPhase::kNone,     RolloutPhase::kShadow,
                                    RolloutPhase::kCanary,   RolloutPhase::kPaused,
                                    RolloutPhase::kPromoted, RolloutPhase::kRolledBack};

bool UnderWay(RolloutPhase phase) {
  return phase == RolloutPhase::kShadow || phase == RolloutPhase::kCanary ||
         phase == RolloutPhase::kPaused;
}

RolloutArmStats Minus(const RolloutArmStats& now, const RolloutArmStats& then) {
  RolloutArmStats window = now;
  window.requests -= then.requests;
  window.errors -= then.errors;
  window.latency = now.latency - then.latency;
  return window;
}

RolloutStats Minus(const RolloutStats& now, const RolloutStats& then) {
  RolloutStats window = now;
  window.stable = Minus(now.stable, then.stable);
  window.candidate = Minus(now.candidate, then.candidate);
  // A baseline that arrived after the window began (generation 0 then) counts from nothing.
  window.baseline = then.baseline.generation == now.baseline.generation
                        ? Minus(now.baseline, then.baseline)
                        : now.baseline;
  window.shadow = now.shadow - then.shadow;
  return window;
}

// The arms of `stats` that exist, by their metrics' role label: the baseline only when the
// rollout has one (a series of generation 0 would be a generation that never was).
std::vector<std::pair<std::string_view, const RolloutArmStats*>> Arms(const RolloutStats& stats) {
  std::vector<std::pair<std::string_view, const RolloutArmStats*>> arms = {
      {"stable", &stats.stable}, {"candidate", &stats.candidate}};
  if (stats.baseline.generation != 0)
    arms.emplace_back("baseline", &stats.baseline);
  return arms;
}

std::string Percent(double value) {
  return fmt::format("{:g} %", value);
}

// History entries kept per rollout: every admin answer carries them, and thousands of verbs on
// one long rollout must not make each answer hundreds of kilobytes. An operator reads the latest.
constexpr std::size_t kHistoryLimit = 100;

}  // namespace

std::string_view PhaseName(RolloutPhase phase) {
  switch (phase) {
    case RolloutPhase::kNone:
      return "none";
    case RolloutPhase::kShadow:
      return "shadow";
    case RolloutPhase::kCanary:
      return "canary";
    case RolloutPhase::kPaused:
      return "paused";
    case RolloutPhase::kPromoted:
      return "promoted";
    case RolloutPhase::kRolledBack:
      return "rolled_back";
  }
  return "unknown";
}

struct RolloutController::Rollout {
  std::string backend_id;
  RolloutPhase phase = RolloutPhase::kNone;
  RolloutPhase paused_in = RolloutPhase::kNone;
  uint64_t stable = 0;
  uint64_t candidate = 0;
  uint64_t promoted = 0;  // the generation activated by the promotion (see RolloutView)
  std::size_t step = 0;
  // The candidate's share in canary: policy.steps[step], or below it after a policy edit kept
  // the share it had (the step is then the next one to move to).
  double share = 0;
  RolloutPolicy policy;
  bool pinned = false;  // the registry's pin on the backend: the rollout holds until unpinned
  // The candidate runs in a worker process and the stable generation does not: judged against the
  // stable generation (without a baseline), its latency gets policy.worker_latency_allowance_us.
  bool candidate_in_worker = false;
  // The baseline's loss (RolloutStats::baseline_lost) is on record in the history.
  bool baseline_lost_noted = false;
  RolloutStats window_start;  // the runtime's counters when the current window began
  // The current phase or step: when its time is up (step_max_duration_s; max() once used or
  // while held), the verdicts given on it (one per min_samples runs) and how many in a row were
  // inconclusive; `held` once on_inconclusive "hold" applied.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  uint64_t verdicts = 0;
  uint32_t inconclusive = 0;
  bool held = false;
  RolloutStats totals;  // the latest counters read (kept after the rollout ends)
  std::string decided_by;
  std::string reason;
  // A promotion or rollback handed to the registry: who decided and why, until its event.
  bool deciding = false;
  std::string pending_decided_by;
  std::string pending_reason;
  std::optional<GenerationStatus> rejected;
  std::deque<RolloutView::Transition> history;  // the newest kHistoryLimit
  uint64_t history_dropped = 0;

  double weight() const {
    if (phase == RolloutPhase::kCanary ||
        (phase == RolloutPhase::kPaused && paused_in == RolloutPhase::kCanary))
      return share;
    return phase == RolloutPhase::kPromoted ? 100 : 0;
  }
  // The phase whose rules apply (a paused rollout keeps its phase's numbers).
  RolloutPhase effective() const { return phase == RolloutPhase::kPaused ? paused_in : phase; }
};

RolloutController::RolloutController(Runtime& runtime, BackendRegistry& registry,
                                     RolloutPolicy policy, std::chrono::milliseconds tick)
    : runtime_(runtime), registry_(registry), default_policy_(std::move(policy)), tick_(tick) {
  observer_ = registry_.AddObserver([this](const GenerationEvent& event) {
    if (event.kind == GenerationEvent::Kind::kCandidate ||
        event.kind == GenerationEvent::Kind::kActivated ||
        event.kind == GenerationEvent::Kind::kRejected ||
        event.kind == GenerationEvent::Kind::kPinned ||
        event.kind == GenerationEvent::Kind::kUnpinned)
      OnGenerationEvent(event);
  });
  thread_ = std::thread([this] {
    NameThisThread("bp-rollout");
    Run();
  });
}

RolloutController::~RolloutController() {
  registry_.RemoveObserver(observer_);  // waits for a call in progress
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

RolloutController::Rollout* RolloutController::Find(std::string_view backend_id) {
  auto it = rollouts_.find(backend_id);
  return it == rollouts_.end() ? nullptr : it->second.get();
}

RolloutController::Rollout* RolloutController::FindUnderWay(std::string_view backend_id,
                                                            Status* error) {
  Rollout* rollout = Find(backend_id);
  if (rollout == nullptr || !UnderWay(rollout->phase) || rollout->deciding) {
    *error = FailedPrecondition("backend " + std::string(backend_id) + " has no rollout under way" +
                                (rollout == nullptr
                                     ? std::string()
                                     : " (last one: " + std::string(PhaseName(rollout->phase)) +
                                           (rollout->deciding ? ", being decided" : "") + ")"));
    return nullptr;
  }
  return rollout;
}

void RolloutController::ApplyTraffic(const Rollout& rollout) {
  const bool shadowing = UnderWay(rollout.phase);
  const double candidate_percent = rollout.deciding ? 0 : rollout.weight();
  Status applied = runtime_.SetRolloutTraffic(
      rollout.backend_id,
      {.candidate_percent = candidate_percent,
       .baseline_percent = BaselinePercent(
           rollout.policy, rollout.effective() == RolloutPhase::kCanary && !rollout.deciding,
           candidate_percent),
       .shadow_fraction = shadowing && !rollout.deciding ? rollout.policy.shadow_fraction : 0,
       .shadow_tolerance = rollout.policy.max_abs_divergence,
       .shadow_timeout_ms = rollout.policy.shadow_timeout_ms});
  if (!applied.ok() && UnderWay(rollout.phase))
    Log().warn("rollout of backend {}: {}", rollout.backend_id, applied.message());
}

void RolloutController::EnterPhase(Rollout& rollout, RolloutPhase phase, std::size_t step,
                                   std::string why) {
  rollout.phase = phase;
  rollout.step = step;
  if (phase == RolloutPhase::kCanary)
    rollout.share = rollout.policy.steps[step];
  if (auto totals = runtime_.GetRolloutStats(rollout.backend_id))
    rollout.totals = *totals;
  if (UnderWay(phase)) {  // an ended rollout keeps the window that decided it
    rollout.window_start = rollout.totals;
    StartStepClock(rollout);
    rollout.verdicts = 0;
    rollout.inconclusive = 0;
    rollout.held = false;
  }
  ApplyTraffic(rollout);
  Record(rollout, std::move(why));
}

void RolloutController::Record(Rollout& rollout, std::string why) {
  ++transitions_[{rollout.backend_id, rollout.phase}];
  Note(rollout, std::move(why));
}

void RolloutController::Note(Rollout& rollout, std::string why) {
  const RolloutPhase phase = rollout.phase;
  Log().info("rollout of backend {} generation {}: {}{} ({})", rollout.backend_id,
             rollout.candidate, PhaseName(phase),
             phase == RolloutPhase::kCanary || phase == RolloutPhase::kPaused
                 ? " at " + Percent(rollout.weight())
                 : "",
             why);
  rollout.history.push_back(
      {std::chrono::system_clock::now(), phase, rollout.weight(), std::move(why)});
  if (rollout.history.size() > kHistoryLimit) {
    rollout.history.pop_front();
    ++rollout.history_dropped;
  }
}

RolloutController::Decision RolloutController::Decide(Rollout& rollout, Decision::Kind kind,
                                                      std::string decided_by, std::string why) {
  rollout.deciding = true;
  rollout.pending_decided_by = std::move(decided_by);
  rollout.pending_reason = std::move(why);
  ApplyTraffic(rollout);  // nothing more for the candidate while the registry acts
  Log().info("rollout of backend {} generation {}: {} ({}: {})", rollout.backend_id,
             rollout.candidate, kind == Decision::Kind::kPromote ? "promoting" : "rolling back",
             rollout.pending_decided_by, rollout.pending_reason);
  return {kind, rollout.backend_id, rollout.candidate};
}

Status RolloutController::Carry(const Decision& decision) {
  if (decision.kind == Decision::Kind::kNone)
    return Status::Ok();
  Status carried;
  {
    MutexLock one_at_a_time(decision_mutex_);
    if (decision.kind == Decision::Kind::kPromote) {
      auto promoted = registry_.Promote(decision.backend_id, decision.candidate);
      if (!promoted.ok())
        carried = promoted.error();
    } else {
      std::string why;
      {
        MutexLock lock(mutex_);
        if (Rollout* rollout = Find(decision.backend_id))
          why = rollout->pending_decided_by + ": " + rollout->pending_reason;
      }
      auto dropped = registry_.DropCandidate(decision.backend_id, why, decision.candidate);
      if (!dropped.ok())
        carried = dropped.error();
    }
  }
  // The registry's event (activated or rejected) ended the rollout. A promotion it refused while
  // the candidate is still its candidate (the backend was pinned between the decision and the
  // promotion) leaves the rollout where it was, holding. Otherwise (the candidate had gone
  // meanwhile) it is over anyway.
  std::optional<BackendStatus> status;
  if (!carried.ok())
    status = registry_.Describe(decision.backend_id);
  MutexLock lock(mutex_);
  Rollout* rollout = Find(decision.backend_id);
  if (rollout != nullptr && rollout->candidate == decision.candidate && rollout->deciding &&
      decision.kind == Decision::Kind::kPromote && status &&
      status->candidate_generation == decision.candidate) {
    rollout->deciding = false;
    rollout->pinned = status->pinned;
    ApplyTraffic(*rollout);
    Note(*rollout, "promotion refused by the registry: " + carried.message() +
                       "; the rollout holds where it was");
    return carried;
  }
  if (rollout != nullptr && rollout->candidate == decision.candidate && rollout->deciding) {
    Log().warn("rollout of backend {} generation {}: the registry did not act: {}",
               decision.backend_id, decision.candidate, carried.message());
    rollout->deciding = false;
    rollout->phase = RolloutPhase::kRolledBack;
    rollout->decided_by = "registry";
    rollout->reason = carried.message();
  }
  return carried;
}

void RolloutController::OnGenerationEvent(const GenerationEvent& event) {
  MutexLock lock(mutex_);
  if (event.kind == GenerationEvent::Kind::kPinned ||
      event.kind == GenerationEvent::Kind::kUnpinned) {
    Rollout* rollout = Find(event.backend_id);
    const bool pinned = event.kind == GenerationEvent::Kind::kPinned;
    if (rollout == nullptr || !UnderWay(rollout->phase) || rollout->pinned == pinned)
      return;
    rollout->pinned = pinned;
    if (!pinned)
      StartStepClock(*rollout);  // the time held does not count against the step
    Note(*rollout, pinned ? "backend pinned: the rollout holds (no step, no promotion; a "
                            "failing candidate is still rolled back) until it is unpinned"
                          : "backend unpinned: the rollout goes on");
    return;
  }
  if (event.kind == GenerationEvent::Kind::kCandidate) {
    auto rollout = std::make_unique<Rollout>();
    rollout->backend_id = event.backend_id;
    rollout->candidate = event.generation;
    if (auto status = registry_.Describe(event.backend_id)) {
      rollout->stable = status->active_generation;
      rollout->pinned = status->pinned;
      std::string stable_runs_in = "?", candidate_runs_in;
      for (const auto& generation : status->generations) {
        if (generation.generation == rollout->stable)
          stable_runs_in = generation.runs_in;
        if (generation.generation == rollout->candidate)
          candidate_runs_in = generation.runs_in;
      }
      rollout->candidate_in_worker = !candidate_runs_in.empty() && stable_runs_in.empty();
    }
    rollout->policy = default_policy_;
    Rollout& started = *rollout;
    rollouts_.insert_or_assign(event.backend_id, std::move(rollout));
    if (started.policy.shadow_fraction > 0) {
      EnterPhase(started, RolloutPhase::kShadow, 0,
                 "new candidate beside generation " + std::to_string(started.stable));
    } else {
      EnterPhase(started, RolloutPhase::kCanary, 0,
                 "new candidate beside generation " + std::to_string(started.stable) +
                     "; shadow_fraction 0: no shadow phase");
    }
    return;
  }
  Rollout* rollout = Find(event.backend_id);
  const bool promoted = event.kind == GenerationEvent::Kind::kActivated &&
                        event.promoted_candidate != 0 &&
                        event.promoted_candidate == (rollout ? rollout->candidate : 0);
  if (rollout != nullptr && event.kind == GenerationEvent::Kind::kActivated && !promoted) {
    Reset(*rollout, event);
    return;
  }
  if (rollout == nullptr || (rollout->candidate != event.generation && !promoted) ||
      !UnderWay(rollout->phase))
    return;
  rollout->decided_by = rollout->deciding ? rollout->pending_decided_by
                        : promoted        ? "registry"
                                          : "deploy";
  rollout->reason = rollout->deciding ? rollout->pending_reason : event.message;
  rollout->deciding = false;
  if (promoted) {
    rollout->promoted = event.generation;
    if (event.generation != rollout->candidate) {
      rollout->reason += "; its build, tried in a worker process, now runs as generation " +
                         std::to_string(event.generation);
    }
  }
  if (!promoted) {
    if (auto status = registry_.Describe(event.backend_id)) {
      for (const auto& generation : status->generations) {
        if (generation.generation == event.generation)
          rollout->rejected = generation;
      }
    }
  }
  EnterPhase(*rollout, promoted ? RolloutPhase::kPromoted : RolloutPhase::kRolledBack,
             rollout->step, rollout->decided_by + ": " + rollout->reason);
}

void RolloutController::Reset(Rollout& rollout, const GenerationEvent& activated) {
  if (UnderWay(rollout.phase)) {
    // The stable side changed under a candidate still on offer (its worker restarted): the
    // rollout goes on against the new stable generation.
    rollout.stable = activated.generation;
    Note(rollout, "the stable generation is now " + std::to_string(activated.generation) + " (" +
                      activated.message + ")");
    return;
  }
  // A candidate under way was dropped first (its own event ended the rollout): what is left is
  // the record of a rollout that no longer describes what serves, e.g. a "promoted" whose
  // promoted generation was just rolled back.
  rollout.phase = RolloutPhase::kNone;
  rollout.paused_in = RolloutPhase::kNone;
  rollout.stable = activated.generation;
  rollout.candidate = 0;
  rollout.promoted = 0;
  rollout.step = 0;
  rollout.share = 0;
  rollout.deciding = false;
  rollout.decided_by.clear();
  rollout.reason = "generation " + std::to_string(activated.generation) + " active (" +
                   activated.message + "): no rollout under way";
  rollout.totals = {};
  rollout.window_start = {};
  rollout.deadline = std::chrono::steady_clock::time_point::max();
  rollout.verdicts = 0;
  rollout.inconclusive = 0;
  rollout.held = false;
  if (auto status = registry_.Describe(rollout.backend_id))
    rollout.pinned = status->pinned;
  ApplyTraffic(rollout);
  Record(rollout, rollout.reason);
}

RolloutController::Decision RolloutController::Evaluate(Rollout& rollout) {
  if (!UnderWay(rollout.phase) || rollout.deciding)
    return {};
  auto totals = runtime_.GetRolloutStats(rollout.backend_id);
  if (!totals)
    return {};  // the runtime's side is not there (yet, or any more): its event will tell
  rollout.totals = *totals;
  const RolloutStats window = Minus(*totals, rollout.window_start);
  const RolloutPolicy& policy = rollout.policy;
  if (totals->baseline_lost && !rollout.baseline_lost_noted) {
    rollout.baseline_lost_noted = true;
    Note(rollout, "the worker of the baseline generation " +
                      std::to_string(totals->baseline.generation) +
                      " died: its share runs on the stable generation, and the candidate is "
                      "judged against the stable generation from now on");
  }
  auto roll_back = [&](std::string why) {
    mutex_.AssertHeld();  // the analysis does not follow the enclosing function into a lambda
    return Decide(rollout, Decision::Kind::kRollBack, "policy", std::move(why));
  };

  // One shadow sample out of tolerance rolls back, in any phase (paused and pinned too): a wrong
  // answer is not a matter of chance.
  const ShadowStats& shadow = window.shadow;
  if (shadow.diverged > 0) {
    return roll_back(fmt::format(
        "shadow: {} of {} samples differ from the stable outputs by more than max_abs_divergence "
        "{:g} (largest difference {:g}, {} with another argmax)",
        shadow.diverged, shadow.samples, policy.max_abs_divergence, shadow.max_abs_difference,
        shadow.argmax_disagreements));
  }
  if (shadow.timeouts > 0) {
    return roll_back(fmt::format("shadow: {} run(s) of the candidate took longer than {:g} ms",
                                 shadow.timeouts, totals->traffic.shadow_timeout_ms));
  }

  // The judge's verdict on the window. Shadow runs go on through the canary steps: their errors
  // still fail a canary step.
  const bool canary = rollout.effective() == RolloutPhase::kCanary;
  const std::string where = canary ? "canary at " + Percent(rollout.weight()) : "shadow";
  Verdict verdict = Judge(ShadowWindow(window), policy, JudgedPhase::kShadow);
  if (canary) {
    const Verdict shadowed = std::move(verdict);
    verdict =
        Judge(CanaryWindow(window, *totals, policy, BaselinePercent(policy, true, rollout.weight()),
                           rollout.candidate_in_worker),
              policy, JudgedPhase::kCanary);
    if (shadowed.outcome == Verdict::Outcome::kFail && verdict.outcome != Verdict::Outcome::kFail) {
      verdict = shadowed;
      verdict.reason = "shadow runs: " + verdict.reason;
    }
  }
  // A verdict counts once per min_samples runs (or when the step's time is up), not at every
  // tick: every look at a window is another chance of a false alarm.
  const uint64_t samples = canary ? window.candidate.requests : shadow.samples;
  const bool checkpoint = samples >= (rollout.verdicts + 1) * policy.min_samples;
  const bool expired = std::chrono::steady_clock::now() >= rollout.deadline;
  if (verdict.outcome == Verdict::Outcome::kFail && (verdict.early || checkpoint || expired))
    return roll_back(where + ": " + verdict.reason);
  if (!checkpoint && !expired)
    return {};
  if (checkpoint)
    ++rollout.verdicts;
  if (expired)
    rollout.deadline = std::chrono::steady_clock::time_point::max();
  // Paused or pinned: the verdicts are given (and a fail acts), the rollout does not move.
  const bool holding = rollout.phase == RolloutPhase::kPaused || rollout.pinned;
  if (verdict.outcome == Verdict::Outcome::kPass) {
    rollout.inconclusive = 0;
    if (holding)
      return {};
    return MoveOn(rollout, "policy", where + ": pass: " + verdict.reason);
  }
  ++rollout.inconclusive;
  if (holding)
    return {};
  const std::string why =
      expired ? fmt::format("{}: inconclusive when step_max_duration_s {:g} was up: {}", where,
                            policy.step_max_duration_s, verdict.reason)
              : fmt::format("{}: inconclusive {} times in a row (inconclusive_limit {}): {}", where,
                            rollout.inconclusive, policy.inconclusive_limit, verdict.reason);
  if (!expired && rollout.inconclusive < policy.inconclusive_limit) {
    Log().info("rollout of backend {} generation {}: {}; the window grows", rollout.backend_id,
               rollout.candidate, why);
    return {};
  }
  if (policy.on_inconclusive == RolloutPolicy::OnInconclusive::kAdvance)
    return MoveOn(rollout, "policy", why + "; on_inconclusive advance");
  if (!rollout.held) {
    rollout.held = true;
    Note(rollout, why + "; on_inconclusive hold: held until a verdict or an operator decides");
  }
  return {};
}

RolloutController::Decision RolloutController::MoveOn(Rollout& rollout, std::string decided_by,
                                                      std::string why) {
  if (rollout.effective() == RolloutPhase::kShadow) {
    EnterPhase(rollout, RolloutPhase::kCanary, 0, std::move(why));
    return {};
  }
  // After a policy edit the share may lie below its step: the step's own share comes first.
  const std::size_t next =
      rollout.policy.steps[rollout.step] > rollout.share ? rollout.step : rollout.step + 1;
  if (next < rollout.policy.steps.size()) {
    EnterPhase(rollout, RolloutPhase::kCanary, next, std::move(why));
    return {};
  }
  return Decide(rollout, Decision::Kind::kPromote, std::move(decided_by), std::move(why));
}

void RolloutController::StartStepClock(Rollout& rollout) {
  const double seconds = rollout.policy.step_max_duration_s;
  rollout.deadline = seconds > 0
                         ? std::chrono::steady_clock::now() +
                               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(seconds))
                         : std::chrono::steady_clock::time_point::max();
}

void RolloutController::Run() {
  while (true) {
    std::vector<Decision> decisions;
    {
      MutexLock lock(mutex_);
      if (stopping_)
        return;
      wake_.wait_for(mutex_, tick_);
      if (stopping_)
        return;
      for (auto& [id, rollout] : rollouts_) {
        Decision decision = Evaluate(*rollout);
        if (decision.kind != Decision::Kind::kNone)
          decisions.push_back(std::move(decision));
      }
    }
    for (const auto& decision : decisions)
      (void)Carry(decision);  // what the registry refused is on record in the rollout
  }
}

Status RolloutController::Advance(std::string_view backend_id) {
  Decision decision;
  {
    MutexLock lock(mutex_);
    Status error;
    Rollout* rollout = FindUnderWay(backend_id, &error);
    if (rollout == nullptr)
      return error;
    if (rollout->pinned) {
      return FailedPrecondition("backend " + std::string(backend_id) +
                                " is pinned: its rollout holds (no step, no promotion) until it "
                                "is unpinned");
    }
    decision = MoveOn(*rollout, "operator", "advanced by an operator");
  }
  return Carry(decision);
}

Status RolloutController::Pause(std::string_view backend_id) {
  MutexLock lock(mutex_);
  Status error;
  Rollout* rollout = FindUnderWay(backend_id, &error);
  if (rollout == nullptr)
    return error;
  if (rollout->phase == RolloutPhase::kPaused)
    return Status::Ok();
  rollout->paused_in = rollout->phase;
  rollout->phase = RolloutPhase::kPaused;
  Record(*rollout, "paused by an operator");
  return Status::Ok();
}

Status RolloutController::Resume(std::string_view backend_id) {
  MutexLock lock(mutex_);
  Status error;
  Rollout* rollout = FindUnderWay(backend_id, &error);
  if (rollout == nullptr)
    return error;
  if (rollout->phase != RolloutPhase::kPaused)
    return FailedPrecondition("the rollout of backend " + std::string(backend_id) +
                              " is not paused (" + std::string(PhaseName(rollout->phase)) + ")");
  rollout->phase = rollout->paused_in;
  rollout->paused_in = RolloutPhase::kNone;
  StartStepClock(*rollout);  // the time paused does not count against the step
  Record(*rollout, "resumed by an operator");
  return Status::Ok();
}

Status RolloutController::Abort(std::string_view backend_id) {
  Decision decision;
  {
    MutexLock lock(mutex_);
    Status error;
    Rollout* rollout = FindUnderWay(backend_id, &error);
    if (rollout == nullptr)
      return error;
    decision =
        Decide(*rollout, Decision::Kind::kRollBack, "operator", "aborted through the admin API");
  }
  return Carry(decision);
}

Status RolloutController::SetPolicy(std::string_view backend_id, const RolloutPolicy& policy) {
  MutexLock lock(mutex_);
  Status error;
  Rollout* rollout = FindUnderWay(backend_id, &error);
  if (rollout == nullptr)
    return error;
  rollout->policy = policy;
  std::string why = "policy replaced by an operator";
  if (rollout->effective() == RolloutPhase::kCanary) {
    // The traffic stays where it is; the rollout goes on from the first new step at or above it
    // (the last one is 100, so there is one). Clamping the old index instead could send the
    // candidate every request at once.
    const auto& steps = policy.steps;
    rollout->step = static_cast<std::size_t>(
        std::lower_bound(steps.begin(), steps.end(), rollout->share) - steps.begin());
    why +=
        fmt::format(": stays at {}, next {}", Percent(rollout->share),
                    steps[rollout->step] > rollout->share ? "step " + Percent(steps[rollout->step])
                    : rollout->step + 1 < steps.size() ? "step " + Percent(steps[rollout->step + 1])
                                                       : std::string("the promotion"));
  }
  StartStepClock(*rollout);
  ApplyTraffic(*rollout);
  Note(*rollout, std::move(why));
  return Status::Ok();
}

RolloutView RolloutController::ViewOf(const Rollout& rollout) const {
  RolloutView view{.backend_id = rollout.backend_id,
                   .phase = rollout.phase,
                   .paused_in = rollout.paused_in,
                   .stable_generation = rollout.stable,
                   .candidate_generation = rollout.candidate,
                   .promoted_generation = rollout.promoted,
                   .weight_percent = rollout.deciding ? 0 : rollout.weight(),
                   .step = rollout.step,
                   .decided_by = rollout.decided_by,
                   .reason = rollout.reason,
                   .policy = rollout.policy,
                   .rejected = rollout.rejected,
                   .history = {rollout.history.begin(), rollout.history.end()},
                   .history_dropped = rollout.history_dropped,
                   .pinned = rollout.pinned};
  RolloutStats totals = rollout.totals;
  if (UnderWay(rollout.phase)) {
    if (auto now = runtime_.GetRolloutStats(rollout.backend_id))
      totals = *now;
  }
  view.window = Minus(totals, rollout.window_start);
  view.baseline_generation = totals.baseline.generation;
  view.baseline_lost = totals.baseline_lost;
  if (rollout.phase != RolloutPhase::kNone)  // reset by a rollback: no numbers to show
    view.totals = totals;
  view.samples = rollout.effective() == RolloutPhase::kShadow ? view.window.shadow.samples
                                                              : view.window.candidate.requests;
  if (rollout.deciding)
    view.reason = rollout.pending_decided_by + " is deciding: " + rollout.pending_reason;
  return view;
}

Result<RolloutView> RolloutController::View(std::string_view backend_id) const {
  {
    MutexLock lock(mutex_);
    if (auto it = rollouts_.find(backend_id); it != rollouts_.end())
      return ViewOf(*it->second);
  }
  auto status = registry_.Describe(backend_id);
  if (!status)
    return NotFound("unknown backend '" + std::string(backend_id) + "'");
  return RolloutView{.backend_id = std::string(backend_id),
                     .stable_generation = status->active_generation,
                     .policy = default_policy_};
}

std::vector<RolloutView> RolloutController::Views() const {
  MutexLock lock(mutex_);
  std::vector<RolloutView> views;
  for (const auto& [id, rollout] : rollouts_)
    views.push_back(ViewOf(*rollout));
  return views;
}

std::string RolloutController::RenderMetrics() const {
  const std::vector<RolloutView> views = Views();
  std::map<std::pair<std::string, RolloutPhase>, uint64_t> transitions;
  {
    MutexLock lock(mutex_);
    transitions = transitions_;
  }
  std::string text;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    text += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto backend = [](const RolloutView& view) {
    return "backend=\"" + EscapeLabelValue(view.backend_id) + "\"";
  };
  family("backplane_rollout_phase", "gauge",
         "1 for the phase of the latest rollout of each backend, 0 for the others");
  for (const auto& view : views) {
    for (RolloutPhase phase : kPhases) {
      text += fmt::format("backplane_rollout_phase{{{},phase=\"{}\"}} {}\n", backend(view),
                          PhaseName(phase), view.phase == phase ? 1 : 0);
    }
  }
  family("backplane_rollout_weight_percent", "gauge",
         "The candidate generation's share of requests, in percent");
  for (const auto& view : views)
    text += fmt::format("backplane_rollout_weight_percent{{{}}} {:g}\n", backend(view),
                        view.weight_percent);
  family("backplane_rollout_transitions_total", "counter",
         "Rollout phase transitions, by backend and the phase entered");
  for (const auto& [key, count] : transitions) {
    text += fmt::format("backplane_rollout_transitions_total{{backend=\"{}\",to=\"{}\"}} {}\n",
                        EscapeLabelValue(key.first), PhaseName(key.second), count);
  }
  auto arms = [&](std::string_view name, std::string_view help, auto value) {
    family(name, "counter", help);
    for (const auto& view : views) {
      if (!view.totals)
        continue;
      for (const auto& [role, arm] : Arms(*view.totals)) {
        text += fmt::format("{}{{{},generation=\"{}\",role=\"{}\"}} {}\n", name, backend(view),
                            arm->generation, role, value(*arm));
      }
    }
  };
  arms("backplane_rollout_requests_total",
       "Requests run on each generation of a rollout (shadow runs not included)",
       [](const RolloutArmStats& arm) { return arm.requests; });
  arms("backplane_rollout_errors_total", "Of them, the ones the backend failed",
       [](const RolloutArmStats& arm) { return arm.errors; });
  family("backplane_rollout_p99_seconds", "gauge",
         "p99 execution latency of each generation in the rollout's current window");
  for (const auto& view : views) {
    for (const auto& [role, arm] : Arms(view.window)) {
      text += fmt::format(
          "backplane_rollout_p99_seconds{{{},generation=\"{}\",role=\"{}\"}} {:g}\n", backend(view),
          arm->generation, role, arm->latency.QuantileMicros(0.99) / 1e6);
    }
  }
  family("backplane_rollout_shadow_samples_total", "counter",
         "Shadow runs of the candidate compared with the stable outputs");
  for (const auto& view : views) {
    if (view.totals)
      text += fmt::format("backplane_rollout_shadow_samples_total{{{},generation=\"{}\"}} {}\n",
                          backend(view), view.candidate_generation, view.totals->shadow.samples);
  }
  family("backplane_rollout_shadow_diverged_total", "counter",
         "Shadow runs whose outputs differed beyond max_abs_divergence");
  for (const auto& view : views) {
    if (view.totals)
      text += fmt::format("backplane_rollout_shadow_diverged_total{{{},generation=\"{}\"}} {}\n",
                          backend(view), view.candidate_generation, view.totals->shadow.diverged);
  }
  return text;
}

}  // namespace backplane::server
