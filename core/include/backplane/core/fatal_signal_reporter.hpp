// The last line of a process that dies of a fatal signal: which signal, on which thread, and
// which backend call was running there (backend id, generation, sha256, file, the call, the
// model), read from the thread's record (backend_call_record.hpp). Then the process dies as it
// would have without the reporter: same signal, same exit status, same core dump.
#pragma once

#include <filesystem>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane {

struct FatalSignalReporterOptions {
  // Files the line is appended to besides stderr, opened now (O_APPEND) and kept open: a signal
  // handler may not open files. The default logger's spdlog basic_file_sink files are added
  // without being named here. A file that is stderr itself is written once.
  std::vector<std::filesystem::path> log_files;
};

// Installs the reporter for SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS and SIGTRAP (a
// signal whose disposition is SIG_IGN is left alone), with an alternate signal stack for the
// calling thread; threads get one lazily when they first call into backend code. The handler is
// async-signal-safe: one line built in a fixed buffer, written with write(2). Then the signal's
// previous disposition is restored and the signal delivered again: the default (the process
// ends with that signal and dumps core as the system says), or the handler that was there
// before (a sanitizer's, an embedder's), which then sees the original fault.
//
// Call it early, from the main thread, before threads that call backend code start; calling
// it again adds log files (at most 4 in all) and changes nothing else. kInvalidArgument naming
// a log file that cannot be opened; kInternal when sigaction fails.
//
// Thread-compatible: installing races nothing but another install.
[[nodiscard]] Status InstallFatalSignalReporter(const FatalSignalReporterOptions& options = {});

// Whether the reporter is installed, for tests.
bool FatalSignalReporterInstalled();

}  // namespace backplane
