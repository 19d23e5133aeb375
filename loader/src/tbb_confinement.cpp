#include "tbb_confinement.hpp"

namespace backplane::loader {

TbbConfinement::TbbConfinement() : observer_(arena_, *this) {
  arena_.initialize();
  observer_.observe(true);  // before anything can run in the arena: every entry is seen
}

TbbConfinement::~TbbConfinement() {
  observer_.observe(false);  // returns once no callback of ours runs any more
}

void TbbConfinement::Execute(const std::function<void()>& call) {
  arena_.execute(call);
}

void TbbConfinement::WaitUntilEmpty() {
  MutexLock lock(mutex_);
  while (inside_ != 0)
    empty_.wait(mutex_);
}

uint64_t TbbConfinement::entries() const {
  MutexLock lock(mutex_);
  return entries_;
}

void TbbConfinement::Entered() {
  MutexLock lock(mutex_);
  ++inside_;
  ++entries_;
}

void TbbConfinement::Left() {
  // Notified under the lock: the waiter may destroy this object as soon as it wakes.
  MutexLock lock(mutex_);
  if (--inside_ == 0)
    empty_.notify_all();
}

}  // namespace backplane::loader
