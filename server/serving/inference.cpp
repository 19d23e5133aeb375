#include "serving/inference.hpp"

#include <chrono>
#include <string>
#include <utility>

#include "metrics/metrics.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {
namespace {

using Clock = std::chrono::steady_clock;

// One request of a served model from its resolution to its outcome: counts it, holds its place
// under the model's max_in_flight until destroyed, and records its failure or its latency.
// Thread-compatible: it moves with the request.
class ModelCall {
 public:
  // kNotFound / kUnavailable from the resolution, kResourceExhausted at max_in_flight.
  static Result<std::unique_ptr<ModelCall>> Begin(const ModelRepository& repository,
                                                  ServerMetrics& metrics,
                                                  std::string_view model_name,
                                                  std::string_view version_text) {
    auto resolved = ResolveModel(repository, model_name, version_text);
    if (!resolved.ok()) {
      // Count only models of the repository: labels from arbitrary client input would grow the
      // metrics without bound.
      if (resolved.error().code() == StatusCode::kUnavailable) {
        ModelMetrics& unavailable = metrics.ForModel(std::string(model_name));
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

  // The parser's error names the model and version. (The rows of a model with max_batch_size
  // are checked by its version's queue.)
  Result<InferenceRequest> Parse(const InferenceRequestParser& parse) const {
    auto parsed = parse(version().network());
    if (!parsed.ok()) {
      return parsed.error().WithContext("model '" + resolved_.model->name + "' version " +
                                        std::to_string(version().version()) + ": ");
    }
    return parsed;
  }

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

}  // namespace

void InferenceApi::Infer(InferenceCall call) const {
  auto admitted = ModelCall::Begin(repository_, metrics_, call.model, call.version);
  if (!admitted.ok())
    return call.done(std::move(admitted).error());
  // Shared by the closures: the parse fills the request, the completion renders from it.
  struct Pending {
    std::unique_ptr<ModelCall> call;
    InferenceRequestParser parse;
    InferenceRequest request;
  };
  auto pending =
      std::make_shared<Pending>(Pending{std::move(admitted).value(), std::move(call.parse), {}});
  RequestQueue& queue = pending->call->version().queue();
  queue.Submit(QueuedRequest{
      .inputs = [pending]() -> Result<std::vector<Tensor>> {
        auto request = pending->call->Parse(pending->parse);
        pending->parse = nullptr;  // what it refers to (the body) goes as soon as it is parsed
        if (!request.ok())
          return std::move(request).error();
        pending->request = std::move(request).value();
        return std::move(pending->request.inputs);
      },
      .finish =
          [pending, done = std::move(call.done)](Result<std::vector<Tensor>> outputs) {
            std::unique_ptr<ModelCall> model_call = std::move(pending->call);
            auto outcome = model_call->Finish(std::move(pending->request), std::move(outputs));
            // The model's slot is free before the answer leaves: a client's next request must
            // not find its own last one still counted.
            model_call.reset();
            done(std::move(outcome));
          },
      .deadline = call.deadline,
      .run_on = call.run_on,
      // During a backend rollout, a request id keeps its client's requests on one generation.
      .routing_key = [pending] { return pending->request.id.value_or(""); },
      // The client's per-call backend options, from the request's parameters.
      .call_options = [pending] { return pending->request.options; },
  });
}

}  // namespace backplane::server
