// libFuzzer target for the streaming infer parser (server/kserve_rest/json_request_reader.cpp): any
// body, JSON or JSON plus binary data, must give a request or an error, never a crash, a read
// outside the body, a write outside a tensor or a hang. The first byte picks where the body splits
// into JSON and binary (as Inference-Header-Content-Length would). Seed it with infer bodies, e.g.
// models/mnist/example_request.json.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kserve_rest/kserve_json.hpp"

namespace {

using namespace backplane;
using namespace backplane::server;

// Every datatype, a dynamic dimension, a scalar-free rank-3 input: the paths of the parser.
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
  if (size == 0)
    return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  InferenceBody split{.json = body};
  if (data[0] != 0xff) {
    // A split at any point of the body, the binary part possibly empty.
    const std::size_t at = body.empty() ? 0 : data[0] % (body.size() + 1);
    split = {.json = std::string_view(body).substr(0, at),
             .binary = std::string_view(body).substr(at),
             .has_binary_header = true};
  }
  auto parsed = ParseInferenceRequest(split, FuzzNetwork(), ParseLimits{.max_json_depth = 16});
  if (!parsed.ok()) {
    volatile std::size_t sink = parsed.error().message().size();
    (void)sink;
    return 0;
  }
  // A parsed request renders: its inputs as the outputs, every one binary and as JSON.
  std::vector<Tensor> outputs;
  outputs.push_back(std::move(parsed->inputs[0]));
  outputs.push_back(std::move(parsed->inputs[2]));
  const auto rendered =
      RenderInferenceResponseWithBinary("fuzz", 1, *parsed, FuzzNetwork(), outputs);
  volatile std::size_t sink = rendered.body.size() + rendered.json_length;
  (void)sink;
  return 0;
}
