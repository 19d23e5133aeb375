// Loading ONNX conformance cases: shared by our tests, backend conformance tests and benchmarks.
#include <onnx/onnx_pb.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "backplane/onnx/network.hpp"

namespace backplane {

Result<OnnxTestCase> LoadOnnxModelWithInputs(const std::filesystem::path& model_path,
                                             std::span<const std::filesystem::path> input_files) {
  std::ifstream file(model_path, std::ios::binary);
  if (!file)
    return NotFound("cannot open ONNX model " + model_path.string());
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string bytes = std::move(contents).str();

  // The input files follow the graph inputs that are not initializers, in graph order; find
  // their names before import so that INT64 ones can be bound.
  onnx::ModelProto proto;
  if (!proto.ParseFromString(bytes)) {
    return InvalidArgument(model_path.string() +
                           " is not a valid ONNX model (protobuf parse failed)");
  }
  std::set<std::string> initializers;
  for (const auto& initializer : proto.graph().initializer())
    initializers.insert(initializer.name());
  std::vector<std::string> input_names;
  for (const auto& input : proto.graph().input()) {
    if (!initializers.contains(input.name()))
      input_names.push_back(input.name());
  }
  if (input_files.size() != input_names.size()) {
    std::string names;
    for (const auto& name : input_names)
      names += (names.empty() ? "" : ", ") + name;
    return InvalidArgument("model " + model_path.string() + " has " +
                           std::to_string(input_names.size()) + " input(s) (" + names + "), " +
                           std::to_string(input_files.size()) + " input file(s) given");
  }

  ImportOptions options;
  std::vector<Tensor> inputs;
  for (std::size_t i = 0; i < input_names.size(); ++i) {
    auto tensor = ReadTensorProtoFile(input_files[i]);
    if (!tensor.ok())
      return std::move(tensor).error();
    if (tensor->info().type == DataType::kInt64) {
      options.bound_inputs.emplace(input_names[i], std::move(tensor).value());
    } else {
      inputs.push_back(std::move(tensor).value());
    }
  }
  auto network = ImportOnnxModel(std::as_bytes(std::span(bytes.data(), bytes.size())),
                                 model_path.string(), options);
  if (!network.ok())
    return std::move(network).error();
  return OnnxTestCase{std::move(network).value(), std::move(inputs), {}};
}

Result<OnnxTestCase> LoadOnnxTestCase(const std::filesystem::path& case_dir, int data_set) {
  const std::filesystem::path data_dir = case_dir / ("test_data_set_" + std::to_string(data_set));
  std::vector<std::filesystem::path> input_files;
  for (int i = 0; std::filesystem::exists(data_dir / ("input_" + std::to_string(i) + ".pb")); ++i) {
    input_files.push_back(data_dir / ("input_" + std::to_string(i) + ".pb"));
  }
  auto test_case = LoadOnnxModelWithInputs(case_dir / "model.onnx", input_files);
  if (!test_case.ok())
    return test_case;
  for (std::size_t i = 0; i < test_case->network.outputs.size(); ++i) {
    auto tensor = ReadTensorProtoFile(data_dir / ("output_" + std::to_string(i) + ".pb"));
    if (!tensor.ok())
      return std::move(tensor).error();
    test_case->expected_outputs.push_back(std::move(tensor).value());
  }
  return test_case;
}

}  // namespace backplane
