// Which backends run in worker processes, and the loader's hook that starts them
// (loader::OutOfProcessRunner): the server's `backend_isolation` and `worker` settings.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "backplane/isolation/backend_worker.hpp"
#include "backplane/loader/generation.hpp"

namespace backplane::isolation {

struct IsolationPolicy {
  // Backend id -> whether its generations run in a worker ("process") or in the server ("none").
  std::map<std::string, bool, std::less<>> by_id;
  bool by_default = false;  // "*"
  WorkerOptions worker;     // every worker's limits

  bool Isolates(std::string_view backend_id) const {
    auto it = by_id.find(backend_id);
    return it != by_id.end() ? it->second : by_default;
  }
  // Whether some backend may run in a worker (else no worker is ever started).
  bool IsolatesAny() const;
};

// A worker's death, as the host knows it.
struct WorkerCrash {
  std::string backend_id;
  uint64_t generation = 0;
  std::string file;
  std::string sha256;
  pid_t pid = 0;
  WorkerDeath death;
};
using CrashListener = std::function<void(const WorkerCrash&)>;

// The loader's hook: starts a worker on each checked generation and asks what it loaded; keeps it
// when the policy isolates that backend id or the load requires a worker (a sandboxed rollout
// candidate), else ends it and lets the loader map the file here. (A backend whose id the policy
// leaves in-process thus costs one worker start per load, and only when some other id is
// isolated.) `on_crash` is told, on the worker's monitor thread, when a
// worker dies other than by its generation's end.
loader::OutOfProcessRunner MakeWorkerRunner(IsolationPolicy policy, CrashListener on_crash = {});

}  // namespace backplane::isolation
