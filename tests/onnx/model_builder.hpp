// Builds small ONNX models with the real protobuf types, for import tests.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"

namespace backplane::testing {

// A model under construction: IR 8, default-domain opset 13 unless changed.
class ModelBuilder {
 public:
  ModelBuilder();

  // Dimensions < 0 become dim_param "N".
  ModelBuilder& Input(const std::string& name, std::vector<int64_t> dims,
                      int32_t type = onnx::TensorProto::FLOAT);
  ModelBuilder& Output(const std::string& name, std::vector<int64_t> dims,
                       int32_t type = onnx::TensorProto::FLOAT);
  // Dimension `dim` of graph input or output `value` becomes dim_param `param` (Input and Output
  // name every symbolic dimension "N").
  ModelBuilder& NameDimension(const std::string& value, int dim, const std::string& param);
  // An output without declared shape.
  ModelBuilder& OutputNoShape(const std::string& name);
  ModelBuilder& FloatInitializer(const std::string& name, std::vector<int64_t> dims);
  // An FP32 initializer with the given values (a scalar when `dims` is empty).
  ModelBuilder& FloatInitializer(const std::string& name, std::vector<int64_t> dims,
                                 std::vector<float> values);
  ModelBuilder& BoolInitializer(const std::string& name, std::vector<int64_t> dims,
                                std::vector<bool> values);
  ModelBuilder& Int64Initializer(const std::string& name, std::vector<int64_t> dims,
                                 std::vector<int64_t> values);
  // A UINT8 or INT8 initializer (`type`), its values in int32_data as ONNX stores them.
  ModelBuilder& QuantizedInitializer(const std::string& name, std::vector<int64_t> dims,
                                     int32_t type, std::vector<int32_t> values);
  onnx::NodeProto& Node(const std::string& op_type, std::vector<std::string> inputs,
                        std::vector<std::string> outputs, const std::string& name = "");

  onnx::ModelProto& proto() { return model_; }
  std::string Serialize() const;
  Result<Network> Import(const ImportOptions& options = {}) const;

 private:
  onnx::ModelProto model_;
};

void SetInt(onnx::NodeProto& node, const std::string& name, int64_t value);
void SetFloat(onnx::NodeProto& node, const std::string& name, float value);
void SetInts(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values);
void SetString(onnx::NodeProto& node, const std::string& name, const std::string& value);

}  // namespace backplane::testing

namespace backplane {
// Readable test failure output: "FP32 [2,-1]".
inline void PrintTo(const TensorInfo& info, std::ostream* os) {
  *os << ToString(info.type) << " " << ToString(info.shape);
}
}  // namespace backplane
