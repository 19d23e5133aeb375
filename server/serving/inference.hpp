// What the inference transports (REST, gRPC) see of the server: the serving models, readiness,
// and one entry point for an inference request, whatever the transport and whatever the model
// (batched or not: each model version's request queue decides, request_queue.hpp). The registry,
// the rollouts and the runtime stay behind it: only the admin API sees those.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "serving/inference_request.hpp"
#include "serving/model_repository.hpp"
#include "serving/request_queue.hpp"

namespace backplane::server {

class ServerMetrics;

// The protocol extensions the server speaks, as /v2 (REST) and ServerMetadata (gRPC) list them.
inline constexpr std::string_view kServerExtensions[] = {
    "model_repository", "backend_admin", "model_placement", "metrics", "binary_tensor_data"};

// What a finished inference hands back to the transport that renders it. The resolved model
// keeps the network loaded while the response is written.
struct InferenceOutcome {
  ResolvedModel model;
  InferenceRequest request;
  std::vector<Tensor> outputs;
};

// Turns the transport's body into a validated request for `network`; kInvalidArgument naming the
// input and why.
using InferenceRequestParser = std::function<Result<InferenceRequest>(const Network& network)>;
using InferenceDone = std::function<void(Result<InferenceOutcome>)>;

// One inference request as a transport starts it.
struct InferenceCall {
  std::string_view model;    // read before Infer returns
  std::string_view version;  // "": the highest version serving
  // Runs where `run_on` says; it, and what it refers to (the body), must live until it has run.
  InferenceRequestParser parse;
  RunOn run_on = RunOn::kQueue;
  // kDeadlineExceeded when it passes before the request starts (batched: before its batch
  // leaves).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Called once with the outcome: on the caller's thread when the request is refused before it
  // is queued (unknown model, max_in_flight) or ran there (RunOn::kCaller), else on the thread
  // that finished it (a TBB worker, a batcher's thread).
  InferenceDone done;
};

// Thread-safe; what it refers to outlives it and every request it started.
class InferenceApi {
 public:
  InferenceApi(const ModelRepository& repository, ServerMetrics& metrics,
               const std::atomic<bool>& ready)
      : repository_(repository), metrics_(metrics), ready_(ready) {}

  // False until the server is ready, and again from the moment it stops.
  bool ready() const { return ready_.load(); }
  // The model and version a request names (ResolveModel).
  Result<ResolvedModel> Resolve(std::string_view model, std::string_view version) const {
    return ResolveModel(repository_, model, version);
  }

  // Resolves the model once, counts the request, admits it under the model's max_in_flight,
  // and hands it to its version's request queue, which parses, executes and answers it.
  // Errors: kNotFound (no such model or version), kUnavailable (model not serving),
  // kInvalidArgument (the parser's message, prefixed with the model and version; rows past
  // max_batch_size), kResourceExhausted (max_in_flight reached, or the queue is full),
  // kDeadlineExceeded, and whatever Execute returns. Every failure of a repository model is
  // counted in its metrics.
  void Infer(InferenceCall call) const;

 private:
  const ModelRepository& repository_;
  ServerMetrics& metrics_;
  const std::atomic<bool>& ready_;
};

}  // namespace backplane::server
