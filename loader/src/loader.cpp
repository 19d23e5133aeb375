#include "backplane/loader/loader.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <tbb/task_arena.h>

#include "backplane/core/backend_call.hpp"
#include "backplane/core/backend_call_record.hpp"
#include "backplane/loader/dependencies.hpp"
#include "backplane/loader/digest.hpp"
#include "backplane/loader/elf_inspector.hpp"
#include "backplane/loader/sealed_image.hpp"
#include "loader_log.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

// Never reused within the process: names one generation in records, logs and /proc/<pid>/maps.
std::atomic<uint64_t> next_generation{1};

// Records stages into an optional trace; the trace is for `backplane check` and debugging.
class Tracer {
 public:
  explicit Tracer(LoadTrace* trace) : trace_(trace) {}
  void Pass(std::string stage, std::string detail) {
    if (trace_ != nullptr)
      trace_->Add({std::move(stage), true, std::move(detail)});
  }
  void Warn(std::string stage, std::string detail) {
    if (trace_ != nullptr)
      trace_->Add({std::move(stage), true, std::move(detail), true});
  }
  Status Fail(std::string stage, Status error) {
    if (trace_ != nullptr)
      trace_->Add({std::move(stage), false, error.message()});
    return error;
  }

 private:
  LoadTrace* trace_;
};

// What a backend built with backplane_add_backend() would not have: loadable, but a sign that
// the file was built some other way, without the flags that keep versions apart. Empty when none.
std::string BuildAdvice(const ElfFacts& facts) {
  static constexpr std::string_view kEntryPoints[] = {"GetBackendId", "GetVersion",
                                                      "BackendFactory", "GetBackendRelease",
                                                      "GetBackendFactoryError"};
  std::vector<std::string> extra;
  for (const std::string& symbol : facts.exported_symbols) {
    if (std::find(std::begin(kEntryPoints), std::end(kEntryPoints), symbol) ==
        std::end(kEntryPoints)) {
      extra.push_back(symbol);
    }
  }
  const std::size_t entry_points = facts.exported_symbols.size() - extra.size();
  const std::size_t extra_count = facts.exported_symbol_count - entry_points;
  std::string advice;
  if (extra_count != 0) {
    constexpr std::size_t kNamed = 5;
    std::string names;
    for (std::size_t i = 0; i < extra.size() && i < kNamed; ++i)
      names += (names.empty() ? "" : ", ") + Demangle(extra[i]);
    if (extra_count > kNamed)
      names += " and " + std::to_string(extra_count - kNamed) + " more";
    advice = "exports " + std::to_string(extra_count) + " symbol" + (extra_count == 1 ? "" : "s") +
             " besides the entry points (" + names +
             "): code another library could bind to; build with backplane_add_backend() "
             "(hidden visibility, a version script exporting only the entry points)";
  }
  if (!facts.binds_now) {
    advice += std::string(advice.empty() ? "" : "; ") +
              "binds lazily (no -z now): the host's RTLD_NOW resolves every symbol at load "
              "anyway, but link with -Wl,-z,now (backplane_add_backend() does) so that every "
              "other loader does too";
  }
  return advice;
}

// dlerror() names the sealed copy (/proc/self/fd/N), which the operator never sees; name the
// deployed file.
std::string NameTheDeployedFile(std::string message, const fs::path& mapped_path,
                                const fs::path& real_path) {
  const std::string from = mapped_path.string();
  const std::string to = real_path.string();
  for (auto at = message.find(from); at != std::string::npos;
       at = message.find(from, at + to.size())) {
    message.replace(at, from.size(), to);
  }
  return message;
}

// The one dlopen failure whose cause is the machine's, not the backend's: the kernel refuses to
// map memory files executable.
std::string ExplainMapFailure(const std::string& message) {
  if (message.find("failed to map segment") == std::string::npos)
    return message;
  return message +
         " (the sealed memory copy could not be mapped executable: does a security module "
         "forbid executable mappings of memory files?)";
}

std::string DlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dynamic linker error";
}

// Why BackendFactory returned null. BACKPLANE_DEFINE_BACKEND's factory catches what the
// backend's constructor throws and keeps its message for GetBackendFactoryError(), on the
// calling thread; a backend without that entry point (built before it existed) cannot say.
std::string NullFactoryReason(const EntryPoints& entry_points) {
  constexpr std::size_t kMaxMessage = 1024;  // the backend's buffer is smaller; never trust it
  if (entry_points.get_backend_factory_error != nullptr) {
    const char* message = GuardBackendCall(
        [&] { return entry_points.get_backend_factory_error(); },
        [](std::string_view) -> const char* { return nullptr; });  // as if it could not say
    if (message != nullptr && *message != '\0')
      return "BackendFactory failed: " + std::string(message, strnlen(message, kMaxMessage));
  }
  return "BackendFactory returned null";
}

// An entry point of the library being loaded, called through the one guard: what escapes it fails
// the load with `reason`, naming the file and the entry point.
// `site`: the call as a crash report names it (the library's own code runs).
template <typename Call>
Status CallEntryPoint(const fs::path& file, const BackendCallSite& site, LoadReason reason,
                      Call&& call) {
  const std::string_view name = site.call;
  const ScopedBackendCall running(site);
  return GuardBackendCall(
      [&] {
        call();
        return Status::Ok();
      },
      [&](std::string_view detail) {
        return Status{reason,
                      file.string() + ": " + std::string(name) + " threw: " + std::string(detail)};
      });
}

// The trust stage: nothing to say without a policy (every content loads, as before trust existed).
Status CheckTrust(const TrustPolicy* trust, const BackendFile& file,
                  std::span<const std::byte> content, const std::string& sha256, Tracer& tracer) {
  if (trust == nullptr)
    return Status::Ok();
  Status verdict = trust->Check({file.path, content, sha256, file.real_path});
  if (!verdict.ok())
    return tracer.Fail("trust", std::move(verdict));
  tracer.Pass("trust", "sha256 on " + trust->Describe());
  return Status::Ok();
}

std::string VersionString(BackendApiVersion version) {
  return std::to_string(version.major) + "." + std::to_string(version.minor);
}

}  // namespace

Result<std::shared_ptr<Loader>> Loader::Create(LoaderOptions options) {
  // Rule 5: the host owns the threading runtime. Calling into libtbb here makes it a real
  // dependency of every host (the linker drops unused libraries with --as-needed); otherwise the
  // first backend that uses TBB would bring libtbb in, and unloading that backend would unmap
  // libtbb under its own worker threads (seen: a SIGSEGV in a TBB worker).
  [[maybe_unused]] static const int tbb_threads = tbb::this_task_arena::max_concurrency();
  auto shadows = ShadowDirectory::Create(options.shadow_root);
  if (!shadows.ok())
    return std::move(shadows).error();
  return std::shared_ptr<Loader>(new Loader(std::move(options), std::move(shadows).value()));
}

Result<std::shared_ptr<Loader>> Loader::Shared() {
  static Mutex mutex;
  static std::weak_ptr<Loader> shared BACKPLANE_GUARDED_BY(mutex);
  MutexLock lock(mutex);
  if (auto existing = shared.lock())
    return existing;
  auto created = Create();
  if (created.ok())
    shared = created.share();
  return created;
}

bool IsValidBackendId(std::string_view id) {
  if (id.empty() || id.size() > 64)
    return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok)
      return false;
  }
  return true;
}

namespace {

Status InvalidIdError(const BackendFile& file, const std::string& id) {
  return {LoadReason::kInvalidId,
          file.path.string() + ": GetBackendId returned " +
              (id.empty() ? std::string("an empty id") : "'" + id.substr(0, 80) + "'") +
              "; an id is 1 to 64 letters, digits, '_', '-' or '.'"};
}

Status ApiIncompatibleError(const BackendFile& file, const std::string& id, BackendApiVersion api,
                            BackendApiVersion host) {
  return {LoadReason::kApiIncompatible,
          file.path.string() + " (backend " + id + ") is built against backend API " +
              VersionString(api) + " but this host implements " + VersionString(host) +
              " (needs major " + std::to_string(host.major) +
              ", minor <= " + std::to_string(host.minor) + "); rebuild it against this SDK"};
}

}  // namespace

Loader::Loader(LoaderOptions options, std::shared_ptr<ShadowDirectory> shadows)
    : options_(std::move(options)), shadows_(std::move(shadows)) {}

Result<GenerationLease> Loader::Load(const fs::path& file, LoadTrace* trace, Reuse reuse,
                                     const TrustPolicy* trust, Placement placement) {
  Tracer tracer(trace);
  if (placement == Placement::kWorker && !options_.out_of_process) {
    return tracer.Fail("worker", FailedPrecondition("cannot load " + file.string() +
                                                    " in a worker process: this loader "
                                                    "starts none (no out_of_process runner)"));
  }
  auto resolved = ResolveBackendFile(file, options_.file_policy);
  if (!resolved.ok()) {
    const auto reason = resolved.error().reason();
    if (reason == LoadReason::kUnsafePermissions)
      tracer.Pass("file", file.string());
    return tracer.Fail(reason == LoadReason::kUnsafePermissions ? "permissions" : "file",
                       std::move(resolved).error());
  }
  const bool via_symlink = fs::absolute(resolved->path).lexically_normal() != resolved->real_path;
  tracer.Pass("file", via_symlink ? resolved->path.string() + " -> " + resolved->real_path.string()
                                  : resolved->path.string());
  tracer.Pass("permissions", "owner and mode safe");

  // A sandboxed generation is nobody else's: never shared, never handed out as configured.
  if (reuse == Reuse::kLiveUnchanged && placement == Placement::kAsConfigured) {
    // An unchanged file that is already mapped is not mapped again.
    std::shared_ptr<const Generation> existing;
    {
      MutexLock lock(mutex_);
      auto it = live_.find(resolved->real_path);
      if (it != live_.end())
        existing = it->second.lock();
    }
    if (existing && ReadFileIdentity(resolved->real_path) == existing->info().identity) {
      // Mapped for a caller whose policy may differ from this one's: ask this one too (about
      // the content mapped, the sealed copy, which cannot have changed since it was digested).
      const GenerationInfo& info = existing->info();
      if (trust != nullptr) {  // without a policy there is nothing to ask: no mapping
        auto content = existing->image().Map();
        if (!content.ok())
          return tracer.Fail("trust", std::move(content).error());
        if (Status trusted = CheckTrust(trust, *resolved, content->span(), info.sha256, tracer);
            !trusted.ok()) {
          return trusted;
        }
      }
      tracer.Pass("cache", "already loaded as generation " + std::to_string(info.number));
      return GenerationLease(existing);
    }
  }
  auto loaded = LoadNew(*resolved, trace, trust, placement);
  if (loaded.ok() && placement == Placement::kAsConfigured) {
    MutexLock lock(mutex_);
    live_[resolved->real_path] = loaded.share();
    std::erase_if(live_, [](const auto& entry) { return entry.second.expired(); });
  }
  return loaded;
}

Result<GenerationLease> Loader::LoadNew(const BackendFile& file, LoadTrace* trace,
                                        const TrustPolicy* trust, Placement placement) {
  Tracer tracer(trace);
  const uint64_t number = next_generation.fetch_add(1, std::memory_order_relaxed);

  // Rule 1, and the trust list's promise: the file is read once, into a sealed memory copy, and
  // every stage below reads that copy. No path is opened again after the digest, so whoever can
  // rename files in a directory cannot swap what was judged for something that was not.
  // Labelled so that /proc/<pid>/maps, gdb and perf name the generation and its file.
  std::string label = "backplane:";
  label += std::to_string(number);
  label += ':';
  label += file.real_path.filename().string();
  auto image =
      SealedImage::Read(file.real_path, label, options_.max_file_bytes, options_.read_timeout);
  if (!image.ok())
    return tracer.Fail("copy", std::move(image).error());
  tracer.Pass("copy", "sealed memory copy, " + std::to_string(image->size()) + " bytes");
  auto content = image->Map();
  if (!content.ok())
    return tracer.Fail("copy", std::move(content).error());
  const std::string sha256 = Sha256Of(content->span());
  tracer.Pass("digest", "sha256 " + sha256);
  // Before anything reads the copy as ELF or maps it: no byte of untrusted content is
  // interpreted, and no code of it runs, not even its static constructors.
  BACKPLANE_RETURN_IF_ERROR(CheckTrust(trust, file, content->span(), sha256, tracer));

  auto facts = InspectElf(content->span(), file.path.string());
  content = ImageBytes();  // dlopen maps what it needs itself
  if (!facts.ok())
    return tracer.Fail("elf", std::move(facts).error());
  tracer.Pass("elf", facts->build_id.empty()
                         ? "unloadable shared object"
                         : "unloadable shared object, build-id " + facts->build_id);

  if (std::string advice = BuildAdvice(facts.value()); !advice.empty())
    tracer.Warn("build", std::move(advice));
  // Rule 5: a backend with TBB's task templates compiled in is confined (Generation).
  if (std::string advice = TbbTaskAdvice(facts.value()); !advice.empty())
    tracer.Warn("threads", std::move(advice));

  // What is known of the generation wherever its code runs, with what its library says of itself.
  auto describe = [&](const std::string& id, BackendApiVersion api, const std::string& release) {
    return GenerationInfo{.number = number,
                          .backend_id = id,
                          .api_version = api,
                          .release = release,
                          .file = file.path,
                          .real_path = file.real_path,
                          .mapped_as = image->maps_name(),
                          .identity = image->source_identity(),
                          .sha256 = sha256,
                          .build_id = facts->build_id,
                          .loaded_at = std::chrono::system_clock::now()};
  };

  // Checked like any other: now it may run in a worker process instead (isolation/).
  if (options_.out_of_process) {
    auto remote = options_.out_of_process({.image = *image,
                                           .generation = number,
                                           .file = file.path,
                                           .sha256 = sha256,
                                           .required = placement == Placement::kWorker});
    if (!remote.ok())
      return tracer.Fail("worker", std::move(remote).error());
    if (*remote != nullptr) {
      OutOfProcessLibrary& library = **remote;
      if (!IsValidBackendId(library.backend_id()))
        return tracer.Fail("id", InvalidIdError(file, library.backend_id()));
      if (!IsApiCompatible(library.api_version(), options_.host_api)) {
        return tracer.Fail("version",
                           ApiIncompatibleError(file, library.backend_id(), library.api_version(),
                                                options_.host_api));
      }
      tracer.Pass("worker", "runs in " + library.Describe() + " as backend " +
                                library.backend_id() + ", API " +
                                VersionString(library.api_version()));
      GenerationInfo info =
          describe(library.backend_id(), library.api_version(), library.release());
      info.runs_in = library.Describe();
      GenerationLease generation =
          MakeReaped(std::make_unique<const Generation>(std::move(info), std::move(image).value(),
                                                        std::move(remote).value(), stats_),
                     reaper_);
      auto probe = CreateInstance(generation);
      if (!probe.ok())
        return tracer.Fail("factory", std::move(probe).error());
      tracer.Pass("factory", "created and released a probe instance in the worker");
      return generation;
    }
  }

  // Rule 8: what the backend needs and glibc could never unload is made resident first, or the
  // first generation to bring it in would stay mapped forever.
  auto dependencies = PrepareDependencies(facts.value(), file.path);
  if (!dependencies.ok())
    return tracer.Fail("dependencies", std::move(dependencies).error());
  tracer.Pass("dependencies", DescribeDependencies(dependencies.value()));
  // Rule 5: a warning, not a refusal (DescribeSharedRegistries says why).
  if (std::string shared = DescribeSharedRegistries(facts.value(), dependencies.value());
      !shared.empty()) {
    Log().warn("{} {} (loading rule 5)", file.path.string(), shared);
    tracer.Warn("registries", std::move(shared));
  }

  // Rule 2: RTLD_NOW turns a missing symbol into a load error instead of a later process kill;
  // RTLD_LOCAL keeps two versions of one backend from binding to each other's symbols.
  // The sealed copy by its descriptor: a name that reaches those bytes and nothing else.
  const fs::path mapped_path = image->ProcPath();
  // From dlopen on, the library's own code runs (its static constructors, then its entry
  // points): a crash in it names the file being loaded, and its id once GetBackendId said it.
  // The strings are this function's, alive across each call.
  std::string loading_id;
  auto loading = [&](const char* call) {
    return BackendCallSite{.backend_id = loading_id.empty() ? nullptr : loading_id.c_str(),
                           .generation = number,
                           .sha256 = sha256.c_str(),
                           .file = file.real_path.c_str(),
                           .call = call};
  };
  LibraryHandle library;
  {
    const ScopedBackendCall running(loading("dlopen (its static constructors)"));
    library = LibraryHandle(dlopen(mapped_path.c_str(), RTLD_NOW | RTLD_LOCAL));
  }
  if (library.get() == nullptr) {
    return tracer.Fail(
        "dlopen",
        {LoadReason::kDlopenFailed,
         file.path.string() + ": the dynamic linker refused it: " +
             ExplainMapFailure(NameTheDeployedFile(DlError(), mapped_path, file.real_path))});
  }
  tracer.Pass("dlopen", "RTLD_NOW | RTLD_LOCAL");

  EntryPoints entry_points;
  std::string missing;
  auto resolve = [&](const char* name, auto& pointer) {
    dlerror();
    pointer =
        reinterpret_cast<std::remove_reference_t<decltype(pointer)>>(dlsym(library.get(), name));
    if (pointer == nullptr)
      missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  resolve("GetBackendId", entry_points.get_backend_id);
  resolve("GetVersion", entry_points.get_version);
  resolve("BackendFactory", entry_points.backend_factory);
  if (!missing.empty()) {
    return tracer.Fail("entry points",
                       {LoadReason::kMissingEntryPoint,
                        file.path.string() + " does not export " + missing +
                            " with C linkage; define them with BACKPLANE_DEFINE_BACKEND() and "
                            "build with backplane_add_backend()"});
  }
  std::string optional_missing;
  std::swap(missing, optional_missing);
  resolve("GetBackendRelease", entry_points.get_backend_release);
  resolve("GetBackendFactoryError", entry_points.get_backend_factory_error);
  tracer.Pass("entry points", "GetBackendId, GetVersion, BackendFactory");

  const char* raw_id = nullptr;
  if (Status called = CallEntryPoint(file.path, loading("GetBackendId"), LoadReason::kInvalidId,
                                     [&] { raw_id = entry_points.get_backend_id(); });
      !called.ok()) {
    return tracer.Fail("id", std::move(called));
  }
  if (raw_id == nullptr) {
    return tracer.Fail(
        "id", {LoadReason::kInvalidId, file.path.string() + ": GetBackendId returned null"});
  }
  const std::string id = raw_id;
  if (!IsValidBackendId(id))
    return tracer.Fail("id", InvalidIdError(file, id));
  tracer.Pass("id", id);
  loading_id = id;

  BackendApiVersion api{};
  if (Status called = CallEntryPoint(file.path, loading("GetVersion"), LoadReason::kApiIncompatible,
                                     [&] { entry_points.get_version(&api.major, &api.minor); });
      !called.ok()) {
    return tracer.Fail("version", std::move(called));
  }
  if (!IsApiCompatible(api, options_.host_api))
    return tracer.Fail("version", ApiIncompatibleError(file, id, api, options_.host_api));
  tracer.Pass("version",
              "backend API " + VersionString(api) + " on host " + VersionString(options_.host_api));

  std::string release;
  if (entry_points.get_backend_release != nullptr) {
    const ScopedBackendCall running(loading("GetBackendRelease"));
    GuardBackendCall(
        [&] {
          if (const char* text = entry_points.get_backend_release())
            release = text;
        },
        [&](std::string_view) { release.clear(); });  // optional: no release said
  }

  GenerationInfo info = describe(id, api, release);
  info.submits_tbb_tasks = !facts->tbb_task_imports.empty();
  GenerationLease generation =
      MakeReaped(std::make_unique<const Generation>(std::move(info), std::move(image).value(),
                                                    std::move(library), entry_points, stats_),
                 reaper_);

  auto probe = CreateInstance(generation);
  if (!probe.ok())
    return tracer.Fail("factory", std::move(probe).error());
  tracer.Pass("factory", "created and released a probe instance");
  Log().debug("mapped backend {} generation {} from {} (API {}{}{})", id, number,
              file.path.string(), VersionString(api), release.empty() ? "" : ", release ", release);
  return generation;
}

Result<std::shared_ptr<BackendInstance>> Loader::CreateInstance(const GenerationLease& generation) {
  const GenerationInfo& info = generation->info();
  if (OutOfProcessLibrary* remote = generation->out_of_process()) {
    auto backend = remote->CreateBackend();
    if (!backend.ok()) {
      return Status{backend.error().reason().value_or(LoadReason::kFactoryFailed),
                    info.file.string() + " (backend " + info.backend_id + ", in " +
                        remote->Describe() + "): " + backend.error().message()};
    }
    return MakeBackendInstance(info.backend_id, std::move(backend).value(), generation, reaper_);
  }
  IBackend* raw = nullptr;
  std::string failure;
  GuardBackendCall(
      [&] {
        const ScopedBackendCall running(generation->CallSite("BackendFactory"));
        raw = generation->RunConfined(generation->entry_points().backend_factory);
        if (raw == nullptr)
          failure = NullFactoryReason(generation->entry_points());
      },
      [&](std::string_view detail) { failure = "BackendFactory threw: " + std::string(detail); });
  if (!failure.empty()) {
    return Status{LoadReason::kFactoryFailed,
                  info.file.string() + " (backend " + info.backend_id + "): " + failure};
  }
  auto instance =
      MakeBackendInstance(info.backend_id, std::unique_ptr<IBackend>(raw), generation, reaper_);
  const std::string instance_id = GuardBackendCall(
      [&] {
        const ScopedBackendCall running(generation->CallSite("IBackend::GetId"));
        return std::string(raw->GetId());
      },
      [](std::string_view) { return "<GetId threw>"; });
  if (instance_id != info.backend_id) {
    return Status{LoadReason::kInvalidId, info.file.string() + ": the instance says its id is '" +
                                              instance_id + "' but GetBackendId says '" +
                                              info.backend_id + "'"};
  }
  return instance;
}

}  // namespace backplane::loader
