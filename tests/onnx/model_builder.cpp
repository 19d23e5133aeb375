#include "model_builder.hpp"

#include <span>

namespace backplane::testing {
namespace {

void FillValueInfo(onnx::ValueInfoProto* value, const std::string& name,
                   const std::vector<int64_t>& dims, int32_t type) {
  value->set_name(name);
  auto* tensor_type = value->mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(type);
  auto* shape = tensor_type->mutable_shape();
  for (int64_t dim : dims) {
    auto* proto_dim = shape->add_dim();
    if (dim < 0)
      proto_dim->set_dim_param("N");
    else
      proto_dim->set_dim_value(dim);
  }
}

}  // namespace

ModelBuilder::ModelBuilder() {
  model_.set_ir_version(8);
  model_.set_producer_name("backplane tests");
  auto* opset = model_.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  model_.mutable_graph()->set_name("test");
}

ModelBuilder& ModelBuilder::Input(const std::string& name, std::vector<int64_t> dims,
                                  int32_t type) {
  FillValueInfo(model_.mutable_graph()->add_input(), name, dims, type);
  return *this;
}

ModelBuilder& ModelBuilder::Output(const std::string& name, std::vector<int64_t> dims,
                                   int32_t type) {
  FillValueInfo(model_.mutable_graph()->add_output(), name, dims, type);
  return *this;
}

ModelBuilder& ModelBuilder::NameDimension(const std::string& value, int dim,
                                          const std::string& param) {
  auto* graph = model_.mutable_graph();
  for (auto* values : {graph->mutable_input(), graph->mutable_output()}) {
    for (auto& info : *values) {
      if (info.name() == value)
        info.mutable_type()
            ->mutable_tensor_type()
            ->mutable_shape()
            ->mutable_dim(dim)
            ->set_dim_param(param);
    }
  }
  return *this;
}

ModelBuilder& ModelBuilder::OutputNoShape(const std::string& name) {
  auto* output = model_.mutable_graph()->add_output();
  output->set_name(name);
  output->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return *this;
}

ModelBuilder& ModelBuilder::FloatInitializer(const std::string& name, std::vector<int64_t> dims) {
  auto* tensor = model_.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  int64_t count = 1;
  for (int64_t dim : dims) {
    tensor->add_dims(dim);
    count *= dim;
  }
  for (int64_t i = 0; i < count; ++i)
    tensor->add_float_data(0.5f * static_cast<float>(i));
  return *this;
}

ModelBuilder& ModelBuilder::FloatInitializer(const std::string& name, std::vector<int64_t> dims,
                                             std::vector<float> values) {
  auto* tensor = model_.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t dim : dims)
    tensor->add_dims(dim);
  for (float value : values)
    tensor->add_float_data(value);
  return *this;
}

ModelBuilder& ModelBuilder::BoolInitializer(const std::string& name, std::vector<int64_t> dims,
                                            std::vector<bool> values) {
  auto* tensor = model_.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::BOOL);
  for (int64_t dim : dims)
    tensor->add_dims(dim);
  for (bool value : values)
    tensor->add_int32_data(value ? 1 : 0);
  return *this;
}

ModelBuilder& ModelBuilder::Int64Initializer(const std::string& name, std::vector<int64_t> dims,
                                             std::vector<int64_t> values) {
  auto* tensor = model_.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::INT64);
  for (int64_t dim : dims)
    tensor->add_dims(dim);
  for (int64_t value : values)
    tensor->add_int64_data(value);
  return *this;
}

ModelBuilder& ModelBuilder::QuantizedInitializer(const std::string& name, std::vector<int64_t> dims,
                                                 int32_t type, std::vector<int32_t> values) {
  auto* tensor = model_.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(type);
  for (int64_t dim : dims)
    tensor->add_dims(dim);
  for (int32_t value : values)
    tensor->add_int32_data(value);
  return *this;
}

onnx::NodeProto& ModelBuilder::Node(const std::string& op_type, std::vector<std::string> inputs,
                                    std::vector<std::string> outputs, const std::string& name) {
  auto* node = model_.mutable_graph()->add_node();
  node->set_op_type(op_type);
  node->set_name(name);
  for (auto& input : inputs)
    node->add_input(input);
  for (auto& output : outputs)
    node->add_output(output);
  return *node;
}

std::string ModelBuilder::Serialize() const {
  std::string bytes;
  model_.SerializeToString(&bytes);
  return bytes;
}

Result<Network> ModelBuilder::Import(const ImportOptions& options) const {
  const std::string bytes = Serialize();
  return ImportOnnxModel(std::as_bytes(std::span(bytes.data(), bytes.size())), "test.onnx",
                         options);
}

void SetInt(onnx::NodeProto& node, const std::string& name, int64_t value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INT);
  attribute->set_i(value);
}

void SetFloat(onnx::NodeProto& node, const std::string& name, float value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::FLOAT);
  attribute->set_f(value);
}

void SetInts(onnx::NodeProto& node, const std::string& name, std::vector<int64_t> values) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values)
    attribute->add_ints(value);
}

void SetString(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::STRING);
  attribute->set_s(value);
}

}  // namespace backplane::testing
