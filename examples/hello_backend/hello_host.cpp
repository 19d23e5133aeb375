// A host program that exercises ExampleHello through the public Runtime API: finds it in a backend
// directory, sets its option for the runtime, for one network (SDK 1.3) and for one call (SDK
// 1.4), and runs its Relu on a small tensor. Not part of the backend.
//
//   example_hello_host [backend-dir...]     (default: $BACKPLANE_BACKEND_PATHS, else the build's)
#include <cmath>
#include <cstdio>
#include <vector>

#include "backplane/runtime/runtime.hpp"

namespace {

void Print(const char* what, const std::vector<float>& values) {
  std::printf("%s", what);
  for (float v : values)
    std::printf(" %g", v);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  backplane::RuntimeOptions options;
  if (argc > 1)
    options.backend_paths = std::vector<std::filesystem::path>(argv + 1, argv + argc);
  auto runtime = backplane::Runtime::Create(std::move(options));
  if (!runtime.ok()) {
    std::fprintf(stderr, "runtime: %s\n", runtime.error().ToString().c_str());
    return 1;
  }
  auto hello = runtime.value()->Backend("ExampleHello");
  if (hello == nullptr) {
    std::fprintf(stderr, "backend ExampleHello is not available (see the log above)\n");
    return 1;
  }
  std::printf("ExampleHello generation %llu, release %s\n",
              static_cast<unsigned long long>(hello->generation_number()),
              hello->generation() ? hello->generation()->info().release.c_str() : "(static)");
  for (const auto& option : hello->DescribeOptions()) {
    std::printf("option %s (%s, default %s): %s\n", option.name.c_str(),
                std::string(backplane::ToString(option.type)).c_str(),
                backplane::ToString(option.default_value).c_str(), option.help.c_str());
  }

  const backplane::TensorInfo info{backplane::DataType::kFloat32, {2, 3}};
  const backplane::OperatorDesc relu{
      .op_type = "Relu", .name = "relu0", .inputs = {info}, .outputs = {info}};
  // Prepares the Relu as a network with `network_options` (its own option values, SDK 1.3) and
  // runs it, with `call_options` over them for this call when given (SDK 1.4; a Runtime checks
  // them and merges them over the network's: Execute's CallOptions); false when it cannot be
  // prepared.
  auto run = [&](const backplane::BackendOptions& network_options, std::vector<float> input,
                 const backplane::BackendOptions& call_options = {}) {
    auto workload = hello->CreateWorkload(relu, network_options);
    if (!workload.ok()) {
      std::fprintf(stderr, "CreateWorkload: %s\n", workload.error().ToString().c_str());
      return false;
    }
    std::vector<float> output(input.size());
    const backplane::ConstTensorView in{info, input.data()};
    const backplane::TensorView out{info, output.data()};
    Print("in: ", input);
    backplane::BackendOptions merged = hello->EffectiveOptions(network_options);
    for (const auto& [key, value] : call_options)
      merged[key] = value;
    const backplane::Status status = call_options.empty()
                                         ? workload.value()->Execute({&in, 1}, {&out, 1})
                                         : workload.value()->Execute({&in, 1}, {&out, 1}, merged);
    if (status.ok()) {
      Print("out:", output);
    } else {
      std::printf("error: %s\n", status.ToString().c_str());
    }
    return true;
  };
  if (!run({}, {-2, -1, 0, 1, 2, NAN}))
    return 1;

  // Options are validated by the backend; a bad update changes nothing.
  for (const backplane::BackendOptions& update :
       {backplane::BackendOptions{{"check_finite", int64_t{1}}},
        backplane::BackendOptions{{"check_finit", true}},
        backplane::BackendOptions{{"check_finite", true}}}) {
    const backplane::Status status = runtime.value()->UpdateBackendOptions("ExampleHello", update);
    std::printf("update %s=%s: %s\n", update.begin()->first.c_str(),
                backplane::ToString(update.begin()->second).c_str(), status.ToString().c_str());
  }
  // The option is read when a workload is prepared: prepared again (as a runtime re-prepares its
  // networks after an update), the Relu checks.
  if (!run({}, {-2, -1, 0, 1, 2, NAN}))
    return 1;
  // A network may set its own value (SDK 1.3): this one does not check.
  std::printf("network check_finite=false:\n");
  if (!run({{"check_finite", false}}, {-2, -1, 0, 1, 2, NAN}))
    return 1;
  // One call may ask for the check on that network all the same (SDK 1.4).
  std::printf("call check_finite=true:\n");
  if (!run({{"check_finite", false}}, {-2, -1, 0, 1, 2, NAN}, {{"check_finite", true}}))
    return 1;

  const backplane::OperatorDesc sigmoid{
      .op_type = "Sigmoid", .name = "sig0", .inputs = {info}, .outputs = {info}};
  std::printf("IsSupported(Sigmoid): %s\n", hello->IsSupported(sigmoid).ToString().c_str());
  return 0;
}
