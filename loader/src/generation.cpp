#include "backplane/loader/generation.hpp"

#include <dlfcn.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unistd.h>

#include <chrono>
#include <thread>

#include "backplane/loader/loader.hpp"
#include "loader_log.hpp"

namespace backplane::loader {

namespace {
constexpr std::chrono::milliseconds kReturnGrace{5};
}  // namespace

LibraryHandle& LibraryHandle::operator=(LibraryHandle&& other) noexcept {
  if (this != &other) {
    Close();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void LibraryHandle::Close() {
  if (handle_ != nullptr)
    dlclose(std::exchange(handle_, nullptr));
}

Generation::Generation(GenerationInfo info, LibraryHandle library, EntryPoints entry_points,
                       std::shared_ptr<LoaderStats> stats)
    : info_(std::move(info)),
      library_(std::move(library)),
      entry_points_(entry_points),
      stats_(std::move(stats)) {
  stats_->loaded.fetch_add(1, std::memory_order_relaxed);
  stats_->live.fetch_add(1, std::memory_order_relaxed);
}

Generation::~Generation() {
  // Trap: a thread-pool worker that ran the backend's last task (TBB's templates are compiled
  // into the backend) is released by the task's own code and may still be returning through a
  // few instructions of it after every wait in Shutdown() has returned; unmapping then crashes
  // it (seen under ThreadSanitizer). This is the reaper thread, off every request path: give
  // such returns a moment before the code goes.
  std::this_thread::sleep_for(kReturnGrace);
  library_.Close();
  // dlclose does not say whether the library left the process. Asking for the shadow path with
  // RTLD_NOLOAD does: glibc only answers with a handle while the library is still mapped.
  const bool leaked = [&] {
    void* still_mapped = dlopen(info_.shadow_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (still_mapped != nullptr)
      dlclose(still_mapped);
    return still_mapped != nullptr;
  }();
  if (leaked) {
    stats_->leaked.fetch_add(1, std::memory_order_relaxed);
    Log().warn(
        "backend {} generation {} leaked: glibc kept it mapped after dlclose ({}), e.g. for a "
        "thread_local destructor still registered or a unique symbol another library bound to",
        info_.backend_id, info_.number, info_.file.string());
  } else {
    stats_->unloaded.fetch_add(1, std::memory_order_relaxed);
    Log().debug("backend {} generation {} unloaded ({})", info_.backend_id, info_.number,
                info_.file.string());
  }
  unlink(info_.shadow_path.c_str());  // a leaked mapping stays valid without its file
#ifdef __GLIBC__
  // What the generation's instances and workloads allocated was freed above, but glibc keeps
  // freed memory in the arena of the thread that allocated it (a backend compiles on the watcher
  // thread, runs on TBB workers, dies here), so resident memory would creep up swap after swap
  // (measured: +54 MB over 1000 CpuAcc swaps). Returning it costs ~1 ms here, off every request.
  malloc_trim(0);
#endif
  stats_->live.fetch_sub(1, std::memory_order_relaxed);
  stats_->unload_listeners.Notify(info_, leaked);
}

}  // namespace backplane::loader
