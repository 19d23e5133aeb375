// The host's side of a backend that runs in a worker: IBackend, IWorkload and IBackendContext
// proxies whose every call crosses to the worker (backend_worker.hpp). Placement, swaps, options
// and execution use them exactly as an in-process backend's objects.
//
// A proxy keeps its worker alive (shared_ptr); once the worker died, every call fails with
// kUnavailable naming how, and destroying proxies is free (nothing to tell a dead worker).
#pragma once

#include <memory>
#include <string>

#include "backplane/isolation/backend_worker.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane::isolation {

// What the worker's library says of itself: GetBackendId, GetVersion, GetBackendRelease.
struct WorkerHello {
  std::string backend_id;
  BackendApiVersion api_version;
  std::string release;
};

// Asks the worker what it loaded; the worker's load error (dlopen, missing entry points) when it
// could not load the library.
Result<WorkerHello> Hello(BackendWorker& worker);

// A new instance of the worker's backend (its BackendFactory, run in the worker).
Result<std::unique_ptr<IBackend>> CreateIsolatedBackend(std::shared_ptr<BackendWorker> worker,
                                                        const WorkerHello& hello);

}  // namespace backplane::isolation
