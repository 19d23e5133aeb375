// What every change to a runtime's backend slots shares (a generation swap, a candidate arriving
// or leaving): the runtime's turn to call its backends, the state version it was prepared
// against, and the AfterLoadNetwork hooks of the context it placed. Private to the runtime.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/backend_call_record.hpp"
#include "backplane/runtime/runtime.hpp"
#include "runtime_log.hpp"

namespace backplane {

class Runtime::SlotChange : public PreparedChange {
 public:
  SlotChange(Runtime& runtime, uint64_t version, std::string id)
      : runtime_(runtime), version_(version), id_(std::move(id)) {}
  // Derived classes call ReleaseTurn() first in their destructors: what a change replaced must
  // be unreachable before it is released, and it is a derived member.
  ~SlotChange() override = default;

  // The runtime's turn to call its backends, kept until AfterCommit has called the placed
  // context's AfterLoadNetwork hooks: no load or unload runs in between, and no hook runs under
  // mutex_.
  void BeginCommit() override { turn_ = std::unique_lock<Mutex>(runtime_.backend_mutex_); }
  std::unique_lock<Mutex> LockState() override { return std::unique_lock<Mutex>(runtime_.mutex_); }
  bool IsCurrent() const override {
    runtime_.mutex_.AssertHeld();
    return runtime_.state_version_ == version_;
  }

 protected:
  // In AfterCommit: the context of `placed` (null, or no context: none to tell) hears
  // AfterLoadNetwork of `networks`, which it heard BeforeLoadNetwork of while the change was
  // prepared; then the turn is released. `placed` stays where it is while the turn is held.
  void TellLoadedAndReleaseTurn(const BackendSlot* placed, const std::vector<NetworkId>& networks,
                                std::string_view what) {
    if (placed != nullptr && placed->context != nullptr) {
      for (NetworkId network_id : networks) {
        Status after = GuardBackendCall(id_, "AfterLoadNetwork", [&] {
          const ScopedBackendCall hook(
              placed->instance->CallSite("IBackendContext::AfterLoadNetwork"));
          return placed->context->AfterLoadNetwork(network_id);
        });
        if (!after.ok()) {
          RuntimeLog().warn("backend {}{}: AfterLoadNetwork({}) failed: {}", id_, what, network_id,
                            after.message());
        }
      }
    }
    ReleaseTurn();
  }
  void ReleaseTurn() { turn_ = {}; }

  Runtime& runtime_;
  const uint64_t version_;
  const std::string id_;

 private:
  std::unique_lock<Mutex> turn_;
};

}  // namespace backplane
