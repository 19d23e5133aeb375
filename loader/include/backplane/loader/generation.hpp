// A generation: one loaded version of one backend file, and the leases that keep it mapped.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "backplane/core/backend_call_record.hpp"
#include "backplane/loader/backend_file.hpp"
#include "backplane/loader/sealed_image.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane::loader {

class LoaderStats;
class TbbConfinement;

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
  std::string release;              // the backend's own version, "" when it does not say
  std::filesystem::path file;       // as found (maybe a symlink)
  std::filesystem::path real_path;  // the file that was copied: what `file` resolved to
  // How /proc/<pid>/maps (and so gdb, perf and a crash report) names the generation's code:
  // "/memfd:backplane:<number>:<file name>", its sealed copy.
  std::string mapped_as;
  FileIdentity identity;  // of real_path when read
  std::string sha256;     // of the sealed copy's content, i.e. of the code mapped
  std::string build_id;
  std::chrono::system_clock::time_point loaded_at;
  // Where the code runs when not in this process: "worker process 1234" (isolation/); "" for a
  // generation mapped here.
  std::string runs_in;
  // The library submits TBB tasks itself (its ELF imports tbb::detail::r1::spawn and the like):
  // TBB's task templates are compiled into it, so a worker can still be in its code after every
  // wait returned. Such a generation's calls run confined to an arena of its own (RunConfined).
  bool submits_tbb_tasks = false;
};

// A generation whose code runs in another process (isolation/): what its library says
// of itself there, and its factory. The loader never maps such a generation's code; it checks the
// same sealed bytes (ELF, dependencies, trust) and hands them to whoever runs them. Destroying it
// ends that process. Thread-safe.
class OutOfProcessLibrary {
 public:
  virtual ~OutOfProcessLibrary() = default;
  virtual const std::string& backend_id() const = 0;
  virtual BackendApiVersion api_version() const = 0;
  virtual const std::string& release() const = 0;
  // "worker process 1234"
  virtual std::string Describe() const = 0;
  // A new backend instance, made by the library's BackendFactory where the library runs.
  virtual Result<std::unique_ptr<IBackend>> CreateBackend() = 0;
};

// Who runs generations out of process: given a checked sealed copy (and, for messages, the
// generation's number and file), returns the library running elsewhere, or null to have the
// loader map it here as usual (a runner decides by the id the library reports, unless the
// request requires a worker).
struct OutOfProcessRequest {
  const SealedImage& image;
  uint64_t generation;
  const std::filesystem::path& file;
  const std::string& sha256;
  // The caller asks for a worker whatever the backend id (Loader::Placement::kWorker).
  bool required = false;
};
using OutOfProcessRunner =
    std::function<Result<std::unique_ptr<OutOfProcessLibrary>>(const OutOfProcessRequest&)>;

// One loaded library version. Destroyed only on the reaper thread (through GenerationLease):
// the destructor dlcloses, verifies with RTLD_NOLOAD that the library really left the process,
// records it as unloaded or leaked, and closes the sealed copy (a leaked one keeps it: see
// SealedImage).
//
// A generation that submits TBB tasks itself (GenerationInfo::submits_tbb_tasks) has a TBB arena
// of its own, and every call into its code goes through RunConfined, so that every task it
// spawns runs in that arena; the destructor dlcloses only once no thread is inside the arena
// (observed, not timed: docs/loading-rules.md rule 5).
//
// Thread-safe (immutable); calls into the backend go through BackendInstance.
class Generation {
 public:
  Generation(GenerationInfo info, SealedImage image, LibraryHandle library,
             EntryPoints entry_points, std::shared_ptr<LoaderStats> stats);
  // A generation running out of process: no library here, `remote` makes its instances.
  Generation(GenerationInfo info, SealedImage image, std::unique_ptr<OutOfProcessLibrary> remote,
             std::shared_ptr<LoaderStats> stats);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  const GenerationInfo& info() const { return info_; }
  const EntryPoints& entry_points() const { return entry_points_; }
  // Null for a generation mapped in this process.
  OutOfProcessLibrary* out_of_process() const { return remote_.get(); }
  // The bytes that are mapped, sealed: what a rollback keeps, what a trust policy is asked about.
  const SealedImage& image() const { return image_; }
  // A call into this generation's code as a crash report names it (`call`: a string literal).
  // Its strings are this generation's info: alive while the caller holds its lease.
  BackendCallSite CallSite(const char* call) const {
    return {.backend_id = info_.backend_id.c_str(),
            .generation = info_.number,
            .sha256 = info_.sha256.c_str(),
            .file = info_.real_path.c_str(),
            .call = call};
  }

  // Runs `call` (backend code) inside this generation's own TBB arena when it submits TBB tasks
  // itself, else directly; returns what `call` returns and lets its exceptions through. Every
  // call into the generation's code goes through this (BackendInstance, the factory).
  template <typename Call>
  auto RunConfined(Call&& call) const -> decltype(call()) {
    using R = decltype(call());
    if (confinement_ == nullptr)
      return call();
    if constexpr (std::is_void_v<R>) {
      RunInArena(call);
    } else {
      std::optional<R> result;
      RunInArena([&] { result.emplace(call()); });
      return std::move(*result);
    }
  }

  // Threads that entered the generation's own arena so far (0 without one), for tests.
  uint64_t confined_entries() const;

 private:
  void RunInArena(const std::function<void()>& call) const;

  const GenerationInfo info_;
  // Declared before the library: its descriptor must outlive the mapping it names.
  SealedImage image_;
  // Null unless info_.submits_tbb_tasks; emptied and released by the destructor before the
  // library is closed.
  std::unique_ptr<TbbConfinement> confinement_;
  LibraryHandle library_;
  const EntryPoints entry_points_;
  std::unique_ptr<OutOfProcessLibrary> remote_;  // reset first by the destructor
  const std::shared_ptr<LoaderStats> stats_;
};

// "This keeps generation N mapped." Every object made from a generation holds one; the last one
// released hands the generation to the reaper.
using GenerationLease = std::shared_ptr<const Generation>;

}  // namespace backplane::loader
