// A network: an ONNX graph imported into Backplane's own IR, validated, with every value's type
// and shape inferred at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/operator.hpp"
#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"

namespace backplane {

struct ValueInfo {
  std::string name;
  TensorInfo info;  // a negative dimension is dynamic (resolved per request)
};

struct Node {
  std::string name;  // the ONNX node name, or "<op_type>_<index>" when the model has none
  std::string op_type;
  AttributeMap attributes;
  std::vector<std::string> inputs;  // value names; "" for an omitted optional input
  std::vector<std::string> outputs;
};

// Immutable after import; thread-compatible.
struct Network {
  std::string name;
  int64_t ir_version = 0;
  // The model's default-domain opset; `nodes` are in their opset-13 form whatever it is.
  int64_t opset = 0;
  std::vector<ValueInfo> inputs;   // graph inputs that are not initializers, in graph order
  std::vector<ValueInfo> outputs;  // graph outputs, in graph order
  std::vector<Node> nodes;         // topological order; Constant nodes are folded into constants
  std::map<std::string, Tensor, std::less<>> constants;   // initializers and Constant outputs
  std::map<std::string, TensorInfo, std::less<>> values;  // every value, inferred at import
};

struct ImportOptions {
  // Graph inputs bound to fixed values at import: they become constants and leave
  // Network::inputs. ONNX's conformance cases feed Reshape's shape as a graph input (input_1.pb);
  // binding it makes the shape constant, as every backend requires.
  std::map<std::string, Tensor, std::less<>> bound_inputs;
};

// Parses, validates and shape-infers an ONNX model. Errors (kInvalidArgument or kUnimplemented)
// name the node and the reason: malformed protobuf, unsupported op, attribute or data type,
// dangling edge, cycle, shape mismatch, missing initializer.
Result<Network> ImportOnnxModel(std::span<const std::byte> model, std::string_view model_name,
                                const ImportOptions& options = {});
// `model_name` becomes Network::name and starts every error message; ImportOnnxFile uses the path.
Result<Network> ImportOnnxFile(const std::filesystem::path& path,
                               const ImportOptions& options = {});

// Every value's info for concrete input infos (dynamic dimensions fixed by a request), in the
// order of `network.inputs`. Errors name the input or node. Thread-safe: reads `network` only.
Result<std::map<std::string, TensorInfo, std::less<>>> InferShapes(
    const Network& network, std::span<const TensorInfo> inputs);

// ONNX TensorProto files, as in ONNX test data (input_0.pb, output_0.pb).
Result<Tensor> ReadTensorProtoFile(const std::filesystem::path& path);
Status WriteTensorProtoFile(const std::filesystem::path& path, const Tensor& tensor,
                            std::string_view name);

// One ONNX conformance case directory (<case>/model.onnx, <case>/test_data_set_N/input_K.pb and
// output_K.pb), as in ../shared/data/onnx-node. INT64 inputs (Reshape's shape) are bound as
// constants at import, so `inputs` holds only the remaining (FP32) inputs, in network order.
struct OnnxTestCase {
  Network network;
  std::vector<Tensor> inputs;
  std::vector<Tensor> expected_outputs;  // in network.outputs order
};
Result<OnnxTestCase> LoadOnnxTestCase(const std::filesystem::path& case_dir, int data_set = 0);

// A model with TensorProto files for its graph inputs (the ones that are not initializers, in
// graph order), as `backplane run --input` takes them. INT64 inputs are bound at import as above;
// `expected_outputs` stays empty.
Result<OnnxTestCase> LoadOnnxModelWithInputs(const std::filesystem::path& model,
                                             std::span<const std::filesystem::path> input_files);

}  // namespace backplane
