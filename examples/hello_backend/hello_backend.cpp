// ExampleHello: a complete dynamic backend in one file, written against the backend SDK only, the
// way a third-party author writes one (docs/backend-authors.md walks through it).
//
// It runs the ONNX operator Relu on FP32 tensors and has one option, check_finite.
#include <cmath>
#include <memory>
#include <string>
#include <variant>

#include "backplane/sdk/backend.hpp"

// Everything in an anonymous namespace: the backend is reached only through the entry points, and
// names that are not exported cannot clash with the host or with another version of this backend.
namespace {

using backplane::BackendOptions;
using backplane::ConstTensorView;
using backplane::DataType;
using backplane::IHost;
using backplane::IWorkload;
using backplane::OperatorDesc;
using backplane::OptionSet;
using backplane::OptionType;
using backplane::Status;
using backplane::TensorView;

constexpr std::string_view kId = "ExampleHello";  // must equal the id given to the macro below
constexpr std::string_view kCheckFinite = "check_finite";
// Elements per chunk of parallel work: large enough that a chunk outweighs handing it to another
// thread (about a microsecond); a tensor this small or smaller runs on the calling thread.
constexpr std::size_t kGrain = 16384;

// One chunk of y = max(x, 0). A plain function and a context pointer, not a lambda handed to a
// thread pool: the host's ParallelFor calls it, and no thread-pool template is compiled into this
// library (docs/backend-authors.md, Parallel work).
struct ReluJob {
  std::span<const float> in;
  std::span<float> out;
};
void ReluChunk(void* context, std::size_t begin, std::size_t end) {
  const auto& job = *static_cast<const ReluJob*>(context);
  // Written so that NaN stays NaN, as in ONNX's reference and in CpuRef.
  for (std::size_t i = begin; i < end; ++i)
    job.out[i] = job.in[i] < 0.0f ? 0.0f : job.in[i];
}

// y = max(x, 0), element by element.
//
// Thread-safe: Execute runs concurrently for many requests, so it keeps no per-request state in
// members. check_finite is either the network's value, fixed when the workload is prepared (SDK
// 1.3: the host re-prepares loaded networks when an option changes), or, on a host older than
// 1.3, read from the instance at each call, so that an update applies to workloads created
// earlier; a call may also give its own value (SDK 1.4, ExecuteWithOptions).
class ReluWorkload final : public IWorkload {
 public:
  // SDK 1.3: `check_finite` is the value of the network this workload belongs to. `host` is null
  // on a host older than SDK 1.2, which never calls SetHost.
  ReluWorkload(std::string node, bool check_finite, IHost* host)
      : node_(std::move(node)), check_finite_(check_finite), host_(host) {}
  // Before 1.3: `options` belongs to the backend instance. The host destroys every workload before
  // the instance that created it, so the reference stays valid for this workload's whole life; so
  // does `host`.
  ReluWorkload(std::string node, const OptionSet& options, IHost* host)
      : node_(std::move(node)), options_(&options), host_(host) {}

  Status Execute(std::span<const ConstTensorView> inputs,
                 std::span<const TensorView> outputs) override {
    return Run(inputs, outputs,
               options_ != nullptr ? options_->GetAs<bool>(kCheckFinite) : check_finite_);
  }

  // SDK 1.4: a call that gives check_finite (DescribeCallOptions names it). `options` holds every
  // declared option at this call's value, checked by the host. Read from `options`, never stored:
  // concurrent calls may give different values.
  Status ExecuteWithOptions(std::span<const ConstTensorView> inputs,
                            std::span<const TensorView> outputs,
                            const BackendOptions& options) override {
    return Run(inputs, outputs, std::get<bool>(options.at(std::string(kCheckFinite))));
  }

 private:
  Status Run(std::span<const ConstTensorView> inputs, std::span<const TensorView> outputs,
             bool check_finite) {
    const auto in = inputs[0].Elements<float>();
    const auto out = outputs[0].Elements<float>();
    if (check_finite) {
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (!std::isfinite(in[i])) {
          return backplane::InvalidArgument("Relu node '" + node_ + "': input element " +
                                            std::to_string(i) + " is " + std::to_string(in[i]) +
                                            " (check_finite is on)");
        }
      }
    }
    ReluJob job{in, out};
    if (host_ == nullptr) {
      ReluChunk(&job, 0, in.size());
      return Status::Ok();
    }
    // Returns when every chunk has returned; chunks run on the host's TBB workers, within the
    // concurrency the host gives this request.
    return host_->ParallelFor(in.size(), kGrain, &ReluChunk, &job);
  }

  const std::string node_;
  const bool check_finite_ = false;
  const OptionSet* const options_ = nullptr;  // null: check_finite_ holds the value
  IHost* const host_;
};

// Thread-safe, as IBackend requires: the only mutable state is the OptionSet, which locks.
class HelloBackend final : public backplane::IBackend {
 public:
  std::string_view GetId() const override { return kId; }

  // Cheap and side-effect free: the host asks this for every layer of every network it places.
  Status IsSupported(const OperatorDesc& op) const override {
    if (op.op_type != "Relu") {
      return backplane::Unimplemented("ExampleHello runs Relu only, not " + op.op_type +
                                      " (node '" + op.name + "')");
    }
    if (op.inputs.size() != 1 || op.outputs.size() != 1) {
      return backplane::InvalidArgument("Relu node '" + op.name + "' needs 1 input and 1 output");
    }
    if (op.inputs[0].type != DataType::kFloat32 || op.outputs[0].type != DataType::kFloat32) {
      return backplane::Unimplemented("ExampleHello runs Relu on FP32 only; node '" + op.name +
                                      "' has " + std::string(ToString(op.inputs[0].type)));
    }
    return Status::Ok();
  }

  // A host older than SDK 1.3 calls this: the workload reads the instance's option at each call.
  backplane::Result<std::unique_ptr<IWorkload>> CreateWorkload(const OperatorDesc& op) override {
    BACKPLANE_RETURN_IF_ERROR(IsSupported(op));
    return std::unique_ptr<IWorkload>(new ReluWorkload(op.name, options_, host_));
  }

  // SDK 1.3: a host of 1.3 or later calls this instead, with every declared option at the value
  // of the network being prepared (its own, else the runtime's, else the default), so that two
  // networks may run with different values. `options` holds every declared option with its
  // declared type (the host checked them), so neither at nor get throws. The default CheckOptions
  // suffices: a bool has no range.
  backplane::Result<std::unique_ptr<IWorkload>> CreateWorkloadWithOptions(
      const OperatorDesc& op, const BackendOptions& options) override {
    BACKPLANE_RETURN_IF_ERROR(IsSupported(op));
    const bool check = std::get<bool>(options.at(std::string(kCheckFinite)));
    return std::unique_ptr<IWorkload>(new ReluWorkload(op.name, check, host_));
  }

  // SDK 1.2: the host's services for parallel work, given once right after creation.
  void SetHost(IHost* host) override { host_ = host; }

  // SDK 1.4: check_finite may be given per call (a client debugging one request).
  std::vector<std::string> DescribeCallOptions() const override {
    return {std::string(kCheckFinite)};
  }

  // OptionSet validates (unknown key, wrong type: nothing applied) and is thread-safe.
  std::vector<backplane::OptionDescriptor> DescribeOptions() const override {
    return options_.descriptors();
  }
  Status UpdateOptions(const backplane::BackendOptions& changes) override {
    return options_.Update(changes);
  }
  backplane::Result<backplane::OptionValue> GetOption(std::string_view key) const override {
    return options_.Get(key);
  }

  // This backend starts no threads, tasks or callbacks of its own (ParallelFor has returned
  // before Execute does), so there is nothing to wait for. A backend that does must stop and join
  // them here: the library is unmapped right after destruction.
  void Shutdown() override {}

 private:
  IHost* host_ = nullptr;  // set once by SetHost, before any workload is created
  OptionSet options_{std::string(kId),
                     {{std::string(kCheckFinite), OptionType::kBool, false,
                       "fail a request whose input holds NaN or infinity, naming the node"}}};
};

}  // namespace

// The three C entry points (plus GetBackendRelease, from VERSION in CMakeLists.txt).
BACKPLANE_DEFINE_BACKEND(HelloBackend, "ExampleHello")
