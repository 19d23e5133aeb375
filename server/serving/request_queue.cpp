#include "serving/request_queue.hpp"

#include <utility>
#include <vector>

#include "metrics/metrics.hpp"
#include "serving/batching_config.hpp"

namespace backplane::server {

void RuntimeQueue::Submit(QueuedRequest request) {
  // The parse, the row check and the count of an execution happen when a worker (or the caller)
  // takes the inputs: a request refused or expired in the scheduler's queue never executed.
  // Captures values, not `this`: the last request's answer may let the version owning this go.
  auto inputs = [make = std::move(request.inputs), max_batch_size = options_.max_batch_size,
                 what = options_.what,
                 metrics = options_.metrics]() -> Result<std::vector<Tensor>> {
    auto taken = make();
    if (!taken.ok())
      return taken;
    if (max_batch_size > 0) {
      if (auto rows = BatchRows(*taken, Network{}, max_batch_size, what); !rows.ok())
        return std::move(rows).error();
    }
    if (metrics != nullptr)
      metrics->batching.executions.fetch_add(1, std::memory_order_relaxed);
    return taken;
  };
  if (request.run_on == RunOn::kQueue) {
    runtime_.ExecuteAsync(options_.network, std::move(inputs), std::move(request.finish),
                          request.deadline, std::move(request.routing_key),
                          std::move(request.call_options));
    return;
  }
  if (request.deadline && std::chrono::steady_clock::now() > *request.deadline) {
    request.finish(Status(StatusCode::kDeadlineExceeded,
                          "the request's deadline passed before it started; it was not run"));
    return;
  }
  auto taken = inputs();
  if (!taken.ok())
    return request.finish(std::move(taken).error());
  std::vector<ConstTensorView> views;
  views.reserve(taken->size());
  for (const auto& tensor : *taken)
    views.push_back(tensor.View());
  const std::string routing_key = request.routing_key ? request.routing_key() : std::string();
  const CallOptions call_options = request.call_options ? request.call_options() : CallOptions{};
  auto outputs = runtime_.Execute(options_.network, views, routing_key, call_options);
  views.clear();
  taken = std::vector<Tensor>();  // the inputs' memory back before the answer is rendered
  request.finish(std::move(outputs));
}

}  // namespace backplane::server
