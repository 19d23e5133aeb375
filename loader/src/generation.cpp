#include "backplane/loader/generation.hpp"

#include <dlfcn.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unistd.h>

#include "backplane/loader/loader.hpp"
#include "loader_log.hpp"
#include "tbb_confinement.hpp"

namespace backplane::loader {

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

Generation::Generation(GenerationInfo info, SealedImage image, LibraryHandle library,
                       EntryPoints entry_points, std::shared_ptr<LoaderStats> stats)
    : info_(std::move(info)),
      image_(std::move(image)),
      library_(std::move(library)),
      entry_points_(entry_points),
      stats_(std::move(stats)) {
  if (info_.submits_tbb_tasks) {
    confinement_ = std::make_unique<TbbConfinement>();
    Log().info(
        "backend {} generation {} submits TBB tasks itself ({}): its calls run in an arena of "
        "its own, and it is unloaded once no thread is inside; the fix is SDK 1.2's IHost",
        info_.backend_id, info_.number, info_.file.string());
  }
  stats_->loaded.fetch_add(1, std::memory_order_relaxed);
  stats_->live.fetch_add(1, std::memory_order_relaxed);
}

Generation::Generation(GenerationInfo info, SealedImage image,
                       std::unique_ptr<OutOfProcessLibrary> remote,
                       std::shared_ptr<LoaderStats> stats)
    : info_(std::move(info)),
      image_(std::move(image)),
      remote_(std::move(remote)),
      stats_(std::move(stats)) {
  stats_->loaded.fetch_add(1, std::memory_order_relaxed);
  stats_->live.fetch_add(1, std::memory_order_relaxed);
}

Generation::~Generation() {
  if (remote_ != nullptr) {
    // Nothing of it is mapped here: ending its process is its unloading.
    const std::string runs_in = remote_->Describe();
    remote_.reset();
    stats_->unloaded.fetch_add(1, std::memory_order_relaxed);
    Log().debug("backend {} generation {} ended with its {} ({})", info_.backend_id, info_.number,
                runs_in, info_.file.string());
    stats_->live.fetch_sub(1, std::memory_order_relaxed);
    stats_->unload_listeners.Notify(info_, false);
    return;
  }
  // Trap (rule 5): a TBB worker that ran a task of the backend's own (TBB's templates compiled
  // into it) is released by the task's code and may still be returning through a few
  // instructions of it after every wait in Shutdown() has returned; unmapping then crashes it
  // (seen under ThreadSanitizer). No sleep can know how long that takes. A backend that uses the
  // host's IHost (SDK 1.2) has no such code: its functions return into the host's templates
  // before any wait is released. One that submits TBB tasks itself ran confined to an arena of
  // its own: wait until TBB reports that no thread is inside it any more.
  if (confinement_ != nullptr) {
    confinement_->WaitUntilEmpty();
    confinement_.reset();
  }
  {
    const ScopedBackendCall running(CallSite("dlclose (its static destructors)"));
    library_.Close();
  }
  // dlclose does not say whether the library left the process. Asking for the name it was mapped
  // by with RTLD_NOLOAD does: glibc only answers with a handle while the library is still mapped.
  // The sealed copy's descriptor is still open, so that name is still this library's alone.
  const bool leaked = [&] {
    void* still_mapped = dlopen(image_.ProcPath().c_str(), RTLD_NOW | RTLD_NOLOAD);
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
  if (leaked)
    image_.Abandon();  // its name must never be given to another library (SealedImage)
#ifdef __GLIBC__
  // What the generation's instances and workloads allocated was freed above, but glibc keeps
  // freed memory in the arena of the thread that allocated it (a backend compiles on the watcher
  // thread, runs on TBB workers, dies here), so resident memory would creep up swap after swap
  // (`backplane_bench_hot_reload --cpu-acc` shows it; the numbers are in docs/performance.md).
  // Returning it costs a trim on the unloading thread, which is off every request's path.
  malloc_trim(0);
#endif
  stats_->live.fetch_sub(1, std::memory_order_relaxed);
  stats_->unload_listeners.Notify(info_, leaked);
}

uint64_t Generation::confined_entries() const {
  return confinement_ != nullptr ? confinement_->entries() : 0;
}

void Generation::RunInArena(const std::function<void()>& call) const {
  confinement_->Execute(call);
}

}  // namespace backplane::loader
