// KServe v2 over gRPC (`inference.GRPCInferenceService`) beside the REST API, on its own address.
// Every call runs on gRPC's callback threads (see ModelInfer in grpc_server.cpp for why).
#pragma once

#include <memory>

#include "backplane/core/status.hpp"
#include "config/server_config.hpp"
#include "serving/inference.hpp"

namespace backplane::server {

struct GrpcLimits {
  std::size_t max_message_bytes = 16u << 20;  // received messages; the REST body limit
  // gRPC's memory quota (grpc::ResourceQuota), max_buffered_body_bytes: see Start.
  std::size_t max_buffered_bytes = 256u << 20;
  // SETTINGS_MAX_CONCURRENT_STREAMS of every connection: see Start.
  int max_concurrent_streams = 100;
};

// Started by Start, stopped by Stop or the destructor, from one thread. The RPCs are served
// concurrently; `inference` must outlive the server.
class GrpcServer {
 public:
  // Binds (port 0 picks a free one) and serves. kUnavailable when the address cannot be bound.
  static Result<std::unique_ptr<GrpcServer>> Start(const ListenAddress& address,
                                                   const InferenceApi& inference,
                                                   GrpcLimits limits);
  ~GrpcServer();  // Stop()
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  const ListenAddress& address() const;
  // Stops taking calls, answers every call in flight, joins the threads.
  void Stop();

 private:
  struct Impl;
  explicit GrpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace backplane::server
