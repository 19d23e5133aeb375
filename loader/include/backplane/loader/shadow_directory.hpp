// The process's private directory, <root>/backplane-<uid>/<pid>/: where a registry keeps the
// copies of earlier versions that a rollback loads again. Backend code is never mapped from here
// (the loader maps sealed memory copies, sealed_image.hpp); a copy kept here is read, digested
// and judged like any published file when it is loaded, so a file changed in it since is
// refused by the trust policy, never believed.
#pragma once

#include <filesystem>
#include <memory>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// Thread-safe. One per process: <root>/backplane-<uid>/<pid>/.
class ShadowDirectory {
 public:
  // `root` defaults to $BACKPLANE_SHADOW_DIR, else $TMPDIR, else /tmp. Removes what an earlier
  // process with this pid left, and the directories of processes that no longer exist.
  static Result<std::shared_ptr<ShadowDirectory>> Create(std::filesystem::path root = {});
  ~ShadowDirectory();  // removes the directory when it is empty

  const std::filesystem::path& path() const { return path_; }

 private:
  explicit ShadowDirectory(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

}  // namespace backplane::loader
