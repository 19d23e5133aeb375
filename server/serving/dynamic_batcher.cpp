#include "serving/dynamic_batcher.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/core/thread_name.hpp"
#include "metrics/metrics.hpp"

namespace backplane::server {

using Clock = DynamicBatcher::Clock;

namespace {

Status DeadlinePassed() {
  return Status(StatusCode::kDeadlineExceeded,
                "the request's deadline passed while it waited for a batch; it was not run");
}

}  // namespace

struct DynamicBatcher::Arrival {
  uint64_t sequence = 0;
  Clock::time_point arrived;
  std::optional<Clock::time_point> deadline;
  Runtime::InputsFactory make_inputs;
  std::function<CallOptions()> call_options;  // read after the parse; null: none
  Runtime::ExecuteCallback done;
};

// One batch's requests, oldest first, and its rows.
struct DynamicBatcher::Batch {
  std::vector<BatchRequest> requests;
  int64_t rows = 0;
};

// The state the batcher's threads, the callers and the batches' callbacks share; a callback keeps
// it alive past the batcher (see the traps in the header).
struct DynamicBatcher::Shared {
  explicit Shared(BatchQueue::Options options) : queue(std::move(options)) {}

  Mutex mutex;
  std::condition_variable_any changed;  // for the dispatcher; waits on `mutex` itself
  std::deque<Arrival> arrivals BACKPLANE_GUARDED_BY(mutex);  // to parse
  // Every parsed request, grouped; whoever adds to it takes what is due (DynamicBatcher::Add).
  BatchQueue queue BACKPLANE_GUARDED_BY(mutex);
  // Requests taken and not yet handed to a batch or answered: arrivals and grouped.
  std::size_t waiting BACKPLANE_GUARDED_BY(mutex) = 0;
  int executing BACKPLANE_GUARDED_BY(mutex) = 0;      // batches handed to the runtime
  uint64_t finished BACKPLANE_GUARDED_BY(mutex) = 0;  // batches done: a slot came free
  // When the dispatcher wakes up without news (nullopt: never). An addition that makes
  // something due sooner sets `due_sooner` and wakes it; nothing else does.
  std::optional<Clock::time_point> dispatcher_wakes_at BACKPLANE_GUARDED_BY(mutex);
  bool due_sooner BACKPLANE_GUARDED_BY(mutex) = false;
  bool stopping BACKPLANE_GUARDED_BY(mutex) = false;          // the dispatcher's
  bool parsers_stopping BACKPLANE_GUARDED_BY(mutex) = false;  // set and joined first
  uint64_t next_sequence BACKPLANE_GUARDED_BY(mutex) = 0;     // arrival order (preserve_ordering)
  std::condition_variable_any arrived;  // for the parsers: an arrival, or stopping

  // What is due at `now`: the requests whose deadline passed (never run: a batch taken here
  // holds none), and the batches to send, an execution slot taken for each while one of
  // `slots` is free.
  struct Due {
    std::vector<BatchRequest> expired;
    std::vector<std::shared_ptr<Batch>> batches;
  };
  Due TakeDue(Clock::time_point now, int slots) BACKPLANE_REQUIRES(mutex) {
    Due due;
    due.expired = queue.TakeExpired(now);
    waiting -= due.expired.size();
    while (executing < slots && !stopping) {
      auto requests = queue.TakeBatch(now);
      if (requests.empty())
        break;
      waiting -= requests.size();
      ++executing;
      auto batch = std::make_shared<Batch>();
      for (const auto& request : requests)
        batch->rows += request.rows;
      batch->requests = std::move(requests);
      due.batches.push_back(std::move(batch));
    }
    return due;
  }

  void FinishBatch() BACKPLANE_EXCLUDES(mutex) {
    {
      MutexLock lock(mutex);
      --executing;
      ++finished;
    }
    changed.notify_all();
  }
};

namespace {

// Every request's inputs joined along the first dimension, in request order, then zero rows up
// to `execution_rows`. One request's are moved, not copied, when they need no padding.
template <typename BatchType>
std::vector<Tensor> JoinInputs(BatchType& batch, int64_t execution_rows) {
  if (batch.requests.size() == 1 && batch.rows == execution_rows)
    return std::move(batch.requests.front().inputs);
  std::vector<Tensor> joined;
  const std::size_t input_count = batch.requests.front().inputs.size();
  for (std::size_t i = 0; i < input_count; ++i) {
    TensorInfo info = batch.requests.front().inputs[i].info();
    info.shape[0] = execution_rows;
    Tensor tensor(info);
    std::byte* out = tensor.bytes().data();
    for (auto& request : batch.requests) {
      const auto bytes = request.inputs[i].bytes();
      if (!bytes.empty())
        std::memcpy(out, bytes.data(), bytes.size());
      out += bytes.size();
      request.inputs[i] = Tensor();  // its memory back as soon as it is copied
    }
    std::fill(out, tensor.bytes().data() + tensor.bytes().size(), std::byte{0});
    joined.push_back(std::move(tensor));
  }
  return joined;
}

// Each request's rows of every output, in request order (rows past theirs are padding, dropped);
// kInternal naming the output when one does not carry the batch along its first dimension.
std::vector<Result<std::vector<Tensor>>> SplitOutputs(std::vector<Tensor> outputs,
                                                      std::span<const int64_t> rows,
                                                      int64_t total_rows, const std::string& what) {
  std::vector<Result<std::vector<Tensor>>> answers;
  if (rows.size() == 1 && rows[0] == total_rows) {
    answers.emplace_back(std::move(outputs));
    return answers;
  }
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const Shape& shape = outputs[o].info().shape;
    if (shape.empty() || shape[0] != total_rows) {
      const Status error(StatusCode::kInternal,
                         what + ": output #" + std::to_string(o) + " has shape " + ToString(shape) +
                             " for a batch of " + std::to_string(total_rows) +
                             " rows; its first dimension must be the batch to split it back. "
                             "Remove dynamic_batching from the model's config.json");
      return std::vector<Result<std::vector<Tensor>>>(rows.size(), error);
    }
  }
  std::vector<std::vector<Tensor>> split(rows.size());
  for (auto& output : outputs) {
    const std::size_t row_bytes =
        total_rows == 0 ? 0 : output.bytes().size() / static_cast<std::size_t>(total_rows);
    const std::byte* in = output.bytes().data();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      TensorInfo info = output.info();
      info.shape[0] = rows[r];
      const std::size_t size = row_bytes * static_cast<std::size_t>(rows[r]);
      split[r].emplace_back(std::move(info), std::vector<std::byte>(in, in + size));
      in += size;
    }
    output = Tensor();  // the batch's memory back before the answers are rendered
  }
  for (auto& request_outputs : split)
    answers.emplace_back(std::move(request_outputs));
  return answers;
}

}  // namespace

DynamicBatcher::DynamicBatcher(Runtime& runtime, Options options)
    : runtime_(runtime),
      options_(std::move(options)),
      execution_sizes_(
          ExecutionBatchSizes(options_.max_batch_size, options_.batching.preferred_batch_sizes)),
      max_executing_(options_.batching.preserve_ordering
                         ? 1
                         : std::max(1, options_.limits.max_concurrent_batches)),
      shared_(std::make_shared<Shared>(BatchQueue::Options{
          .max_queue_delay = std::chrono::microseconds(options_.batching.max_queue_delay_us),
          .preserve_ordering = options_.batching.preserve_ordering,
          .max_batch_size = options_.max_batch_size,
          .preferred_batch_sizes = options_.batching.preferred_batch_sizes,
          .waits_skipped =
              options_.metrics != nullptr ? &options_.metrics->batching.waits_skipped : nullptr})) {
  // Parsers finish out of order; the dispatcher groups in arrival order (preserve_ordering too).
  const int parsers = std::max(1, options_.limits.max_concurrent_batches);
  for (int i = 0; i < parsers; ++i)
    parsers_.emplace_back([this] {
      NameThisThread("bp-batch-parse");
      Parse();
    });
  dispatcher_ = std::thread([this] {
    NameThisThread("bp-batch-disp");
    Dispatch();
  });
}

DynamicBatcher::~DynamicBatcher() {
  // Parsers first: what one is parsing reaches the queue, which the dispatcher then drains.
  {
    MutexLock lock(shared_->mutex);
    shared_->parsers_stopping = true;
  }
  shared_->arrived.notify_all();
  for (auto& parser : parsers_)
    parser.join();
  {
    MutexLock lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->changed.notify_all();
  dispatcher_.join();
}

void DynamicBatcher::Submit(QueuedRequest request) {
  std::optional<Arrival> parse_here;
  bool taken = false;
  {
    MutexLock lock(shared_->mutex);
    if (shared_->waiting < options_.limits.max_waiting_requests && !shared_->stopping) {
      taken = true;
      ++shared_->waiting;
      Arrival arrival{.sequence = shared_->next_sequence++,
                      .arrived = Clock::now(),
                      .deadline = request.deadline,
                      .make_inputs = std::move(request.inputs),
                      .call_options = std::move(request.call_options),
                      .done = std::move(request.finish)};
      if (request.run_on == RunOn::kCaller)
        parse_here = std::move(arrival);
      else
        shared_->arrivals.push_back(std::move(arrival));
    }
  }
  if (parse_here) {
    ParseArrival(std::move(*parse_here), RunOn::kCaller);
  } else if (taken) {
    shared_->arrived.notify_one();
  } else {
    request.finish(
        Status(StatusCode::kResourceExhausted,
               options_.what + " has " + std::to_string(options_.limits.max_waiting_requests) +
                   " requests waiting for a batch, the server's max_in_flight; retry later"));
  }
}

void DynamicBatcher::Parse() {
  while (true) {
    Arrival arrival;
    {
      MutexLock lock(shared_->mutex);
      shared_->arrived.wait(shared_->mutex, [&] {
        shared_->mutex.AssertHeld();
        return shared_->parsers_stopping || !shared_->arrivals.empty();
      });
      if (shared_->parsers_stopping)
        return;  // the dispatcher answers what is left
      arrival = std::move(shared_->arrivals.front());
      shared_->arrivals.pop_front();
    }
    ParseArrival(std::move(arrival), RunOn::kQueue);
  }
}

void DynamicBatcher::ParseArrival(Arrival arrival, RunOn run_on) {
  // A failure is answered here, alone, and never reaches a batch; the queue still hears of it,
  // to keep the arrival order (and to count it as no longer waiting).
  // The mark goes first: the answer may release the model version that owns this batcher.
  const auto answer_alone = [&](Status status) {
    Add(BatchRequest{.sequence = arrival.sequence, .answered = true}, run_on);
    arrival.done(std::move(status));
  };
  if (arrival.deadline && Clock::now() > *arrival.deadline)
    return answer_alone(DeadlinePassed());
  auto inputs = arrival.make_inputs();
  arrival.make_inputs = nullptr;  // what it refers to (the body) goes as soon as it is parsed
  if (!inputs.ok())
    return answer_alone(std::move(inputs).error());
  // The request's one row check (RuntimeQueue makes it for a model that does not batch): the
  // batcher never joins what it could not split back.
  auto rows = BatchRows(*inputs, Network{}, options_.max_batch_size, options_.what);
  if (!rows.ok())
    return answer_alone(std::move(rows).error());
  BatchRequest parsed{.sequence = arrival.sequence,
                      .arrived = arrival.arrived,
                      .deadline = arrival.deadline,
                      .inputs = std::move(inputs).value(),
                      .rows = rows.value(),
                      .key = {},
                      .done = std::move(arrival.done)};
  if (arrival.call_options)
    parsed.call_options = arrival.call_options();
  parsed.key = BatchKey(parsed.inputs, parsed.call_options);
  if (parsed.rows == 0) {
    // Zero rows run alone, untouched, as the model unbatched runs them, so that they get its
    // answer: joined to others they would get an empty slice of a batch's outputs where the
    // model alone fails (CpuAcc runs no empty tensor), and several zero-row requests would
    // run as one. A key of its own: no group has it.
    parsed.key += "alone#" + std::to_string(parsed.sequence);
    parsed.alone = true;
  }
  Add(std::move(parsed), run_on);
}

void DynamicBatcher::Add(BatchRequest request, RunOn run_on) {
  // Whoever adds a request takes what the addition makes due, so that a full batch leaves without
  // waking the dispatcher; the dispatcher hears of an addition only when it makes something due
  // sooner than it would wake (a new group's wait, a deadline).
  Shared::Due due;
  const auto now = Clock::now();
  bool wake = false;
  {
    MutexLock lock(shared_->mutex);
    shared_->waiting -= shared_->queue.Add(std::move(request));
    due = shared_->TakeDue(now, max_executing_);
    const auto next = shared_->queue.NextDue(shared_->executing < max_executing_);
    if (next && !shared_->stopping &&
        (!shared_->dispatcher_wakes_at || *next < *shared_->dispatcher_wakes_at)) {
      shared_->dispatcher_wakes_at = next;
      shared_->due_sooner = true;
      wake = true;
    }
  }
  if (wake)
    shared_->changed.notify_all();
  for (auto& expired : due.expired)
    expired.done(DeadlinePassed());
  // On the caller's thread (RunOn::kCaller), the last batch runs here: its requests are
  // answered without a hand-off to a worker and back. Trap: the answers may release the model
  // version that owns this batcher, so nothing of `this` is touched once they are given.
  auto& batches = due.batches;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const bool here = i + 1 == batches.size() && run_on == RunOn::kCaller;
    Execute(std::move(batches[i]), now, here ? RunOn::kCaller : RunOn::kQueue);
  }
}

void DynamicBatcher::Dispatch() {
  uint64_t finished_seen = 0;
  while (true) {
    // Wait for news (a batch's end, something due sooner, stopping) or for what is due.
    Shared::Due due;
    Clock::time_point now;
    {
      MutexLock lock(shared_->mutex);
      const auto news = [&] {
        shared_->mutex.AssertHeld();
        return shared_->stopping || shared_->due_sooner || shared_->finished != finished_seen;
      };
      // A copy: adders change the shared one while the wait has the mutex released.
      const auto wakes_at = shared_->queue.NextDue(shared_->executing < max_executing_);
      shared_->dispatcher_wakes_at = wakes_at;
      shared_->due_sooner = false;
      if (wakes_at)
        shared_->changed.wait_until(shared_->mutex, *wakes_at, news);
      else
        shared_->changed.wait(shared_->mutex, news);
      if (shared_->stopping)
        break;
      finished_seen = shared_->finished;
      // Act: answer what expired, send what is due while slots are free.
      now = Clock::now();
      due = shared_->TakeDue(now, max_executing_);
    }
    for (auto& request : due.expired)
      request.done(DeadlinePassed());
    for (auto& batch : due.batches)
      Execute(std::move(batch), now, RunOn::kQueue);
  }
  AnswerStopped();
}

void DynamicBatcher::AnswerStopped() {
  std::deque<Arrival> arrivals;
  std::vector<BatchRequest> grouped;
  {
    MutexLock lock(shared_->mutex);
    arrivals.swap(shared_->arrivals);
    grouped = shared_->queue.TakeAll();
  }
  const Status stopped(StatusCode::kUnavailable, options_.what + " stopped serving");
  for (auto& arrival : arrivals)
    arrival.done(stopped);
  for (auto& request : grouped)
    request.done(stopped);
}

void DynamicBatcher::Execute(std::shared_ptr<Batch> batch, Clock::time_point now, RunOn run_on) {
  if (options_.metrics != nullptr) {
    BatchingMetrics& metrics = options_.metrics->batching;
    metrics.executions.fetch_add(1, std::memory_order_relaxed);
    metrics.batch_size.Observe(static_cast<double>(batch->rows));
    for (const auto& request : batch->requests)
      metrics.queue_delay_seconds.Observe(
          std::chrono::duration<double>(now - request.arrived).count());
  }
  std::vector<int64_t> rows;
  for (const auto& request : batch->requests)
    rows.push_back(request.rows);
  // The batch never exceeds max_batch_size, the last execution size.
  const int64_t execution_rows =
      batch->rows == 0
          ? 0
          : *std::lower_bound(execution_sizes_.begin(), execution_sizes_.end(), batch->rows);
  std::vector<Tensor> inputs = JoinInputs(*batch, execution_rows);
  const bool answer_before_freeing = options_.batching.preserve_ordering;
  // The completion holds the shared state and the batch, never `this` (see the header's traps).
  // The metrics outlive this batcher, which outlives the batch's requests: it may use them until
  // it answers the first request.
  auto complete = [shared = shared_, batch, rows = std::move(rows), what = options_.what,
                   answer_before_freeing, execution_rows, metrics = options_.metrics,
                   left = Clock::now()](Result<std::vector<Tensor>> outputs) {
    if (metrics != nullptr && outputs.ok()) {
      metrics->batching.ObserveExecution(
          execution_rows, std::chrono::duration<double>(Clock::now() - left).count());
    }
    std::vector<Result<std::vector<Tensor>>> answers;
    if (outputs.ok()) {
      answers = SplitOutputs(std::move(outputs).value(), rows, execution_rows, what);
    } else {
      answers.assign(batch->requests.size(), outputs.error());
    }
    // With preserve_ordering the next batch may not start answering before this one has.
    if (!answer_before_freeing)
      shared->FinishBatch();
    for (std::size_t i = 0; i < batch->requests.size(); ++i) {
      auto done = std::move(batch->requests[i].done);
      done(std::move(answers[i]));
    }
    if (answer_before_freeing)
      shared->FinishBatch();
  };
  // Every request of a batch has the same options (they are part of its key).
  CallOptions call_options = batch->requests.front().call_options;
  if (run_on == RunOn::kQueue) {
    runtime_.ExecuteAsync(options_.network, std::move(inputs), std::move(complete), std::nullopt,
                          std::move(call_options));
    return;
  }
  std::vector<ConstTensorView> views;
  views.reserve(inputs.size());
  for (const auto& tensor : inputs)
    views.push_back(tensor.View());
  auto outputs = runtime_.Execute(options_.network, views, {}, call_options);
  views.clear();
  inputs.clear();  // the batch's memory back before the answers are rendered
  complete(std::move(outputs));
}

}  // namespace backplane::server
