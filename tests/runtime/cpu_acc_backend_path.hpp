// The CpuAcc backend file the runtime's CpuAcc tests load.
#pragma once

#include <cstdlib>
#include <filesystem>

#ifndef BACKPLANE_CPU_ACC
#error "BACKPLANE_CPU_ACC (the path of the built Backplane_CpuAcc_backend.so) comes from CMake"
#endif

namespace backplane::testing {

// BACKPLANE_CPU_ACC_BACKEND when set (another build's CpuAcc), else where this build puts it.
inline std::filesystem::path CpuAccBackend() {
  const char* path = std::getenv("BACKPLANE_CPU_ACC_BACKEND");
  return path != nullptr && *path != '\0' ? std::filesystem::path(path)
                                          : std::filesystem::path(BACKPLANE_CPU_ACC);
}

}  // namespace backplane::testing
