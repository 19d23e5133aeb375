#include "kserve_grpc/grpc_server.hpp"

#include <grpcpp/grpcpp.h>

#include "grpc_service.grpc.pb.h"
#include "kserve_grpc/grpc_tensors.hpp"
#include "serving/inference.hpp"
#include "serving/serving_log.hpp"

namespace backplane::server {
namespace {

// The same classes as HttpStatusFor: the REST and gRPC answers to one failure agree.
grpc::Status ToGrpc(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case StatusCode::kUnimplemented:
      code = grpc::StatusCode::UNIMPLEMENTED;
      break;
    case StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    default:
      break;
  }
  return {code, status.message()};
}

// gRPC's "no deadline" is a time centuries away: none.
std::optional<std::chrono::steady_clock::time_point> DeadlineOf(
    const grpc::CallbackServerContext& call) {
  const auto left = call.deadline() - std::chrono::system_clock::now();
  if (left >= std::chrono::hours(24 * 365))
    return std::nullopt;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
}

// Thread-safe: every method only reads the models or starts an inference.
class InferenceService final : public inference::GRPCInferenceService::CallbackService {
 public:
  explicit InferenceService(const InferenceApi& inference) : inference_(inference) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* call,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    response->set_live(true);
    return Finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* call,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    response->set_ready(inference_.ready());
    return Finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* call,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    auto resolved = inference_.Resolve(request->name(), request->version());
    // A known model that is not serving is "not ready", not an error (as REST's 503 says).
    if (!resolved.ok() && resolved.error().code() != StatusCode::kUnavailable)
      return Finish(call, ToGrpc(resolved.error()));
    response->set_ready(resolved.ok());
    return Finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* call,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    response->set_name("backplane");
    response->set_version(BACKPLANE_VERSION);
    for (std::string_view extension : kServerExtensions)
      response->add_extensions(std::string(extension));
    return Finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* call,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    auto resolved = inference_.Resolve(request->name(), request->version());
    if (!resolved.ok())
      return Finish(call, ToGrpc(resolved.error()));
    response->set_name(resolved->model->name);
    for (const auto& [number, loaded] : resolved->model->versions)
      response->add_versions(std::to_string(number));
    response->set_platform("onnx");
    const Network& network = resolved->version->network();
    const auto describe = [](const ValueInfo& value, auto* tensor) {
      tensor->set_name(value.name);
      tensor->set_datatype(std::string(ToString(value.info.type)));
      for (const int64_t dim : value.info.shape)
        tensor->add_shape(dim);
    };
    for (const auto& input : network.inputs)
      describe(input, response->add_inputs());
    for (const auto& output : network.outputs)
      describe(output, response->add_outputs());
    return Finish(call, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* call,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    // RunOn::kCaller: the parse, and an unbatched model's execution and answer, run here, on
    // gRPC's callback thread (Execute joins the scheduler's arena on it), not queued on the
    // scheduler as REST's inference is: in gRPC 1.51 a Finish from a foreign thread waits for a
    // poller. Through a pool of ours or a TBB worker, calls were slower and throughput lower than
    // here (bench/grpc_bench.sh; the numbers are in docs/performance.md).
    // Concurrency stays bounded by the runtime's admission (max_in_flight), which refuses rather
    // than queues. A batched request leaves this thread once parsed (blocked callback threads
    // would keep batches from forming) and is finished from its batch's thread, a cost batching
    // repays under load.
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    inference_.Infer(InferenceCall{
        .model = request->model_name(),
        .version = request->model_version(),
        .parse =
            [request](const Network& network) { return ParseGrpcInferRequest(*request, network); },
        .run_on = RunOn::kCaller,
        .deadline = DeadlineOf(*call),
        .done =
            [reactor, request, response](Result<InferenceOutcome> outcome) {
              if (!outcome.ok()) {
                reactor->Finish(ToGrpc(outcome.error()));
                return;
              }
              RenderGrpcInferResponse(outcome->model.model->name, outcome->model.version->version(),
                                      outcome->request, outcome->model.version->network(),
                                      outcome->outputs, request->raw_input_contents_size() != 0,
                                      *response);
              reactor->Finish(grpc::Status::OK);
            },
    });
    return reactor;
  }

 private:
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* call, grpc::Status status) {
    grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }

  const InferenceApi& inference_;
};

}  // namespace

// Declaration order is destruction order reversed: the gRPC server (which waits for the calls
// in flight) goes before the service they call.
struct GrpcServer::Impl {
  ListenAddress address;
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<grpc::Server> server;
};

GrpcServer::GrpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcServer::~GrpcServer() {
  Stop();
}

const ListenAddress& GrpcServer::address() const {
  return impl_->address;
}

Result<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ListenAddress& address,
                                                      const InferenceApi& inference,
                                                      GrpcLimits limits) {
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<InferenceService>(inference);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(address.ToString(), grpc::InsecureServerCredentials(), &bound_port);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would start and share
  // the traffic silently instead of failing like HTTP's bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Trap: gRPC inflates a compressed message before it checks the size limit, so a 1 MB gzip
  // message can cost 1 GiB (deflate compresses zeros about a thousandfold). The server cannot bound
  // what a message inflates to, so it accepts none: a compressed call is UNIMPLEMENTED, naming the
  // algorithm.
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<std::size_t>(limits.max_message_bytes, std::numeric_limits<int>::max())));
  // Calls opened and left waiting for their message each hold a transport stream and a call,
  // and gRPC's default allows 2^31 of them per connection: MAX_CONCURRENT_STREAMS bounds them per
  // connection. gRPC clients queue calls beyond it; gRPC 1.51 answers a client that opens more
  // anyway by cancelling its calls and closing the connection.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams);
  // Messages are buffered inside gRPC's transport before any handler of ours sees them, so the
  // HTTP front's BodyBudget cannot reserve them; gRPC's own memory quota bounds them instead.
  // Over the quota, gRPC (1.51, by its documentation) shrinks flow-control windows, stops
  // taking connections and cancels streams rather than refusing one message: coarser than a 503.
  // Its own accounting counts transport buffers too, so the quota is the same number, not a
  // second budget to add up exactly.
  // Trap: neither bounds an HTTP/2 rapid reset (HEADERS then RST_STREAM, again and again).
  // gRPC 1.51 hands every such call to its callback threads (to be answered "failed to
  // deserialize") and frees it only when they get to it; they fall behind the transport, and
  // the calls waiting are held in no quota. MAX_CONCURRENT_STREAMS does not count them (a reset
  // stream leaves the transport's table at once), and neither smaller read chunks nor a smaller
  // quota change how they pile up: docs/operators.md, "Memory under bursts".
  grpc::ResourceQuota quota("backplane.grpc");
  quota.Resize(limits.max_buffered_bytes);
  builder.SetResourceQuota(quota);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || bound_port == 0) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen for gRPC on " + address.ToString() +
                      " (address in use, or not an address of this machine)");
  }
  impl->address = ListenAddress{address.host, bound_port};
  return std::unique_ptr<GrpcServer>(new GrpcServer(std::move(impl)));
}

void GrpcServer::Stop() {
  if (impl_->server == nullptr)
    return;
  // Calls in flight get a few seconds to finish.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace backplane::server
