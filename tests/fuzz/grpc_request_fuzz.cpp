// libFuzzer target for the gRPC infer mapping (server/kserve_grpc/grpc_tensors.cpp): bytes decoded
// as a ModelInferRequest, as gRPC hands the service a message, then validated against a network
// and converted to tensors (typed contents or raw_input_contents), and rendered back both ways.
// Any message must give a request or an error naming the input and why, never a crash, a read
// outside a field or a write outside a tensor. Seeds: corpus/grpc_request (serialized requests).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "grpc_service.pb.h"
#include "kserve_grpc/grpc_tensors.hpp"

namespace {

using namespace backplane;
using namespace backplane::server;

// Every datatype, dynamic dimensions, a rank-3 input, as the REST target's network.
const Network& FuzzNetwork() {
  static const Network network = [] {
    Network n;
    n.name = "fuzz";
    n.inputs.push_back({"x", {DataType::kFloat32, {-1, 3}}});
    n.inputs.push_back({"t", {DataType::kInt8, {2, -1, 2}}});
    n.inputs.push_back({"b", {DataType::kBool, {2}}});
    n.inputs.push_back({"i", {DataType::kInt64, {-1}}});
    n.inputs.push_back({"u", {DataType::kUint8, {1}}});
    n.inputs.push_back({"d", {DataType::kFloat64, {1}}});
    n.inputs.push_back({"k", {DataType::kInt32, {1}}});
    n.outputs.push_back({"y", {DataType::kFloat32, {-1}}});
    n.outputs.push_back({"z", {DataType::kBool, {-1}}});
    return n;
  }();
  return network;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size)))
    return 0;  // gRPC refuses a message protobuf cannot decode before the service sees it
  auto parsed = ParseGrpcInferRequest(request, FuzzNetwork());
  if (!parsed.ok()) {
    volatile std::size_t sink = parsed.error().message().size();
    (void)sink;
    return 0;
  }
  std::vector<Tensor> outputs;
  outputs.push_back(std::move(parsed->inputs[0]));
  outputs.push_back(std::move(parsed->inputs[2]));
  for (const bool raw : {false, true}) {
    inference::ModelInferResponse response;
    RenderGrpcInferResponse("fuzz", 1, *parsed, FuzzNetwork(), outputs, raw, response);
    volatile std::size_t sink = response.ByteSizeLong();
    (void)sink;
  }
  return 0;
}
