// The calls a host makes to a backend worker, one per SDK call, and the layout of each: written by
// isolated_backend.cpp, read by worker_main.cpp (both sides of one build). Every request starts
// with its Call; every reply with a Status.
#pragma once

#include <cstdint>

namespace backplane::isolation {

enum class Call : uint32_t {
  kHello = 1,        // -> id, API major, minor, release (or the load error)
  kCreateBackend,    // -> handle (BackendFactory, SetHost with the worker's host services)
  kDestroyBackend,   // handle -> (Shutdown, then the destructor)
  kIsSupported,      // handle, OperatorDesc -> Status
  kCreateWorkload,   // handle, OperatorDesc -> workload handle
  kCompileSubgraph,  // handle, SubgraphDesc -> workload handle, layer notes
  kDestroyWorkload,  // workload handle ->
  kExecute,          // workload, inputs (info, aligned bytes), output infos -> output offset
  kCreateContext,    // handle -> context handle (0: the backend has no context)
  kContextHook,      // context, hook (0..3), network id -> Status
  kDestroyContext,   // context ->
  kDescribeOptions,  // handle -> descriptors
  kUpdateOptions,    // handle, options -> Status
  kGetOption,        // handle, key -> value
  // SDK 1.3, sent only for a library built against 1.3 or later (BackendInstance gates on the
  // version kHello reported; the worker refuses them for an older one: its vtable has no slot).
  kCreateWorkloadWithOptions,   // handle, OperatorDesc, options -> workload handle
  kCompileSubgraphWithOptions,  // handle, SubgraphDesc, options -> workload handle, layer notes
  kCheckOptions,                // handle, options -> Status
  // SDK 1.4, sent only for a library built against 1.4 or later, like the 1.3 calls.
  kDescribeCallOptions,  // handle -> option names
  // As kExecute, with the call's options (every declared option at this call's value) after the
  // output infos, so that the tensors' alignment is kExecute's.
  kExecuteWithOptions,
};

// Tensor data in a slot starts on a cache line.
inline constexpr std::size_t kTensorAlignment = 64;

// The file descriptors a worker starts with (everything else is closed).
inline constexpr int kChannelFd = 3;
inline constexpr int kImageFd = 4;

}  // namespace backplane::isolation
