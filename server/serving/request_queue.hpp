// Where the admitted requests of one served model version go: a queue chosen once, when the
// version is prepared — straight to the runtime (RuntimeQueue), or to the version's dynamic
// batcher (dynamic_batcher.hpp). The request path (inference.cpp) hands every request to its
// version's queue the same way, so no transport and no caller knows whether a model batches.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "backplane/runtime/runtime.hpp"

namespace backplane::server {

struct ModelMetrics;

// What the thread that starts a request may spend on it.
enum class RunOn {
  // Nothing but admission: the parse and the execution happen where the request is queued (a TBB
  // worker, or a batcher's parser thread). For transports whose threads must stay free (REST's few
  // I/O threads hold every connection; a large JSON body parses for milliseconds).
  kQueue,
  // The parse, and an unbatched model's execution, on the calling thread before the call returns
  // (`finish` runs there too); a batched request leaves it once parsed. Every hand-off costs a
  // wake-up, which costs more than the parse of raw tensors (gRPC's callback threads).
  kCaller,
};

// One admitted request as a queue takes it. The queue calls `inputs` once (where `run_on` says),
// then `finish` once, last, with this request's outputs or why it has none.
struct QueuedRequest {
  Runtime::InputsFactory inputs;    // the parse: the inputs in the network's order
  Runtime::ExecuteCallback finish;  // on a TBB worker, a batcher thread, or the caller's
  // kDeadlineExceeded when it passes before the request starts (batched: before its batch leaves).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  RunOn run_on = RunOn::kQueue;
  // Read after the parse: the request's id, which keeps a client's requests on one generation
  // while a backend rollout runs (Runtime::ExecuteAsync). Null: none.
  std::function<std::string()> routing_key;
  // Read after the parse: the request's per-call backend options (Runtime::CallOptions). Null:
  // none. A batcher joins only requests whose options are equal.
  std::function<CallOptions()> call_options;
};

// Thread-safe.
class RequestQueue {
 public:
  virtual ~RequestQueue() = default;
  // A refusal (the queue is full, stopping) calls `finish` on the caller's thread before Submit
  // returns.
  virtual void Submit(QueuedRequest request) = 0;
};

// A model version that does not batch: each request is one execution of the runtime's, on the
// caller's thread (RunOn::kCaller, through Runtime::Execute) or queued on its scheduler
// (Runtime::ExecuteAsync, within its limit of requests in flight). A model with max_batch_size
// has each request's rows checked against it here, once.
class RuntimeQueue final : public RequestQueue {
 public:
  struct Options {
    NetworkId network = 0;
    std::string what;                 // "model 'm' version 1", in messages
    int64_t max_batch_size = 0;       // 0: rows unchecked
    ModelMetrics* metrics = nullptr;  // executions; outlives every request of this queue
  };
  // `runtime` outlives the queue and every request it took.
  RuntimeQueue(Runtime& runtime, Options options)
      : runtime_(runtime), options_(std::move(options)) {}

  void Submit(QueuedRequest request) override;

 private:
  Runtime& runtime_;
  const Options options_;
};

}  // namespace backplane::server
