#include "backplane/loader/dependencies.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/loader/backend_file.hpp"
#include "loader_log.hpp"
#include "runtime_evidence.hpp"

namespace backplane::loader {
namespace fs = std::filesystem;

namespace {

// A dependency tree deeper or wider than this is not a backend's.
constexpr std::size_t kMaxLibraries = 256;

#if defined(__x86_64__)
constexpr const char* kMultiarch = "x86_64-linux-gnu";
#elif defined(__aarch64__)
constexpr const char* kMultiarch = "aarch64-linux-gnu";
#else
constexpr const char* kMultiarch = "";
#endif

// /etc/ld.so.cache (glibc's "glibc-ld.so.cache1.1" format, the only one glibc 2.32+ writes):
// soname -> path, first entry for this host's ABI wins, as in the dynamic linker.
class LdSoCache {
 public:
  static const LdSoCache& Get() {
    static const LdSoCache cache("/etc/ld.so.cache");
    return cache;
  }
  std::optional<fs::path> Find(const std::string& name) const {
    auto it = paths_.find(name);
    if (it == paths_.end())
      return std::nullopt;
    return it->second;
  }

 private:
  explicit LdSoCache(const char* file) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    constexpr std::string_view kMagic = "glibc-ld.so.cache1.1";
    constexpr std::size_t kHeader = 48, kEntry = 24;
    const std::size_t at = bytes.find(kMagic);  // after the old format's table, when both exist
    if (at == std::string::npos || bytes.size() < at + kHeader)
      return;
    auto u32 = [&](std::size_t offset) {
      uint32_t value = 0;
      std::memcpy(&value, bytes.data() + offset, sizeof value);
      return value;
    };
    auto string_at = [&](uint32_t offset) -> std::optional<std::string> {
      const std::size_t begin = at + offset;  // offsets count from the new header
      if (begin >= bytes.size())
        return std::nullopt;
      const std::size_t end = bytes.find('\0', begin);
      if (end == std::string::npos)
        return std::nullopt;
      return bytes.substr(begin, end - begin);
    };
    const uint32_t count = u32(at + 20);
    // The low byte says the ELF flavour (3: libc6), the next one the ABI (x86-64, AArch64...);
    // this host's own libraries carry the right one, so take the flags of libc.so.6's entry.
    constexpr int32_t kElfLibc6 = 0x0003;
    std::optional<int32_t> host_flags;
    std::vector<std::tuple<int32_t, std::string, std::string>> entries;
    for (uint32_t i = 0; i < count; ++i) {
      const std::size_t entry = at + kHeader + std::size_t{i} * kEntry;
      if (entry + kEntry > bytes.size())
        break;
      const auto flags = static_cast<int32_t>(u32(entry));
      auto key = string_at(u32(entry + 4));
      auto value = string_at(u32(entry + 8));
      if (!key || !value || (flags & 0xff) != kElfLibc6)
        continue;
      if (*key == "libc.so.6" && !host_flags && value->find(kMultiarch) != std::string::npos)
        host_flags = flags;
      entries.emplace_back(flags, std::move(*key), std::move(*value));
    }
    for (auto& [flags, key, value] : entries) {
      if (!host_flags || flags == *host_flags)
        paths_.emplace(std::move(key), std::move(value));
    }
  }

  std::map<std::string, fs::path> paths_;
};

bool IsRegularFile(const fs::path& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<fs::path> SplitSearchPath(std::string_view list, const fs::path& origin) {
  std::vector<fs::path> directories;
  for (const fs::path& entry : SplitPathList(list)) {
    std::string directory = entry.string();
    for (std::string_view token : {"${ORIGIN}", "$ORIGIN"}) {
      for (auto at = directory.find(token); at != std::string::npos; at = directory.find(token))
        directory.replace(at, token.size(), origin.string());
    }
    directories.emplace_back(directory);
  }
  return directories;
}

// Where the dynamic linker would find `name` for an object in `origin` with `facts` (ld.so(8),
// "Rpath token expansion" and "search order"). Hardware-capability subdirectories are not tried:
// Debian installs none for the libraries backends use.
std::optional<fs::path> FindLibrary(const std::string& name, const ElfFacts& facts,
                                    const fs::path& origin) {
  if (name.find('/') != std::string::npos) {
    fs::path path = fs::path(name).is_absolute() ? fs::path(name) : origin / name;
    return IsRegularFile(path) ? std::optional(path) : std::nullopt;
  }
  std::vector<fs::path> directories;
  const auto own = SplitSearchPath(facts.search_path, origin);
  if (!facts.search_path_is_runpath)
    directories.insert(directories.end(), own.begin(), own.end());
  if (const char* library_path = std::getenv("LD_LIBRARY_PATH")) {
    const auto from_environment = SplitSearchPath(library_path, origin);
    directories.insert(directories.end(), from_environment.begin(), from_environment.end());
  }
  if (facts.search_path_is_runpath)
    directories.insert(directories.end(), own.begin(), own.end());
  for (const fs::path& directory : directories) {
    if (IsRegularFile(directory / name))
      return directory / name;
  }
  if (auto cached = LdSoCache::Get().Find(name); cached && IsRegularFile(*cached))
    return cached;
  for (std::string prefix : {"/lib/", "/usr/lib/"}) {
    for (const fs::path& directory : {fs::path(prefix + kMultiarch), fs::path(prefix)}) {
      if (IsRegularFile(directory / name))
        return directory / name;
    }
  }
  return std::nullopt;
}

// Whether a loaded object is the file at `path`, compared by device and inode. RTLD_NOLOAD
// misses the dynamic linker itself: mapped as /lib64/ld-linux-x86-64.so.2, needed as
// /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 by every library that uses thread_local (for
// __tls_get_addr), and glibc records no file identity for it to compare.
bool IsMappedFile(const fs::path& path) {
  struct stat wanted {};
  if (stat(path.c_str(), &wanted) != 0)
    return false;
  auto same_file = [](dl_phdr_info* info, std::size_t, void* data) -> int {
    const auto* wanted = static_cast<const struct stat*>(data);
    struct stat st {};
    return info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' &&
                   stat(info->dlpi_name, &st) == 0 && st.st_dev == wanted->st_dev &&
                   st.st_ino == wanted->st_ino
               ? 1
               : 0;
  };
  return dl_iterate_phdr(same_file, &wanted) != 0;
}

bool IsLoaded(const fs::path& path) {
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr)
    return IsMappedFile(path);
  dlclose(handle);  // NOLOAD still counts a reference
  return true;
}

// What keeps glibc from ever unloading a library with `facts`; empty when nothing does.
std::string WhatPins(const ElfFacts& facts) {
  std::string why;
  auto add = [&why](const std::string& cause) { why += (why.empty() ? "" : ", ") + cause; };
  if (facts.unique_symbol_count != 0) {
    add("defines " + std::to_string(facts.unique_symbol_count) + " STB_GNU_UNIQUE symbol" +
        (facts.unique_symbol_count == 1 ? "" : "s"));
  }
  if (facts.nodelete)
    add("is DF_1_NODELETE");
  if (!facts.thread_atexit_import.empty())
    add("registers thread_local destructors (" + facts.thread_atexit_import + ")");
  return why;
}

// A mangled function name without its parameters, for messages.
std::string FunctionName(std::string_view symbol) {
  std::string name = Demangle(symbol);
  return name.substr(0, name.find('('));
}

// Rule 5: why `soname`, with `facts`, starts worker threads that outlive a call; empty when
// nothing says so. Its name alone is enough for the runtimes listed; otherwise it takes both a
// fork entry point defined and a thread start imported (a stub library has only the first).
std::string WhatThreadsOutlive(const std::string& soname, const ElfFacts& facts) {
  std::string evidence;
  if (auto runtime = ThreadPoolRuntimeByName(soname))
    evidence = *runtime;
  if (!facts.thread_pool_entry_point.empty() && !facts.thread_start_import.empty()) {
    evidence += (evidence.empty() ? "" : ": ") + std::string("defines ") +
                FunctionName(facts.thread_pool_entry_point) + ", imports " +
                FunctionName(facts.thread_start_import);
  }
  if (evidence.empty())
    return {};
  return "starts worker threads that outlive a call (" + evidence + ")";
}

bool SameDirectory(const fs::path& a, const fs::path& b) {
  std::error_code error;
  return fs::equivalent(a, b, error);
}

// The libraries this process made resident, with why; never closed (RTLD_NODELETE would keep
// them anyway).
struct Residency {
  std::string why;
  bool starts_worker_threads = false;
};
Mutex resident_mutex;
std::map<fs::path, Residency>& ResidentLibraries() BACKPLANE_REQUIRES(resident_mutex) {
  static auto* libraries = new std::map<fs::path, Residency>();  // immortal: used during exit
  return *libraries;
}

std::optional<Residency> WhyResident(const fs::path& path) {
  MutexLock lock(resident_mutex);
  auto it = ResidentLibraries().find(path);
  if (it == ResidentLibraries().end())
    return std::nullopt;
  return it->second;
}

Status MakeResident(const Dependency& library, const std::string& backend) {
  MutexLock lock(resident_mutex);
  if (ResidentLibraries().contains(library.path))
    return Status::Ok();
  if (dlopen(library.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) == nullptr) {
    const char* error = dlerror();
    return {LoadReason::kDlopenFailed,
            backend + " needs " + library.name + " (" + library.path.string() +
                "), which must stay in the process (it " + library.why_resident +
                ") and which could not be loaded ahead of the backend: " +
                (error != nullptr ? error : "unknown dynamic linker error")};
  }
  ResidentLibraries().emplace(library.path,
                              Residency{library.why_resident, library.starts_worker_threads});
  Log().info(
      "made {} resident for the rest of the process, before {} loads: it {}, so {} "
      "(loading rules 5 and 8)",
      library.path.string(), backend, library.why_resident,
      library.starts_worker_threads
          ? "unloading it with the backend would leave its threads parked in unmapped code"
          : "the backend copy that brought it in could never be unloaded");
  return Status::Ok();
}

}  // namespace

std::string_view ToString(Dependency::State state) {
  switch (state) {
    case Dependency::State::kAlreadyLoaded:
      return "already loaded";
    case Dependency::State::kResident:
      return "made resident";
    case Dependency::State::kLoadsWithBackend:
      return "loads with the backend";
    case Dependency::State::kNotFound:
      return "not found";
  }
  return "unknown";
}

Result<std::vector<Dependency>> PrepareDependencies(const ElfFacts& backend,
                                                    const fs::path& deployed_file) {
  const std::string backend_name = deployed_file.filename().string();
  const fs::path backend_directory = fs::absolute(deployed_file).parent_path();

  struct Pending {
    std::string name;
    std::string needed_by;
    const ElfFacts* facts;  // of the object that needs it
    fs::path origin;
  };
  std::deque<ElfFacts> read;  // stable addresses for Pending::facts
  std::deque<Pending> pending;
  for (const std::string& name : backend.needed)
    pending.push_back({name, backend_name, &backend, backend_directory});

  std::vector<Dependency> libraries;
  std::set<std::string> seen;
  while (!pending.empty() && libraries.size() < kMaxLibraries) {
    Pending next = std::move(pending.front());
    pending.pop_front();
    if (!seen.insert(next.name).second)
      continue;
    Dependency library{.name = next.name, .needed_by = next.needed_by};
    auto found = FindLibrary(next.name, *next.facts, next.origin);
    if (!found) {
      libraries.push_back(std::move(library));  // dlopen names it when it refuses the backend
      continue;
    }
    library.path = *found;
    if (SameDirectory(found->parent_path(), backend_directory)) {
      return Status{LoadReason::kBundledDependency,
                    deployed_file.string() + " needs " + next.name + ", which resolves to " +
                        found->string() +
                        " in the backend directory: glibc loads one copy of a library per "
                        "soname, so every later version of the backend would run with the first "
                        "version's copy; link it statically into the backend, or install it as a "
                        "system library"};
    }
    if (auto residency = WhyResident(*found)) {
      library.state = Dependency::State::kResident;
      library.why_resident = std::move(residency->why);
      library.starts_worker_threads = residency->starts_worker_threads;
      libraries.push_back(std::move(library));
      continue;
    }
    if (IsLoaded(*found)) {
      library.state = Dependency::State::kAlreadyLoaded;
      libraries.push_back(std::move(library));
      continue;  // its own dependencies are loaded too
    }
    auto facts = ReadElfFile(*found, found->string());
    if (!facts.ok()) {
      // Not for us to judge: the dynamic linker refuses it with its own words.
      library.state = Dependency::State::kLoadsWithBackend;
      libraries.push_back(std::move(library));
      continue;
    }
    library.why_resident = WhatPins(facts.value());
    if (std::string threads =
            WhatThreadsOutlive(fs::path(next.name).filename().string(), facts.value());
        !threads.empty()) {
      library.starts_worker_threads = true;
      library.why_resident += (library.why_resident.empty() ? "" : ", ") + threads;
    }
    library.state = library.why_resident.empty() ? Dependency::State::kLoadsWithBackend
                                                 : Dependency::State::kResident;
    read.push_back(std::move(facts).value());
    for (const std::string& name : read.back().needed)
      pending.push_back({name, found->filename().string(), &read.back(), found->parent_path()});
    libraries.push_back(std::move(library));
  }

  for (const Dependency& library : libraries) {
    if (library.state == Dependency::State::kResident)
      BACKPLANE_RETURN_IF_ERROR(MakeResident(library, deployed_file.string()));
  }
  return libraries;
}

std::string DescribeDependencies(const std::vector<Dependency>& dependencies) {
  if (dependencies.empty())
    return "none";
  std::string text;
  for (const Dependency& library : dependencies) {
    text += (text.empty() ? "" : "; ") + library.name;
    if (!library.path.empty())
      text += " -> " + library.path.string();
    text += " (" + std::string(ToString(library.state));
    if (library.state == Dependency::State::kResident)
      text += ": " + library.why_resident;
    text += ")";
  }
  return text;
}

std::string DescribeSharedRegistries(const ElfFacts& backend,
                                     const std::vector<Dependency>& dependencies) {
  std::string text;
  for (const Dependency& library : dependencies) {
    // A copy that comes and goes with the backend's generations is not shared with the host.
    if (library.state != Dependency::State::kAlreadyLoaded &&
        library.state != Dependency::State::kResident)
      continue;
    const HostRegistry* registry = RegistryKeptBy(fs::path(library.name).filename().string());
    if (registry == nullptr)
      continue;
    std::string writes;
    for (const std::string& symbol : backend.registry_writes) {
      if (RegistryWrittenBy(symbol) == registry)
        writes += (writes.empty() ? "" : ", ") + FunctionName(symbol);
    }
    if (writes.empty())
      continue;  // linked, e.g. to log through the host's loggers, but never written
    text += (text.empty() ? "" : "; ") + std::string("writes into ") +
            std::string(registry->registry) + " (imports " + writes + ") of " + library.name +
            ", the copy the whole process shares (" + library.path.string() +
            "): " + std::string(registry->consequence);
  }
  return text;
}

}  // namespace backplane::loader
