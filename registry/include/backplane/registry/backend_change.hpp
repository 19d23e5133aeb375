// How a change to what a backend id offers reaches the runtimes: every subscriber prepares its
// side off the request path, then all of them commit together, or none does.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backplane/core/status.hpp"
#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/generation.hpp"

namespace backplane {

// A change to what an id offers, proposed to every subscriber (each Runtime) before it takes
// effect, so that any of them can refuse it (e.g. a network fails to prepare on the new code).
struct BackendChange {
  enum class Target {
    kActive,  // `next` becomes what the id offers (null: the id is withdrawn)
    // A progressive rollout: `next` becomes the id's candidate beside the active generation
    // `previous`, which stays what the id offers; null: the candidate is dropped (promoted ones
    // arrive as kActive instead). A dropped candidate cannot be refused.
    kCandidate,
  };
  std::string backend_id;
  loader::GenerationLease next;      // null: the id is withdrawn (its file was deleted)
  loader::GenerationLease previous;  // null: a new id
  Target target = Target::kActive;
  // kCandidate arriving: the stable build loaded again as the rollout's baseline (placed where
  // the candidate is), bound beside it and judged against it; null: none (the candidate is
  // judged against `previous`). Dropped with the candidate.
  loader::GenerationLease baseline;
};

// One subscriber's prepared side of a change. It owns no lock: it holds what was prepared (new
// instances, re-prepared networks) and a version of the subscriber's state to re-check. Dropped
// uncommitted, it aborts: what was prepared is released and nothing became visible. After a
// commit it holds what the change replaced, released when it is dropped, outside every lock.
//
// The coordinator commits like this, for every prepared change of one BackendChange at once:
//   every BeginCommit(), in subscription order;
//   locks = each change's LockState(), in subscription order;
//   if every IsCurrent(): every Commit();  (else: drop all, prepare again)
//   unlock all; every AfterCommit().
// Backend code (a runtime's AfterLoadNetwork hooks) runs in AfterCommit, never under a state lock.
class PreparedChange {
 public:
  virtual ~PreparedChange() = default;
  // Before any state lock is taken: what the subscriber keeps from here to the end of its
  // AfterCommit (or until the change is dropped), so that nothing it serialises with it runs in
  // between, e.g. a runtime's turn to call its backend contexts. Taken for every subscriber
  // before any state lock, so that code running under one (a backend hook) may still take
  // another subscriber's state lock.
  virtual void BeginCommit() {}
  // The subscriber's state lock, held by the caller only around IsCurrent and Commit.
  virtual std::unique_lock<Mutex> LockState() = 0;
  // Under that lock: whether the subscriber's state is still what this was prepared against.
  virtual bool IsCurrent() const = 0;
  // Under that lock: makes the change visible (pointer stores and map updates). Cannot fail.
  virtual void Commit() = 0;
  // After every state lock is released: backend hooks, logs, and anything else that may take
  // time.
  virtual void AfterCommit() {}
};

class BackendSubscriber {
 public:
  virtual ~BackendSubscriber() = default;
  // Prepares everything `change` needs off the request path, without making it visible and
  // without holding the subscriber's lock while it calls backend code. Called with the
  // registry's change sequence held (changes arrive one at a time, in order): never call the
  // registry's mutating operations from here. A refusal's reason names the step
  // (kPrepareFailed, kValidationFailed, or the loader's own reason when an instance cannot be
  // created).
  virtual Result<std::unique_ptr<PreparedChange>> PrepareChange(const BackendChange& change) = 0;
};

class BackendRegistry;

// Keeps a subscriber attached; unsubscribes on destruction (waiting for a change in progress).
class Subscription {
 public:
  Subscription() = default;
  Subscription(std::weak_ptr<BackendRegistry> registry, uint64_t id)
      : registry_(std::move(registry)), id_(id) {}
  Subscription(Subscription&& other) noexcept
      : registry_(std::move(other.registry_)), id_(std::exchange(other.id_, 0)) {}
  Subscription& operator=(Subscription&& other) noexcept;
  ~Subscription() { Reset(); }
  void Reset();

 private:
  std::weak_ptr<BackendRegistry> registry_;
  uint64_t id_ = 0;
};

}  // namespace backplane
