// One runtime's side of a change to a backend id's slots (BackendChange): a new active generation,
// a withdrawal, a candidate arriving or leaving. Every such change is prepared by one path
// (Runtime::PrepareChange, slot_change.cpp): the new slot (instance and context) created with this
// runtime's options, the networks concerned re-prepared on it and its context told
// BeforeLoadNetwork of them, all without the runtime's state lock. What differs is what the commit
// does with them, the change's policy:
//  - kReplaceActive (BackendChange::Target::kActive): the slot replaces the id's active one and
//    the re-prepared networks replace their bindings; a rollout of the id, if any, ends.
//  - kBindBeside (BackendChange::Target::kCandidate): the slot is the id's candidate and the
//    networks' bindings on it are published beside their active ones, as the id's rollout route
//    (RolloutRouter); a candidate leaving (a rollback) drops both.
// Private to the runtime.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backplane/runtime/runtime.hpp"

namespace backplane {

class Runtime::SlotChange final : public PreparedChange {
 public:
  enum class Policy { kReplaceActive, kBindBeside };

  SlotChange(Runtime& runtime, Policy policy, uint64_t version, const BackendChange& change);
  // What the change replaced is unreachable before it is released: the turn goes first.
  ~SlotChange() override { ReleaseTurn(); }

  // The runtime's turn to call its backends, kept until AfterCommit has called the placed
  // context's AfterLoadNetwork hooks: no load or unload runs in between, and no hook runs under
  // mutex_.
  void BeginCommit() override;
  std::unique_lock<Mutex> LockState() override;
  bool IsCurrent() const override;
  void Commit() override;
  void AfterCommit() override;

  // What was prepared: the new slot (none for a withdrawal or a candidate leaving), the networks'
  // new bindings (replacing theirs, or beside them) and the networks the slot's context heard
  // BeforeLoadNetwork of (it hears AfterLoadNetwork of them once committed).
  std::optional<BackendSlot> slot_;
  MovedNetworks bindings_;
  std::vector<NetworkId> hooked_;

 private:
  void ReplaceActive();
  void BindBeside();
  void ReleaseTurn() { turn_ = {}; }

  Runtime& runtime_;
  const Policy policy_;
  const uint64_t version_;
  const std::string id_;
  const uint64_t generation_;           // 0: a withdrawal, or the candidate leaves
  const uint64_t previous_generation_;  // the active one before (the candidate's stable one)
  std::optional<BackendSlot> replaced_;
  std::optional<BackendSlot> replaced_candidate_;
  const BackendSlot* placed_ = nullptr;  // the new slot, once committed
  std::unique_lock<Mutex> turn_;
};

}  // namespace backplane
