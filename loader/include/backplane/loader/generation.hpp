// A generation: one loaded version of one backend file, and the leases that keep it mapped.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "backplane/loader/backend_file.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane::loader {

class LoaderStats;

// Owns a dlopen handle; dlcloses it on destruction. Move-only.
class LibraryHandle {
 public:
  LibraryHandle() = default;
  explicit LibraryHandle(void* handle) : handle_(handle) {}
  LibraryHandle(LibraryHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  LibraryHandle& operator=(LibraryHandle&& other) noexcept;
  LibraryHandle(const LibraryHandle&) = delete;
  LibraryHandle& operator=(const LibraryHandle&) = delete;
  ~LibraryHandle() { Close(); }

  void* get() const { return handle_; }
  void Close();

 private:
  void* handle_ = nullptr;
};

// The entry points of a loaded backend library, resolved once with dlsym on its own handle.
struct EntryPoints {
  GetBackendIdFn get_backend_id = nullptr;
  GetVersionFn get_version = nullptr;
  BackendFactoryFn backend_factory = nullptr;
  GetBackendReleaseFn get_backend_release = nullptr;             // optional
  GetBackendFactoryErrorFn get_backend_factory_error = nullptr;  // optional
};

// Everything known about a generation; immutable after loading.
struct GenerationInfo {
  uint64_t number = 0;  // process-wide, never reused
  std::string backend_id;
  BackendApiVersion api_version;
  std::string release;                // the backend's own version, "" when it does not say
  std::filesystem::path file;         // as found (maybe a symlink)
  std::filesystem::path real_path;    // the file that was copied: what `file` resolved to
  std::filesystem::path shadow_path;  // the private copy that is mapped
  FileIdentity identity;              // of real_path when copied
  std::string sha256;                 // of the shadow copy's content, i.e. of the code mapped
  std::string build_id;
  std::chrono::system_clock::time_point loaded_at;
};

// One loaded library version. Destroyed only on the reaper thread (through GenerationLease):
// the destructor dlcloses, verifies with RTLD_NOLOAD that the library really left the process,
// records it as unloaded or leaked, and deletes the shadow file.
//
// Thread-safe (immutable); calls into the backend go through BackendInstance.
class Generation {
 public:
  Generation(GenerationInfo info, LibraryHandle library, EntryPoints entry_points,
             std::shared_ptr<LoaderStats> stats);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  const GenerationInfo& info() const { return info_; }
  const EntryPoints& entry_points() const { return entry_points_; }

 private:
  const GenerationInfo info_;
  LibraryHandle library_;
  const EntryPoints entry_points_;
  const std::shared_ptr<LoaderStats> stats_;
};

// "This keeps generation N mapped." Every object made from a generation holds one; the last one
// released hands the generation to the reaper.
using GenerationLease = std::shared_ptr<const Generation>;

}  // namespace backplane::loader
