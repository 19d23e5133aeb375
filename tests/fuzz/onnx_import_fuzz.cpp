// libFuzzer target for ONNX import (onnx/): a model file's bytes, as model load and `backplane run`
// read them, through protobuf decoding, validation and shape inference, then shape inference again
// for a request with every dynamic dimension fixed. Any byte string must give a network or an
// error naming what and why, never a crash, a hang, or an allocation sized by a declared dimension
// or count. Seeds: corpus/onnx_import (the example models, ONNX conformance cases).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backplane/onnx/network.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace backplane;
  auto network = ImportOnnxModel(std::as_bytes(std::span(data, size)), "fuzz");
  if (!network.ok()) {
    volatile std::size_t sink = network.error().message().size();
    (void)sink;
    return 0;
  }
  // A request's shapes: a dynamic dimension becomes 2 (1 would hide broadcasting mistakes).
  std::vector<TensorInfo> inputs;
  for (const auto& input : network->inputs) {
    TensorInfo info = input.info;
    for (auto& dimension : info.shape) {
      if (dimension < 0)
        dimension = 2;
    }
    inputs.push_back(info);
  }
  auto shapes = InferShapes(*network, inputs);
  volatile std::size_t sink = shapes.ok() ? shapes->size() : shapes.error().message().size();
  (void)sink;
  return 0;
}
