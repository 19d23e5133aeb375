// Files that must survive the process dying at any instant: the state directory's journal and
// rollback index, and the copies a restart rolls back to. Private to the registry.
#pragma once

#include <filesystem>
#include <string_view>

#include "backplane/core/status.hpp"

namespace backplane::registry_detail {

// Replaces `file` with `text` so that a reader (this process after a crash, or the next one) sees
// the old content or the new, never a mix or a truncated file: write a temporary file beside it,
// fsync it, rename it over `file`, fsync the directory (a rename is durable only once its
// directory is). kIoError naming the file and the step that failed.
Status WriteFileDurably(const std::filesystem::path& file, std::string_view text);

// fsyncs `file` and its directory: for a file written by other means (a rollback copy).
Status SyncFileAndDirectory(const std::filesystem::path& file);

}  // namespace backplane::registry_detail
