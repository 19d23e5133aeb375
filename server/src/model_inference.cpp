#include "model_inference.hpp"

#include <chrono>
#include <string>

#include "http_server.hpp"
#include "metrics.hpp"
#include "server_log.hpp"

namespace backplane::server {
namespace {

// Admits one request of a model against its max_in_flight; releases on destruction.
class ModelAdmission {
 public:
  ModelAdmission(ModelMetrics& metrics, int64_t limit) : metrics_(metrics) {
    const int64_t before = metrics_.in_flight.fetch_add(1);
    admitted_ = limit <= 0 || before < limit;
    if (!admitted_)
      metrics_.in_flight.fetch_sub(1);
  }
  ~ModelAdmission() {
    if (admitted_)
      metrics_.in_flight.fetch_sub(1);
  }
  ModelAdmission(const ModelAdmission&) = delete;
  ModelAdmission& operator=(const ModelAdmission&) = delete;
  bool admitted() const { return admitted_; }

 private:
  ModelMetrics& metrics_;
  bool admitted_ = false;
};

}  // namespace

Result<InferenceOutcome> RunInference(const ServeContext& context, std::string_view model_name,
                                      std::string_view version_text,
                                      const InferenceRequestParser& parse) {
  const auto start = std::chrono::steady_clock::now();
  auto resolved = ResolveModel(context.repository, model_name, version_text);
  if (!resolved.ok()) {
    // Count only models of the repository: labels from arbitrary client input would grow the
    // metrics without bound.
    if (resolved.error().code() == StatusCode::kUnavailable) {
      ModelMetrics& unavailable = context.metrics.ForModel(std::string(model_name));
      unavailable.requests.fetch_add(1, std::memory_order_relaxed);
      unavailable.CountFailure(HttpStatusFor(resolved.error().code()));
    }
    return resolved.error();
  }
  const ServingModel& model = *resolved->model;
  const ModelVersion& version = *resolved->version;
  ModelMetrics& metrics = *model.metrics;
  metrics.requests.fetch_add(1, std::memory_order_relaxed);
  const auto fail = [&](Status status) {
    metrics.CountFailure(HttpStatusFor(status.code()));
    return status;
  };

  auto parsed = parse(version.network());
  if (!parsed.ok()) {
    return fail(Status(parsed.error().code(), "model '" + model.name + "' version " +
                                                  std::to_string(version.version()) + ": " +
                                                  parsed.error().message()));
  }

  ModelAdmission admission(metrics, model.config.max_in_flight);
  if (!admission.admitted()) {
    return fail(Status(StatusCode::kResourceExhausted,
                       "model '" + model.name + "' has " +
                           std::to_string(model.config.max_in_flight) +
                           " requests in flight, its max_in_flight; retry later"));
  }
  std::vector<ConstTensorView> views;
  views.reserve(parsed->inputs.size());
  for (const auto& tensor : parsed->inputs)
    views.push_back(tensor.View());
  auto outputs = context.runtime.Execute(version.network_id(), views);
  if (!outputs.ok()) {
    if (outputs.error().code() == StatusCode::kInternal)
      Log().error("model {} version {}: {}", model.name, version.version(),
                  outputs.error().message());
    return fail(outputs.error());
  }
  metrics.latency_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return InferenceOutcome{std::move(resolved.value()), std::move(parsed.value()),
                          std::move(outputs.value())};
}

}  // namespace backplane::server
