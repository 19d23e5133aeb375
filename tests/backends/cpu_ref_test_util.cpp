#include "cpu_ref_test_util.hpp"

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace backplane::cpu_ref_test {
namespace fs = std::filesystem;

OperatorDesc MakeOp(std::string op_type, std::vector<Shape> inputs, std::vector<Shape> outputs,
                    AttributeMap attributes) {
  OperatorDesc op;
  op.name = op_type + "_node";
  op.op_type = std::move(op_type);
  op.attributes = std::move(attributes);
  for (auto& shape : inputs) {
    op.inputs.push_back({DataType::kFloat32, std::move(shape)});
    op.constant_inputs.push_back(nullptr);
  }
  for (auto& shape : outputs)
    op.outputs.push_back({DataType::kFloat32, std::move(shape)});
  return op;
}

OperatorDesc WithConstantInput(OperatorDesc op, std::size_t index, const void* data,
                               DataType type) {
  op.inputs.at(index).type = type;
  op.constant_inputs.at(index) = data;
  return op;
}

OperatorDesc WithOmittedInput(OperatorDesc op, std::size_t index) {
  op.inputs.at(index) = {};
  op.constant_inputs.at(index) = nullptr;
  return op;
}

struct CpuRefTest::Shared {
  fs::path dir;
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<loader::BackendInstance> backend;
};

CpuRefTest::Shared* CpuRefTest::shared_ = nullptr;

void CpuRefTest::SetUpTestSuite() {
  auto shared = std::make_unique<Shared>();
  std::string pattern = (fs::temp_directory_path() / "backplane-cpu-ref-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  shared->dir = pattern;
  fs::create_symlink(BACKPLANE_CPU_REF, shared->dir / "Backplane_CpuRef_backend.so");
  auto runtime = Runtime::Create({.backend_paths = std::vector{shared->dir}});
  if (!runtime.ok())
    throw std::runtime_error("Runtime::Create: " + runtime.error().ToString());
  shared->runtime = std::move(runtime).value();
  shared->backend = shared->runtime->Backend("CpuRef");
  if (shared->backend == nullptr)
    throw std::runtime_error("CpuRef did not load from " + std::string(BACKPLANE_CPU_REF));
  shared_ = shared.release();
}

void CpuRefTest::TearDownTestSuite() {
  if (shared_ == nullptr)
    return;
  shared_->backend.reset();
  shared_->runtime.reset();
  std::error_code error;
  fs::remove_all(shared_->dir, error);
  delete shared_;
  shared_ = nullptr;
}

loader::BackendInstance& CpuRefTest::backend() {
  return *shared_->backend;
}

std::vector<float> CpuRefTest::Run(const OperatorDesc& op, const std::vector<FloatTensor>& inputs,
                                   const Shape& output_shape) {
  auto workload = backend().CreateWorkload(op);
  if (!workload.ok()) {
    ADD_FAILURE() << "CreateWorkload: " << workload.error().ToString();
    return {};
  }
  std::vector<ConstTensorView> views;
  for (const auto& input : inputs)
    views.push_back({{DataType::kFloat32, input.shape}, input.values.data()});
  std::vector<float> output(static_cast<std::size_t>(ElementCount(output_shape)), NAN);
  const TensorView output_view{{DataType::kFloat32, output_shape}, output.data()};
  Status status = workload.value()->Execute(views, {&output_view, 1});
  if (!status.ok()) {
    ADD_FAILURE() << "Execute: " << status.ToString();
    return {};
  }
  return output;
}

std::vector<float> CpuRefTest::Run(const OperatorDesc& op,
                                   const std::vector<std::vector<float>>& inputs) {
  std::vector<FloatTensor> tensors;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    tensors.push_back({op.inputs.at(i).shape, inputs[i]});
  return Run(op, tensors, op.outputs.at(0).shape);
}

Status CpuRefTest::TryRun(const OperatorDesc& op, const std::vector<ConstTensorView>& inputs,
                          const std::vector<TensorView>& outputs) {
  auto workload = backend().CreateWorkload(op);
  if (!workload.ok())
    return workload.error();
  return workload.value()->Execute(inputs, outputs);
}

namespace {

class FloatsNearMatcher : public ::testing::MatcherInterface<const std::vector<float>&> {
 public:
  FloatsNearMatcher(std::vector<float> expected, float tolerance)
      : expected_(std::move(expected)), tolerance_(tolerance) {}

  bool MatchAndExplain(const std::vector<float>& actual,
                       ::testing::MatchResultListener* listener) const override {
    if (actual.size() != expected_.size()) {
      *listener << "has " << actual.size() << " elements";
      return false;
    }
    for (std::size_t i = 0; i < actual.size(); ++i) {
      const float bound = tolerance_ * (1.0f + std::fabs(expected_[i]));
      if (!(std::fabs(actual[i] - expected_[i]) <= bound)) {
        *listener << "element " << i << " is " << actual[i] << ", expected " << expected_[i];
        return false;
      }
    }
    return true;
  }

  void DescribeTo(std::ostream* os) const override {
    *os << "has " << expected_.size() << " elements each within " << tolerance_
        << " (relative+absolute) of [";
    for (std::size_t i = 0; i < expected_.size(); ++i)
      *os << (i ? ", " : "") << expected_[i];
    *os << "]";
  }

 private:
  std::vector<float> expected_;
  float tolerance_;
};

}  // namespace

std::vector<float> Iota(int n, float start) {
  std::vector<float> values(n);
  for (int i = 0; i < n; ++i)
    values[i] = start + static_cast<float>(i);
  return values;
}

::testing::Matcher<const std::vector<float>&> FloatsNear(std::vector<float> expected,
                                                         float tolerance) {
  return ::testing::MakeMatcher(new FloatsNearMatcher(std::move(expected), tolerance));
}

}  // namespace backplane::cpu_ref_test
