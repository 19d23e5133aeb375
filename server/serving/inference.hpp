// One inference on a served model, whatever the transport: resolve the model and version, count
// the request, admit it under the model's max_in_flight, parse its inputs against the network,
// execute, observe the latency. The REST handler (kserve_api.cpp) queues it on the runtime's
// scheduler with StartInference; the gRPC service runs it on its own callback thread with
// RunInference; both only translate bodies and errors. A model with dynamic_batching sends its
// requests to its version's DynamicBatcher instead of the scheduler, whichever function starts
// them (gRPC uses StartInference for those). Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "serving/inference_request.hpp"
#include "serving/model_repository.hpp"
#include "serving/serving_context.hpp"

namespace backplane::server {

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

// For a batched model the calling thread waits until the request's batch has answered it.
// Errors: kNotFound (no such model or version), kUnavailable (model not serving),
// kInvalidArgument (the parser's message, prefixed with the model and version),
// kResourceExhausted (max_in_flight reached, or the scheduler refused), and whatever Execute
// returns. Every failure of a repository model is counted in its metrics.
Result<InferenceOutcome> RunInference(const ServeContext& context, std::string_view model,
                                      std::string_view version_text,
                                      const InferenceRequestParser& parse);

// The same as a request of the runtime's scheduler: the execution and `done` run on a TBB
// worker, within the scheduler's limit of requests in flight (beyond it kResourceExhausted), and
// kDeadlineExceeded when `deadline` passes before it starts (for a batched model: before its
// batch leaves). The parse runs where `parse_on` says: on the calling thread before this returns,
// or where the request is queued (a TBB worker, or the batcher's parser thread). A request
// refused before it is queued (unknown model, max_in_flight) calls `done` at once on the caller's
// thread, and so does a batched one whose parse fails there. `parse` and what it refers to must
// live until it has run.
using InferenceDone = std::function<void(Result<InferenceOutcome>)>;
void StartInference(const ServeContext& context, std::string_view model,
                    std::string_view version_text, InferenceRequestParser parse, ParseOn parse_on,
                    std::optional<std::chrono::steady_clock::time_point> deadline,
                    InferenceDone done);

}  // namespace backplane::server
