// The dynamic batcher of one served model version (Triton's dynamic_batching): requests that
// arrive close together are joined along their first dimension into one execution, and the
// outputs are split back per request. Transport-neutral: the serving core (inference.cpp) hands
// it every request of a model whose config.json has "dynamic_batching", REST and gRPC alike.
//
// Traps kept in mind here:
// - A batch is one Runtime::ExecuteAsync call, so it runs wholly on one generation of each
//   backend, and a swap while requests wait loses none: they wait on the network id, which the
//   runtime migrates under them.
// - A batch executes at one of a few sizes (ExecutionBatchSizes), padded with zero rows: every
//   size is a shape program the network compiles and keeps, so arbitrary sizes would evict and
//   recompile them without end. The padding rows' outputs are dropped.
// - Requests are joined only when every input agrees in datatype and in every dimension but the
//   first: the key of a request is exactly that, and groups of different keys never mix. A
//   request of zero rows joins none: it executes alone and untouched, so that it gets the answer
//   the model gives it unbatched (an empty slice of others' outputs would be 200 where that is an
//   error).
// - Joining and padding are safe only because the model's rows are independent, which its load
//   checked (CheckBatchable): a row's outputs then depend on that row alone, never on the rows
//   beside it, whether another client's or zeros.
// - A request that fails its parse, or whose deadline passes while it waits, is answered alone
//   and never reaches a batch; an execution error answers every request of that batch (and only
//   those) with the error.
// - The callbacks of a batch outlive nothing: what they touch lives in a shared state, since the
//   answer to the last request may drop the last reference to the model version that owns the
//   batcher (it is then destroyed on the loader's reaper thread while the callback still runs).
// - Bounded: at most `max_waiting_requests` wait (beyond: kResourceExhausted at once), and at most
//   `max_concurrent_batches` execute; while they do, requests gather into larger batches.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backplane/runtime/runtime.hpp"
#include "serving/batch_queue.hpp"
#include "serving/batching_config.hpp"
#include "serving/request_queue.hpp"

namespace backplane::server {

struct ModelMetrics;

// What the server allows every batcher, from its own configuration.
struct BatcherLimits {
  // Batches of one model version executing at once (the runtime's threads: more only queue in
  // its scheduler, fewer leave cores idle).
  int max_concurrent_batches = 1;
  // Requests waiting for a batch in one batcher (the server's max_in_flight: a request waiting
  // here is one the server took).
  std::size_t max_waiting_requests = 256;
};

// Thread-safe. Owns parser threads (one per execution slot), which parse arrivals off the
// transports' threads (RunOn::kQueue), and one dispatcher thread, which sends the batches that
// become due with time (a wait's end) and answers expired deadlines. JSON of a 784-float row
// cost more than its share of a batched execution, so one thread that parsed everything capped
// the batched wide MLP at about one core's worth of parsing.
//
// Every hand-off costs a wake-up, so the thread that adds a request to the queue (a BatchQueue,
// under one mutex) takes the batches the addition makes due: a parser sends them to the
// runtime's workers; a caller that may spend its thread on the request (RunOn::kCaller: gRPC's)
// executes the batch it completed and answers its requests itself. The dispatcher is woken only
// when an addition makes something due sooner than it would wake, or a batch's end frees a slot.
class DynamicBatcher final : public RequestQueue {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    NetworkId network = 0;
    std::string what;  // "model 'm' version 1", in messages
    int64_t max_batch_size = 1;
    DynamicBatching batching;
    BatcherLimits limits;
    ModelMetrics* metrics = nullptr;  // batch sizes, queue delays, executions; outlives this
  };
  // `runtime` outlives the batcher.
  DynamicBatcher(Runtime& runtime, Options options);
  // Stops the dispatcher; a request still waiting (none should: each holds the model version
  // that owns this) is answered kUnavailable.
  ~DynamicBatcher();
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues one request: its parse runs first (on a parser thread, or before Submit returns with
  // RunOn::kCaller, which may also execute a batch there); `finish` gets this request's rows of
  // every output, or its error, on a TBB worker, a parser, the dispatcher or a caller's thread.
  // Refused at once on the caller's thread with kResourceExhausted when max_waiting_requests wait
  // already. kInvalidArgument for inputs whose first dimensions differ or exceed max_batch_size;
  // kDeadlineExceeded when the deadline passes before the request's batch leaves. The routing key
  // is not read: a batch mixes clients.
  void Submit(QueuedRequest request) override;

 private:
  struct Shared;
  struct Arrival;
  struct Batch;
  void Parse();  // a parser thread's loop
  // Parses one arrival and adds it to the queue (or answers it alone when it fails).
  void ParseArrival(Arrival arrival, RunOn run_on);
  // Groups `request` and takes the batches now due while slots are free: on the caller's thread
  // (RunOn::kCaller) the last of them executes here, the others go to the runtime's workers.
  void Add(BatchRequest request, RunOn run_on);
  void Dispatch();  // the dispatcher thread's loop: wait for news or what is due, then act
  // Stopping (the parsers have stopped): answers every request still held kUnavailable. None
  // should be: each holds the model version that owns this batcher.
  void AnswerStopped();
  // Executes `batch` (its slot taken) here (kCaller) or on a runtime worker (kQueue), answers
  // every request of it and frees the slot.
  void Execute(std::shared_ptr<Batch> batch, Clock::time_point now, RunOn run_on);

  Runtime& runtime_;
  const Options options_;
  // ExecutionBatchSizes: a batch runs at the smallest of these that holds its rows.
  const std::vector<int64_t> execution_sizes_;
  // Batches executing at once: one with preserve_ordering, else max_concurrent_batches.
  const int max_executing_;
  const std::shared_ptr<Shared> shared_;
  // Started in the constructor's body, when everything they use exists.
  std::vector<std::thread> parsers_;  // parse arrivals (JSON costs more than batching saves)
  std::thread dispatcher_;
};

}  // namespace backplane::server
