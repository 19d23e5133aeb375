// Time spent crossing to backend code that runs in another process (isolation/), per thread.
#pragma once

#include <chrono>

namespace backplane {

// What the calling thread has spent so far on the way to and from backend code running in worker
// processes: each call's wall time less what the worker spent in the backend's code. A rollout
// takes it out of each run's latency, so that a candidate tried in a sandbox (or an isolated
// stable generation) is judged on its code, not on where that code runs.
inline std::chrono::nanoseconds& ThreadCrossingTime() {
  thread_local std::chrono::nanoseconds spent{0};
  return spent;
}

}  // namespace backplane
