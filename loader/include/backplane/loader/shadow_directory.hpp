// Private shadow copies of backend files (docs/loading-rules.md rule 1).
//
// glibc returns the already-loaded handle for a path it has seen, even after the file changed, and
// a file overwritten in place under a mapped library kills the process. So the loader never
// dlopens a watched path: it copies the file, through one fd of its real path, to a private file
// named by a never-reused generation number, and dlopens that.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

#include "backplane/core/status.hpp"
#include "backplane/loader/backend_file.hpp"

namespace backplane::loader {

// Whether any process holds a file open for writing (docs/loading-rules.md rule 7: the lease
// probe), asked of an open fd of it. kUnknown where leases are not available (another owner without
// CAP_LEASE, file systems without lease support).
enum class WriterProbe { kNoWriter, kWriting, kUnknown };
WriterProbe HasWriters(int fd);

struct ShadowCopy {
  std::filesystem::path path;
  FileIdentity source_identity;  // of the source, identical before and after the copy
};

// Thread-safe. One per process: <root>/backplane-<uid>/<pid>/.
class ShadowDirectory {
 public:
  // `root` defaults to $BACKPLANE_SHADOW_DIR, else $TMPDIR, else /tmp. Removes what an earlier
  // process with this pid left, and the directories of processes that no longer exist.
  static Result<std::shared_ptr<ShadowDirectory>> Create(std::filesystem::path root = {});
  ~ShadowDirectory();  // removes the directory when it is empty

  const std::filesystem::path& path() const { return path_; }

  // Copies `source` (already resolved) to "<generation>-<file name>". Fails with kFileBusy when
  // a process holds the source open for writing, kFileChanged
  // when the source's identity differs before and after the copy, kIoError on I/O failure.
  Result<ShadowCopy> Copy(const std::filesystem::path& source, uint64_t generation) const;

 private:
  explicit ShadowDirectory(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

}  // namespace backplane::loader
