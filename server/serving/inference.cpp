#include "serving/inference.hpp"

#include <chrono>
#include <future>
#include <string>
#include <utility>

#include "metrics/metrics.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {
namespace {

using Clock = std::chrono::steady_clock;

// One request of a served model from its resolution to its outcome: counts it, holds its place
// under the model's max_in_flight until destroyed, and records its failure or its latency. The
// synchronous and the queued paths share it. Thread-compatible: it moves with the request.
class ModelCall {
 public:
  // kNotFound / kUnavailable from the resolution, kResourceExhausted at max_in_flight.
  static Result<std::unique_ptr<ModelCall>> Begin(const ServeContext& context,
                                                  std::string_view model_name,
                                                  std::string_view version_text) {
    auto resolved = ResolveModel(context.repository, model_name, version_text);
    if (!resolved.ok()) {
      // Count only models of the repository: labels from arbitrary client input would grow the
      // metrics without bound.
      if (resolved.error().code() == StatusCode::kUnavailable) {
        ModelMetrics& unavailable = context.metrics.ForModel(std::string(model_name));
        unavailable.requests.fetch_add(1, std::memory_order_relaxed);
        unavailable.CountFailure(resolved.error().code());
      }
      return resolved.error();
    }
    auto call = std::unique_ptr<ModelCall>(new ModelCall(std::move(resolved).value()));
    const ServingModel& model = *call->resolved_.model;
    const int64_t limit = model.config.max_in_flight;
    const int64_t before = call->metrics_.in_flight.fetch_add(1);
    if (limit > 0 && before >= limit) {
      call->metrics_.in_flight.fetch_sub(1);
      call->admitted_ = false;
      return call->Failed(Status(StatusCode::kResourceExhausted,
                                 "model '" + model.name + "' has " + std::to_string(limit) +
                                     " requests in flight, its max_in_flight; retry later"));
    }
    return call;
  }

  ~ModelCall() {
    if (admitted_)
      metrics_.in_flight.fetch_sub(1);
  }
  ModelCall(const ModelCall&) = delete;
  ModelCall& operator=(const ModelCall&) = delete;

  const ModelVersion& version() const { return *resolved_.version; }

  // The parser's error names the model and version. A model with max_batch_size also has its
  // request's rows checked against it (batching_config.hpp, BatchRows).
  Result<InferenceRequest> Parse(const InferenceRequestParser& parse) const {
    const std::string what =
        "model '" + resolved_.model->name + "' version " + std::to_string(version().version());
    auto parsed = parse(version().network());
    if (!parsed.ok())
      return Status(parsed.error().code(), what + ": " + parsed.error().message());
    if (const int64_t max_batch_size = resolved_.model->config.max_batch_size; max_batch_size > 0) {
      auto rows = BatchRows(parsed->inputs, version().network(), max_batch_size, what);
      if (!rows.ok())
        return rows.error();
    }
    return parsed;
  }

  void CountExecution() { metrics_.batching.executions.fetch_add(1, std::memory_order_relaxed); }

  // Counts a failure of this request and returns it.
  Status Failed(Status status) {
    metrics_.CountFailure(status.code());
    return status;
  }

  // The outcome: a failure counted (an internal one logged), or the outputs with the latency
  // observed.
  Result<InferenceOutcome> Finish(InferenceRequest request, Result<std::vector<Tensor>> outputs) {
    if (!outputs.ok()) {
      if (outputs.error().code() == StatusCode::kInternal) {
        Log().error("model {} version {}: {}", resolved_.model->name, version().version(),
                    outputs.error().message());
      }
      return Failed(std::move(outputs).error());
    }
    metrics_.latency_seconds.Observe(std::chrono::duration<double>(Clock::now() - start_).count());
    return InferenceOutcome{resolved_, std::move(request), std::move(outputs).value()};
  }

 private:
  explicit ModelCall(ResolvedModel resolved)
      : resolved_(std::move(resolved)), metrics_(*resolved_.model->metrics) {
    metrics_.requests.fetch_add(1, std::memory_order_relaxed);
  }

  const Clock::time_point start_ = Clock::now();
  const ResolvedModel resolved_;  // keeps the version loaded until the outcome is rendered
  ModelMetrics& metrics_;
  bool admitted_ = true;
};

// An admitted request queued on the runtime's scheduler, or on its model version's batcher (the
// same two closures either way): the execution and `done` happen there, and the parse too unless
// `parse_on` says the caller.
void Start(const ServeContext& context, std::unique_ptr<ModelCall> admitted,
           InferenceRequestParser parse, ParseOn parse_on,
           std::optional<Clock::time_point> deadline, InferenceDone done) {
  // Shared by the two closures: the parse fills the request, the completion renders from it.
  struct Pending {
    std::unique_ptr<ModelCall> call;
    InferenceRequestParser parse;
    InferenceRequest request;
  };
  auto pending = std::make_shared<Pending>(Pending{std::move(admitted), std::move(parse), {}});
  DynamicBatcher* batcher = pending->call->version().batcher();
  auto make_inputs = [pending]() -> Result<std::vector<Tensor>> {
    auto request = pending->call->Parse(pending->parse);
    pending->parse = nullptr;  // what it refers to (the body) goes as soon as it is parsed
    if (!request.ok())
      return std::move(request).error();
    pending->request = std::move(request).value();
    return std::move(pending->request.inputs);
  };
  auto finish = [pending, done = std::move(done)](Result<std::vector<Tensor>> outputs) {
    std::unique_ptr<ModelCall> call = std::move(pending->call);
    auto outcome = call->Finish(std::move(pending->request), std::move(outputs));
    // The model's slot is free before the answer leaves: a client's next request must not
    // find its own last one still counted.
    call.reset();
    done(std::move(outcome));
  };
  if (batcher != nullptr) {
    batcher->Submit(std::move(make_inputs), std::move(finish), deadline, parse_on);
    return;
  }
  Runtime::InputsFactory inputs = std::move(make_inputs);
  if (parse_on == ParseOn::kCaller) {
    inputs = [parsed = std::make_shared<Result<std::vector<Tensor>>>(inputs())] {
      return std::move(*parsed);
    };
  }
  // Counted as an execution when a worker takes the inputs (the batcher counts its batches): a
  // request refused or expired in the scheduler's queue never executed, wherever it was parsed.
  auto counted = [pending, inputs = std::move(inputs)]() -> Result<std::vector<Tensor>> {
    auto taken = inputs();
    if (taken.ok())
      pending->call->CountExecution();
    return taken;
  };
  // During a backend rollout, a request id keeps its client's requests on one generation.
  context.runtime.ExecuteAsync(pending->call->version().network_id(), std::move(counted),
                               std::move(finish), deadline,
                               [pending] { return pending->request.id.value_or(""); });
}

}  // namespace

Result<InferenceOutcome> RunInference(const ServeContext& context, std::string_view model_name,
                                      std::string_view version_text,
                                      const InferenceRequestParser& parse) {
  auto call = ModelCall::Begin(context, model_name, version_text);
  if (!call.ok())
    return std::move(call).error();
  if ((*call)->version().batcher() != nullptr) {
    // Batched: the request waits for its batch here (the transport's thread blocks, as it would
    // in Execute).
    std::promise<Result<InferenceOutcome>> answered;
    auto outcome = answered.get_future();
    Start(context, std::move(call).value(), parse, ParseOn::kCaller, std::nullopt,
          [&answered](Result<InferenceOutcome> result) { answered.set_value(std::move(result)); });
    return outcome.get();
  }
  auto request = (*call)->Parse(parse);
  if (!request.ok())
    return (*call)->Failed(std::move(request).error());
  (*call)->CountExecution();
  std::vector<ConstTensorView> views;
  views.reserve(request->inputs.size());
  for (const auto& tensor : request->inputs)
    views.push_back(tensor.View());
  auto outputs =
      context.runtime.Execute((*call)->version().network_id(), views, request->id.value_or(""));
  return (*call)->Finish(std::move(request).value(), std::move(outputs));
}

void StartInference(const ServeContext& context, std::string_view model_name,
                    std::string_view version_text, InferenceRequestParser parse, ParseOn parse_on,
                    std::optional<Clock::time_point> deadline, InferenceDone done) {
  auto call = ModelCall::Begin(context, model_name, version_text);
  if (!call.ok())
    return done(std::move(call).error());
  Start(context, std::move(call).value(), std::move(parse), parse_on, deadline, std::move(done));
}

}  // namespace backplane::server
