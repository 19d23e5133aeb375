// Takes a change to what a backend id offers through every subscriber: all prepare, then all
// commit together under a short lock each, or nothing changes. Private to the registry.
#pragma once

#include <cstdint>
#include <map>

#include "backplane/registry/backend_change.hpp"

namespace backplane::registry_detail {

// Thread-compatible: used in the registry's change sequence only, so that subscribers see
// changes one at a time and in order.
class ChangeCoordinator {
 public:
  uint64_t Subscribe(BackendSubscriber& subscriber);
  void Unsubscribe(uint64_t subscriber_id);

  // Every subscriber prepares `change`; then every prepared change is re-checked and committed
  // with all their state locks held, so that no subscriber switches unless all do. The first
  // refusal is returned as it is (its reason names the step) and nothing changes. When a
  // subscriber's state moved while it prepared (a network loaded meanwhile), all prepare again;
  // after a few such races it gives up with kPrepareFailed.
  Status Apply(const BackendChange& change);
  // The same for a change that cannot be refused (a withdrawal: the file is gone). A subscriber
  // that fails to prepare is left as it is, with a warning.
  void ApplyRegardless(const BackendChange& change);

 private:
  // nullopt: some subscriber's state moved; prepare again.
  std::optional<Status> TryApply(const BackendChange& change, bool regardless);

  std::map<uint64_t, BackendSubscriber*> subscribers_;  // by subscription order
  uint64_t next_subscriber_id_ = 1;
};

}  // namespace backplane::registry_detail
