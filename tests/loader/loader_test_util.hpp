// Helpers the loader tests share: an Identity layer run on a fixture backend's workload, a
// stage of a load trace, and whether a library is mapped in this process.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backplane/loader/backend_instance.hpp"
#include "backplane/loader/digest.hpp"
#include "backplane/loader/loader.hpp"

namespace backplane::testing {

// A loader with `options`; a failure to create one fails the test.
inline std::shared_ptr<loader::Loader> MakeLoader(loader::LoaderOptions options = {}) {
  auto loader = loader::Loader::Create(std::move(options));
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  return std::move(loader).value();
}

// The SHA-256 of a file's content, as the loader records it; a failure fails the test.
inline std::string FileDigest(const std::filesystem::path& file) {
  auto digest = loader::Sha256OfFile(file);
  EXPECT_TRUE(digest.ok()) << digest.error().ToString();
  return digest.ok() ? digest.value() : "";
}

inline OperatorDesc IdentityOp(int64_t elements) {
  return {.op_type = "Identity",
          .name = "identity",
          .inputs = {{DataType::kFloat32, {elements}}},
          .outputs = {{DataType::kFloat32, {elements}}}};
}

// Runs `workload` on 0, 1, 2... and returns the outputs.
inline std::vector<float> RunIdentity(loader::Workload& workload, int64_t elements) {
  std::vector<float> in(elements), out(elements, -1.0f);
  for (int64_t i = 0; i < elements; ++i)
    in[i] = static_cast<float>(i);
  const ConstTensorView input{{DataType::kFloat32, {elements}}, in.data()};
  const TensorView output{{DataType::kFloat32, {elements}}, out.data()};
  Status status = workload.Execute({&input, 1}, {&output, 1});
  EXPECT_TRUE(status.ok()) << status.ToString();
  return out;
}

// The stage of `trace` named `name`; null when the load did not get there.
inline const loader::LoadStage* FindStage(const loader::LoadTrace& trace, std::string_view name) {
  for (const auto& stage : trace.stages) {
    if (stage.name == name)
      return &stage;
  }
  return nullptr;
}

// Whether `library` (a path or a soname) is mapped in this process.
inline bool InProcess(const std::filesystem::path& library) {
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle != nullptr)
    dlclose(handle);  // NOLOAD still counts a reference
  return handle != nullptr;
}

}  // namespace backplane::testing
