// CpuRef: plain, obviously-correct reference kernels. Every other backend is checked against it,
// so clarity beats speed here.
#include <cmath>
#include <string>

#include "backplane/sdk/backend.hpp"

namespace backplane::cpu_ref {
namespace {

constexpr std::string_view kId = "CpuRef";

Status RequireFloat32(const OperatorDesc& op) {
  for (const auto& input : op.inputs) {
    if (input.type != DataType::kFloat32) {
      return Unimplemented("CpuRef runs " + op.op_type + " on FP32 only; node '" + op.name +
                           "' has an input of type " + std::string(ToString(input.type)));
    }
  }
  return Status::Ok();
}

// The output shape of numpy-style (multidirectional) broadcasting, or an error naming the node.
Result<Shape> BroadcastShape(const OperatorDesc& op, const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1) {
      return InvalidArgument(op.op_type + " node '" + op.name + "': shapes " + ToString(a) +
                             " and " + ToString(b) + " do not broadcast");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element offset in a broadcast input for a flat index into the output.
int64_t BroadcastOffset(int64_t flat, const Shape& out, const Shape& in) {
  int64_t offset = 0;
  int64_t stride = 1;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t axis_in = in.size() - 1 - i;
    const std::size_t axis_out = out.size() - 1 - i;
    const int64_t coordinate = flat % out[axis_out];
    flat /= out[axis_out];
    if (in[axis_in] != 1)
      offset += coordinate * stride;
    stride *= in[axis_in];
  }
  return offset;
}

class AddWorkload final : public IWorkload {
 public:
  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    const auto a = inputs[0].Elements<float>();
    const auto b = inputs[1].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    const Shape& out_shape = outputs[0].info.shape;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto flat = static_cast<int64_t>(i);
      out[i] = a[BroadcastOffset(flat, out_shape, inputs[0].info.shape)] +
               b[BroadcastOffset(flat, out_shape, inputs[1].info.shape)];
    }
    return Status::Ok();
  }
};

class ReluWorkload final : public IWorkload {
 public:
  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    for (std::size_t i = 0; i < in.size(); ++i)
      out[i] = std::max(in[i], 0.0f);
    return Status::Ok();
  }
};

class CpuRefBackend final : public IBackend {
 public:
  std::string_view GetId() const override { return kId; }

  Status IsSupported(const OperatorDesc& op) const override {
    const std::size_t arity = op.op_type == "Add" ? 2 : op.op_type == "Relu" ? 1 : 0;
    if (arity == 0) {
      return Unimplemented("CpuRef does not implement op " + op.op_type + " (node '" + op.name +
                           "')");
    }
    if (op.inputs.size() != arity || op.outputs.size() != 1) {
      return InvalidArgument(op.op_type + " node '" + op.name + "' needs " + std::to_string(arity) +
                             " input(s) and 1 output, has " + std::to_string(op.inputs.size()) +
                             " and " + std::to_string(op.outputs.size()));
    }
    BACKPLANE_RETURN_IF_ERROR(RequireFloat32(op));
    if (!op.attributes.empty()) {
      return Unimplemented(op.op_type + " node '" + op.name + "': unsupported attribute '" +
                           op.attributes.begin()->first + "'");
    }
    if (op.op_type == "Add") {
      auto shape = BroadcastShape(op, op.inputs[0].shape, op.inputs[1].shape);
      if (!shape.ok())
        return shape.error();
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    BACKPLANE_RETURN_IF_ERROR(IsSupported(op));
    if (op.op_type == "Add")
      return std::unique_ptr<IWorkload>(new AddWorkload());
    return std::unique_ptr<IWorkload>(new ReluWorkload());
  }

  std::vector<OptionDescriptor> DescribeOptions() const override { return options_.descriptors(); }
  Status UpdateOptions(const BackendOptions& changes) override { return options_.Update(changes); }
  Result<OptionValue> GetOption(std::string_view key) const override { return options_.Get(key); }

 private:
  OptionSet options_{std::string(kId),
                     {{"deterministic", OptionType::kBool, true,
                       "run kernels single-threaded in a fixed order (CpuRef always does; kept "
                       "for option compatibility with optimised backends)"}}};
};

}  // namespace
}  // namespace backplane::cpu_ref

BACKPLANE_DEFINE_BACKEND(backplane::cpu_ref::CpuRefBackend, "CpuRef")
