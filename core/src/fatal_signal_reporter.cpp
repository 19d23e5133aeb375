#include "backplane/core/fatal_signal_reporter.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "backplane/core/backend_call_record.hpp"

// Traps kept in mind here:
// - The handler runs on a thread that may hold any lock (malloc's, stdio's, spdlog's): it calls
//   only async-signal-safe functions (write, sigaction, raise, prctl, getpid, gettid), builds its
//   line in a fixed buffer with its own number formatting, and reads only what was written before
//   it was installed (the descriptors, the previous dispositions) and the crashing thread's own
//   thread-locals.
// - A stack overflow leaves no stack to run a handler on: SA_ONSTACK, and an alternate stack per
//   thread (sigaltstack is per thread), set up on the first backend call of each thread and for
//   the installing thread. A thread that already has one (a sanitizer's) keeps it.
// - The process must die as it would have: the previous disposition is restored and the signal
//   delivered again. A fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE raised by the CPU) recurs by itself
//   when the handler returns, so the default action or the previous handler sees the true fault
//   (its address, its registers: what a core dump and a sanitizer report show); a signal that
//   does not recur (sent by kill, raise or abort; SIGSYS; SIGTRAP) is raised again.
// - The strings a backend call record points to belong to the generation and the network the
//   call holds (backend_call_record.hpp), so they are alive while the call runs; each is still
//   read with a bound, and bytes that would break the line are replaced.

namespace backplane {
namespace internal {

constinit thread_local const BackendCallSite* current_backend_call = nullptr;
constinit thread_local const char* current_model = nullptr;
constinit thread_local bool thread_ready_for_crash_reports = false;

}  // namespace internal

namespace {

constexpr int kReportedSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP};
constexpr int kMaxLogFiles = 4;
// Enough for the handler and a sanitizer's handler it hands the fault to.
constexpr std::size_t kAltStackBytes = std::size_t{64} << 10;

// Written by InstallFatalSignalReporter before the handler is installed (or, for a log file
// added later, before log_file_count is raised), read by the handler.
struct ReporterState {
  std::atomic<bool> installed{false};
  std::atomic<int> log_file_count{0};
  int log_files[kMaxLogFiles] = {};
  struct sigaction previous[NSIG] = {};
};
constinit ReporterState state;

constinit thread_local bool reporting = false;

// One line, no allocation: what does not fit is cut, and a newline always ends it.
class LineBuffer {
 public:
  void Append(const char* text, std::size_t max_length = 512) {
    if (text == nullptr)
      text = "?";
    for (std::size_t i = 0; i < max_length && text[i] != '\0' && size_ < kCapacity; ++i) {
      const char c = text[i];
      buffer_[size_++] = (c < ' ' || c == 0x7f) ? '?' : c;  // one line, whatever the string holds
    }
  }
  void AppendDecimal(uint64_t value) {
    char digits[20];
    int count = 0;
    do {
      digits[count++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (count > 0 && size_ < kCapacity)
      buffer_[size_++] = digits[--count];
  }
  void AppendHex(uintptr_t value) {
    Append("0x");
    char digits[2 * sizeof(uintptr_t)];
    int count = 0;
    do {
      digits[count++] = "0123456789abcdef"[value & 0xf];
      value >>= 4;
    } while (value != 0);
    while (count > 0 && size_ < kCapacity)
      buffer_[size_++] = digits[--count];
  }
  // The line with its newline.
  const char* Finish(std::size_t* size) {
    buffer_[size_] = '\n';
    *size = size_ + 1;
    return buffer_;
  }

 private:
  static constexpr std::size_t kCapacity = 1535;  // and one byte for the newline
  char buffer_[kCapacity + 1];
  std::size_t size_ = 0;
};

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    case SIGSYS:
      return "SIGSYS";
    case SIGTRAP:
      return "SIGTRAP";
    default:
      return "signal";
  }
}

// Raised by the CPU on an instruction that faults again when the handler returns.
bool IsRecurringFault(int signal_number, const siginfo_t* info) {
  return info != nullptr && info->si_code > 0 &&
         (signal_number == SIGSEGV || signal_number == SIGBUS || signal_number == SIGILL ||
          signal_number == SIGFPE);
}

void WriteAll(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t written = write(fd, data, size);
    if (written < 0 && errno == EINTR)
      continue;
    if (written <= 0)
      return;
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

void AppendCall(LineBuffer& line, const BackendCallSite& call, const char* model) {
  line.Append(" while ");
  if (call.backend_id != nullptr) {
    line.Append("backend ");
    line.Append(call.backend_id, 64);
  } else {
    line.Append("a backend being loaded");
  }
  if (call.generation != 0) {
    line.Append(" generation ");
    line.AppendDecimal(call.generation);
    line.Append(" (sha256 ");
    line.Append(call.sha256, 64);
    line.Append(", file ");
    line.Append(call.file, 512);
    line.Append(")");
  } else {
    line.Append(" (linked in)");
  }
  line.Append(" ran ");
  line.Append(call.call != nullptr ? call.call : "backend code", 64);
  if (model != nullptr) {
    line.Append(" for model ");
    line.Append(model, 512);
  }
}

void WriteReport(int signal_number, const siginfo_t* info) {
  LineBuffer line;
  line.Append("backplane: fatal signal ");
  line.Append(SignalName(signal_number));
  line.Append(" (");
  line.AppendDecimal(static_cast<uint64_t>(signal_number));
  if (IsRecurringFault(signal_number, info)) {
    line.Append(", address ");
    line.AppendHex(reinterpret_cast<uintptr_t>(info->si_addr));
  } else if (info != nullptr && info->si_code <= 0 && info->si_pid != getpid()) {
    line.Append(", sent by pid ");  // not a fault of this process: kill(1), a supervisor
    line.AppendDecimal(static_cast<uint64_t>(info->si_pid));
  }
  line.Append(") on thread ");
  char thread_name[17] = {};
  if (prctl(PR_GET_NAME, thread_name) != 0)
    thread_name[0] = '\0';
  line.Append(thread_name[0] != '\0' ? thread_name : "?", 16);
  line.Append(" (tid ");
  line.AppendDecimal(static_cast<uint64_t>(gettid()));
  line.Append(")");
  std::atomic_signal_fence(std::memory_order_acquire);
  const BackendCallSite* call = internal::current_backend_call;
  const char* model = internal::current_model;
  if (call != nullptr) {
    AppendCall(line, *call, model);
  } else {
    line.Append(" outside backend code");
    if (model != nullptr) {
      line.Append(" while running model ");
      line.Append(model, 512);
    }
  }
  line.Append("; the process ends");
  std::size_t size = 0;
  const char* text = line.Finish(&size);
  WriteAll(STDERR_FILENO, text, size);
  const int files = state.log_file_count.load(std::memory_order_acquire);
  for (int i = 0; i < files; ++i)
    WriteAll(state.log_files[i], text, size);
}

// The signal again, with the disposition it had before the reporter.
void Redeliver(int signal_number, siginfo_t* info, void* context) {
  const struct sigaction& previous = state.previous[signal_number];
  sigaction(signal_number, &previous, nullptr);
  if (IsRecurringFault(signal_number, info))
    return;
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    if ((previous.sa_flags & SA_SIGINFO) != 0)
      previous.sa_sigaction(signal_number, info, context);
    else
      previous.sa_handler(signal_number);
    // It returned: the signal is fatal all the same.
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(signal_number, &default_action, nullptr);
  }
  // Blocked while this handler runs: delivered as it returns.
  raise(signal_number);
}

void ReportFatalSignal(int signal_number, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (!reporting) {  // a second fatal signal on this thread, say in a handler handed the first
    reporting = true;
    WriteReport(signal_number, info);
  }
  Redeliver(signal_number, info, context);
  errno = saved_errno;
}

// One thread's alternate signal stack, with a guard page below it; released when the thread
// exits, after it is switched off (the kernel must never run a handler on unmapped memory).
class AltSignalStack {
 public:
  AltSignalStack() = default;
  AltSignalStack(const AltSignalStack&) = delete;
  AltSignalStack& operator=(const AltSignalStack&) = delete;
  ~AltSignalStack() {
    if (mapping_ == nullptr)
      return;
    stack_t current = {};
    if (sigaltstack(nullptr, &current) == 0 && current.ss_sp == Usable()) {
      stack_t off = {};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
    }
    munmap(mapping_, Size());
  }

  // Maps the stack and makes it the calling thread's; false when either fails (a crash is then
  // still reported on the thread's own stack, a stack overflow is not).
  bool Install() {
    void* mapping =
        mmap(nullptr, Size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED)
      return false;
    mapping_ = mapping;
    mprotect(mapping_, Page(), PROT_NONE);
    stack_t stack = {};
    stack.ss_sp = Usable();
    stack.ss_size = kAltStackBytes;
    return sigaltstack(&stack, nullptr) == 0;
  }

 private:
  static std::size_t Page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  static std::size_t Size() { return Page() + kAltStackBytes; }
  void* Usable() const { return static_cast<char*>(mapping_) + Page(); }

  void* mapping_ = nullptr;
};

// Whether `fd` names the same file as one of `others` (or stderr).
bool SameFileAsAny(int fd, const int* others, int count) {
  struct stat own = {};
  if (fstat(fd, &own) != 0)
    return false;
  auto same = [&](int other) {
    struct stat theirs = {};
    return fstat(other, &theirs) == 0 && theirs.st_dev == own.st_dev && theirs.st_ino == own.st_ino;
  };
  if (same(STDERR_FILENO))
    return true;
  for (int i = 0; i < count; ++i) {
    if (same(others[i]))
      return true;
  }
  return false;
}

Status AddLogFile(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return InvalidArgument("fatal signal reporter: cannot open log file " + path.string() + ": " +
                           std::strerror(errno));
  }
  const int count = state.log_file_count.load(std::memory_order_relaxed);
  if (SameFileAsAny(fd, state.log_files, count)) {
    close(fd);
    return Status::Ok();
  }
  if (count == kMaxLogFiles) {
    close(fd);
    return InvalidArgument("fatal signal reporter: cannot add log file " + path.string() +
                           ": it writes to at most " + std::to_string(kMaxLogFiles));
  }
  state.log_files[count] = fd;
  state.log_file_count.store(count + 1, std::memory_order_release);
  return Status::Ok();
}

}  // namespace

namespace internal {

bool PrepareThreadForCrashReports() noexcept {
  if (!state.installed.load(std::memory_order_acquire))
    return false;  // asked again on the next call: a reporter may be installed later
  stack_t current = {};
  if (sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) == 0)
    return true;  // the thread has one already (a sanitizer's, an embedder's)
  thread_local AltSignalStack own;
  own.Install();
  return true;
}

}  // namespace internal

Status InstallFatalSignalReporter(const FatalSignalReporterOptions& options) {
  std::vector<std::filesystem::path> files = options.log_files;
  for (const auto& sink : spdlog::default_logger()->sinks()) {
    if (auto* file = dynamic_cast<spdlog::sinks::basic_file_sink_mt*>(sink.get()))
      files.emplace_back(file->filename());
    else if (auto* single = dynamic_cast<spdlog::sinks::basic_file_sink_st*>(sink.get()))
      files.emplace_back(single->filename());
  }
  for (const auto& file : files)
    BACKPLANE_RETURN_IF_ERROR(AddLogFile(file));
  if (state.installed.load(std::memory_order_acquire))
    return Status::Ok();

  for (int signal_number : kReportedSignals) {
    struct sigaction previous = {};
    if (sigaction(signal_number, nullptr, &previous) != 0)
      return Internal(std::string("fatal signal reporter: sigaction: ") + std::strerror(errno));
    if (previous.sa_handler == SIG_IGN)
      continue;  // whoever ignores it meant to
    state.previous[signal_number] = previous;
    struct sigaction action = {};
    action.sa_sigaction = ReportFatalSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    if (sigaction(signal_number, &action, nullptr) != 0)
      return Internal(std::string("fatal signal reporter: sigaction: ") + std::strerror(errno));
  }
  state.installed.store(true, std::memory_order_release);
  internal::thread_ready_for_crash_reports = internal::PrepareThreadForCrashReports();
  return Status::Ok();
}

bool FatalSignalReporterInstalled() {
  return state.installed.load(std::memory_order_acquire);
}

}  // namespace backplane
