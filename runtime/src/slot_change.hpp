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
//    (RolloutRouter). With a baseline (BackendChange::baseline) a second slot is prepared for it
//    exactly as the candidate's is, and placed and routed beside it: the rollout's two trial
//    arms. A candidate leaving (a rollback) drops both arms.
// Private to the runtime.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
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

  // One slot a change prepares and what was prepared on it: the change's next generation (no
  // slot for a withdrawal or a candidate leaving), and beside a candidate, its baseline, alike.
  struct PreparedSlot {
    uint64_t generation = 0;
    std::optional<BackendSlot> slot;
    // The networks' new bindings on it (replacing theirs, or beside them; a withdrawal's moved
    // elsewhere) and the networks its context heard BeforeLoadNetwork of (it hears
    // AfterLoadNetwork of them once committed).
    MovedNetworks bindings;
    std::vector<NetworkId> hooked;
    const BackendSlot* placed = nullptr;  // the slot, once committed
  };
  PreparedSlot next_;
  std::optional<PreparedSlot> baseline_;

  // Prepares `into` on `generation`: this runtime's instance and slot (with `options`), each of
  // `affected` bound on it with `instances` (validated on the probe when `validation`), and the
  // context told BeforeLoadNetwork of `hooked`. A refusal names `label`'s generation.
  Status PrepareSlot(PreparedSlot& into, const loader::GenerationLease& generation,
                     std::string_view label, const std::vector<Affected>& affected,
                     InstanceMap instances, const BackendOptions* options,
                     const SwapValidation* validation, const std::vector<NetworkId>& hooked);

 private:
  void ReplaceActive();
  void BindBeside();
  void ReleaseTurn() { turn_ = {}; }

  Runtime& runtime_;
  const Policy policy_;
  const uint64_t version_;
  const std::string id_;
  const uint64_t previous_generation_;  // the active one before (the candidate's stable one)
  std::optional<BackendSlot> replaced_;
  std::optional<RolloutSlots> replaced_rollout_;
  std::unique_lock<Mutex> turn_;
};

}  // namespace backplane
