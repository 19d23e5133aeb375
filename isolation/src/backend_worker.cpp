#include "backplane/isolation/backend_worker.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "backplane/core/logging.hpp"
#include "backplane/core/thread_name.hpp"
#include "isolation_log.hpp"
#include "protocol.hpp"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace backplane::isolation {
namespace {

std::string SignalName(int signal) {
  const char* abbreviation = ::sigabbrev_np(signal);
  return "signal " + std::to_string(signal) +
         (abbreviation != nullptr ? " (SIG" + std::string(abbreviation) + ")" : std::string());
}

WorkerDeath Describe(const siginfo_t& info) {
  WorkerDeath death;
  if (info.si_code == CLD_EXITED) {
    death.exit_status = info.si_status;
    death.how = "exited with status " + std::to_string(info.si_status);
  } else {
    death.signal = info.si_status;
    death.how = "was killed by " + SignalName(info.si_status) +
                (info.si_code == CLD_DUMPED ? ", core dumped" : "");
  }
  return death;
}

// The worker's resident set, from /proc (0 when it cannot be read: it is gone).
std::size_t ResidentBytes(pid_t pid) {
  std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::filesystem::path DefaultWorkerExecutable() {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return (error ? std::filesystem::path() : self.parent_path()) / "backplane-backend-worker";
}

Result<std::unique_ptr<BackendWorker>> BackendWorker::Start(const WorkerOptions& given,
                                                            int image_fd, DeathListener on_death) {
  WorkerOptions options = given;
  if (options.executable.empty())
    options.executable = DefaultWorkerExecutable();
  if (::access(options.executable.c_str(), X_OK) != 0) {
    return FailedPrecondition("the backend worker executable " + options.executable.string() +
                              " cannot be run: " + std::strerror(errno));
  }
  auto region = SharedRegion::Create(options.slots, options.slot_bytes);
  if (!region.ok())
    return std::move(region).error();

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  const std::string executable = options.executable.string();
  const std::string host_pid = std::to_string(::getpid());
  std::vector<const char*> argv = {executable.c_str(), "--host-pid",          host_pid.c_str(),
                                   "--label",          options.label.c_str(), nullptr};
  const int channel_fd = region->fd();
  const pid_t pid = ::fork();
  if (pid < 0)
    return SystemError("starting a backend worker (fork)");
  if (pid == 0) {
    // Above 4 first, so that dup2 onto 3 and 4 never closes the other source.
    const int channel = ::fcntl(channel_fd, F_DUPFD, 10);
    const int image = ::fcntl(image_fd, F_DUPFD, 10);
    if (channel < 0 || image < 0 || ::dup2(channel, kChannelFd) < 0 ||
        ::dup2(image, kImageFd) < 0 || ::close_range(kImageFd + 1, ~0U, 0) != 0 ||
        ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      ::_exit(126);
    }
    ::execv(argv[0], const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  OwnedFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    const Status error = SystemError("watching a backend worker (pidfd_open)");
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return error;
  }
  return std::unique_ptr<BackendWorker>(new BackendWorker(
      std::move(options), std::move(region).value(), pid, std::move(pidfd), std::move(on_death)));
}

BackendWorker::BackendWorker(WorkerOptions options, SharedRegion region, pid_t pid, OwnedFd pidfd,
                             DeathListener on_death)
    : options_(std::move(options)),
      region_(std::move(region)),
      slots_(region_.slot_count()),
      pid_(pid),
      pidfd_(std::move(pidfd)),
      stop_(::eventfd(0, EFD_CLOEXEC)),
      on_death_(std::move(on_death)),
      label_(options_.label),
      monitor_([this] { Monitor(); }) {}

std::string BackendWorker::label() const {
  MutexLock lock(mutex_);
  return label_;
}

void BackendWorker::Relabel(std::string label) {
  MutexLock lock(mutex_);
  label_ = std::move(label);
}

BackendWorker::~BackendWorker() {
  stopping_.store(true);
  ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
  const uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(stop_.get(), &one, sizeof one);
  monitor_.join();
}

void BackendWorker::Kill(WorkerDeath::Killed why, std::string cause) {
  {
    MutexLock lock(mutex_);
    if (killed_ == WorkerDeath::Killed::kNo) {
      killed_ = why;
      kill_cause_ = std::move(cause);
    }
  }
  ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
}

std::optional<WorkerDeath> BackendWorker::death() const {
  MutexLock lock(mutex_);
  return death_;
}

// Blocks on the pidfd (readable when the worker ended); with a memory limit, wakes every 50 ms to
// look at the worker's resident set. Reaps the worker, so no zombie is left.
void BackendWorker::Monitor() {
  NameThisThread("bp-worker-mon");
  const int timeout_ms = options_.memory_limit_bytes > 0 ? 50 : -1;
  bool stop = false;
  while (!stop) {
    pollfd watched[] = {{pidfd_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    const int ready = ::poll(watched, 2, timeout_ms);
    if (ready < 0 && errno != EINTR)
      break;
    if (watched[0].revents != 0)
      break;
    stop = watched[1].revents != 0;
    if (options_.memory_limit_bytes > 0) {
      const std::size_t resident = ResidentBytes(pid_);
      if (resident > options_.memory_limit_bytes) {
        Kill(WorkerDeath::Killed::kMemoryLimit,
             "its resident memory of " + std::to_string(resident) +
                 " bytes passed memory_limit_bytes " + std::to_string(options_.memory_limit_bytes));
      }
    }
  }
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                  WEXITED) != 0 &&
         errno == EINTR) {
  }
  WorkerDeath death = Describe(info);
  {
    MutexLock lock(mutex_);
    death.cause = kill_cause_;
    death.killed = killed_;
    death_ = death;
  }
  dead_.store(true, std::memory_order_release);
  slots_.Close();
  WakeAll(region_);
  if (!stopping_.load()) {
    IsolationLog().error("{} ran in worker process {}, which {}", label(), pid_, death.ToString());
    if (on_death_)
      on_death_(death);
  }
}

Status BackendWorker::DeadError(std::string_view what) const {
  const auto ended = death();
  return Status(LoadReason::kCrashed, label() + " runs in worker process " + std::to_string(pid_) +
                                          ", which " +
                                          (ended ? ended->ToString() : std::string("is stopping")) +
                                          (what.empty() ? "" : " during " + std::string(what)));
}

Status BackendWorker::Invoke(uint32_t call, const std::function<void(WireWriter&)>& write,
                             const std::function<Status(WireReader&)>& read,
                             std::string_view what) {
  if (dead())
    return DeadError(what);
  const auto slot = slots_.Acquire();
  if (!slot)
    return DeadError(what);
  SlotHeader& header = region_.header(*slot);
  // The slot returns to the pool idle, whatever the reply said (the worker writes to a slot only
  // while it is in kRequest).
  struct Release {
    SlotPool& pool;
    SlotHeader& header;
    uint32_t slot;
    ~Release() {
      header.state.store(static_cast<uint32_t>(SlotState::kIdle), std::memory_order_release);
      pool.Release(slot);
    }
  } release{slots_, header, *slot};

  WireWriter writer(region_.payload(*slot));
  writer.Put(call);
  if (write)
    write(writer);
  if (!writer.ok()) {
    return Status(StatusCode::kResourceExhausted, std::string(what) + " needs more than the " +
                                                      std::to_string(writer.capacity()) +
                                                      " bytes of a worker call slot");
  }
  header.message_bytes = writer.size();
  SetState(header, SlotState::kRequest, header.worker_sleeping);

  const auto deadline = options_.call_timeout.count() > 0
                            ? std::chrono::steady_clock::now() + options_.call_timeout
                            : std::chrono::steady_clock::time_point::max();
  const bool replied = WaitForState(
      header, SlotState::kReply, header.host_sleeping,
      [&] {
        if (dead())
          return true;
        if (std::chrono::steady_clock::now() >= deadline) {
          Kill(WorkerDeath::Killed::kCallTimeout,
               std::string(what) + " ran past the worker's call timeout of " +
                   std::to_string(options_.call_timeout.count()) + " ms");
        }
        return false;
      },
      std::chrono::milliseconds(20));
  if (!replied) {
    // The worker is dead: wait for the monitor's account of how, so the error can say it.
    while (!death().has_value())
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    return DeadError(what);
  }
  const std::size_t reply_bytes = header.message_bytes;
  const auto payload = region_.payload(*slot);
  if (reply_bytes > payload.size()) {
    Kill(WorkerDeath::Killed::kBadReply, "it wrote a reply larger than its slot");
    return Internal(label() + ": the worker's reply to " + std::string(what) +
                    " claims more bytes than its slot holds");
  }
  WireReader reader(payload.first(reply_bytes));
  Status status = reader.GetStatus();
  if (!reader.ok())
    return reader.Error("the worker's reply to " + std::string(what));
  if (!status.ok())
    return status;
  Status result = read ? read(reader) : Status::Ok();
  if (result.ok() && !reader.ok())
    return reader.Error("the worker's reply to " + std::string(what));
  return result;
}

}  // namespace backplane::isolation
