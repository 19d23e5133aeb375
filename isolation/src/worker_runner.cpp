#include "backplane/isolation/worker_runner.hpp"

#include <memory>

#include "backplane/core/thread_annotations.hpp"
#include "backplane/isolation/isolated_backend.hpp"

namespace backplane::isolation {
namespace {

class WorkerLibrary final : public loader::OutOfProcessLibrary {
 public:
  WorkerLibrary(std::shared_ptr<BackendWorker> worker, WorkerHello hello)
      : worker_(std::move(worker)), hello_(std::move(hello)) {}

  const std::string& backend_id() const override { return hello_.backend_id; }
  BackendApiVersion api_version() const override { return hello_.api_version; }
  const std::string& release() const override { return hello_.release; }
  std::string Describe() const override {
    return "worker process " + std::to_string(worker_->pid());
  }
  Result<std::unique_ptr<IBackend>> CreateBackend() override {
    return CreateIsolatedBackend(worker_, hello_);
  }

 private:
  const std::shared_ptr<BackendWorker> worker_;
  const WorkerHello hello_;
};

// What the monitor reports of a worker: completed once the worker said which backend it runs,
// read by the monitor when it dies (maybe before that).
struct CrashRecord {
  Mutex mutex;
  WorkerCrash crash BACKPLANE_GUARDED_BY(mutex);
};

}  // namespace

bool IsolationPolicy::IsolatesAny() const {
  if (by_default)
    return true;
  for (const auto& [id, isolated] : by_id) {
    if (isolated)
      return true;
  }
  return false;
}

loader::OutOfProcessRunner MakeWorkerRunner(IsolationPolicy policy, CrashListener on_crash) {
  return [policy = std::move(policy),
          on_crash = std::move(on_crash)](const loader::OutOfProcessRequest& request)
             -> Result<std::unique_ptr<loader::OutOfProcessLibrary>> {
    if (!request.required && !policy.IsolatesAny())
      return std::unique_ptr<loader::OutOfProcessLibrary>();  // no worker to start
    WorkerOptions options = policy.worker;
    const std::string where = request.file.string() + ", sha256 " + request.sha256;
    options.label = "generation " + std::to_string(request.generation) + " (" + where + ")";
    auto record = std::make_shared<CrashRecord>();
    {
      MutexLock lock(record->mutex);
      record->crash.generation = request.generation;
      record->crash.file = request.file.string();
      record->crash.sha256 = request.sha256;
    }
    auto started = BackendWorker::Start(
        options, request.image.fd(), [record, on_crash](const WorkerDeath& death) {
          WorkerCrash told;
          {
            MutexLock lock(record->mutex);
            told = record->crash;
          }
          told.death = death;
          if (on_crash && !told.backend_id.empty())  // else it died loading: the load says so
            on_crash(told);
        });
    if (!started.ok())
      return std::move(started).error();
    std::shared_ptr<BackendWorker> worker = std::move(started).value();
    auto hello = Hello(*worker);
    if (!hello.ok())
      return std::move(hello).error();
    if (!request.required && !policy.Isolates(hello->backend_id))
      return std::unique_ptr<loader::OutOfProcessLibrary>();  // mapped here after all
    {
      MutexLock lock(record->mutex);
      record->crash.backend_id = hello->backend_id;
      record->crash.pid = worker->pid();
    }
    worker->Relabel("backend " + hello->backend_id + " " + options.label);
    return std::unique_ptr<loader::OutOfProcessLibrary>(
        std::make_unique<WorkerLibrary>(std::move(worker), std::move(hello).value()));
  };
}

}  // namespace backplane::isolation
