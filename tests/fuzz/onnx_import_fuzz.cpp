// libFuzzer target for ONNX import (onnx/): a model file's bytes, as model load and `backplane run`
// read them, through protobuf decoding, validation and shape inference, then shape inference again
// for requests with every dynamic dimension fixed. Any byte string must give a network or an error
// naming what and why, never a crash, a hang, or an allocation sized by a declared dimension or
// count.
//
// Checked (a difference aborts): a model that imports has shapes its shape rules agree on.
// InferShapes runs for two requests, every dynamic input dimension 2 (1 would hide broadcasting
// mistakes), then 3. When a request is accepted:
//  - every value of the network has a result, of the import's datatype and rank, and every
//    dimension the import knew (Network::values: what the runtime plans with) is the same at run
//    time; so is every dimension the model's metadata states (Network::inputs and outputs, which
//    GET /v2/models/{m} answers);
//  - with every input concrete, every result is concrete (no dynamic dimension is left: the
//    runtime allocates outputs by these shapes);
//  - a request whose input shapes the import already knew (no dynamic dimension) is accepted:
//    the import inferred those very shapes.
// Not compared with the backends' own checks: the window and broadcasting rules are one code
// (backplane/sdk/op_rules.hpp) that shape inference and the backends share, and a backend's
// IsSupported needs a loaded backend, which this target does not load.
// Seeds: corpus/onnx_import (the example models, ONNX conformance cases).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"

namespace {

using namespace backplane;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "onnx_import_fuzz: shape rules disagree: %s\n", what.c_str());
  std::abort();
}

std::string Describe(const TensorInfo& info) {
  return std::string(ToString(info.type)) + " " + ToString(info.shape);
}

// `known` (import time, may hold dynamic dimensions) and `concrete` (a request's) agree.
void ExpectCompatible(const std::string& what, const TensorInfo& known, const TensorInfo& concrete,
                      int64_t fixed) {
  bool agree = known.type == concrete.type && known.shape.size() == concrete.shape.size();
  for (std::size_t d = 0; agree && d < known.shape.size(); ++d)
    agree = concrete.shape[d] >= 0 && (known.shape[d] < 0 || known.shape[d] == concrete.shape[d]);
  if (!agree)
    Fail(what + " is " + Describe(known) + " at import but " + Describe(concrete) +
         " for a request with dynamic dimensions " + std::to_string(fixed));
}

void CheckRequest(const Network& network, int64_t fixed) {
  std::vector<TensorInfo> inputs;
  bool all_known = true;
  for (const auto& input : network.inputs) {
    TensorInfo info = input.info;
    for (auto& dimension : info.shape) {
      if (dimension < 0) {
        dimension = fixed;
        all_known = false;
      }
    }
    inputs.push_back(info);
  }
  auto shapes = InferShapes(network, inputs);
  if (!shapes.ok()) {
    if (all_known)
      Fail("the import's own input shapes are refused: " + shapes.error().ToString());
    volatile std::size_t sink = shapes.error().message().size();
    (void)sink;
    return;
  }
  for (const auto& [name, info] : network.values) {
    const auto found = shapes->find(name);
    if (found == shapes->end())
      Fail("value '" + name + "' has no shape for a request");
    ExpectCompatible("value '" + name + "'", info, found->second, fixed);
  }
  for (const auto* values : {&network.inputs, &network.outputs}) {
    for (const auto& value : *values) {
      const auto found = shapes->find(value.name);
      if (found == shapes->end())
        Fail("'" + value.name + "' of the metadata has no shape for a request");
      ExpectCompatible("'" + value.name + "' in the model's metadata", value.info, found->second,
                       fixed);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto network = ImportOnnxModel(std::as_bytes(std::span(data, size)), "fuzz");
  if (!network.ok()) {
    volatile std::size_t sink = network.error().message().size();
    (void)sink;
    return 0;
  }
  CheckRequest(*network, 2);
  CheckRequest(*network, 3);
  return 0;
}
