#include "rollback_store.hpp"

#include <unistd.h>

#include "registry_log.hpp"

namespace backplane::registry_detail {
namespace fs = std::filesystem;

RollbackStore::RollbackStore(fs::path directory) : directory_(std::move(directory)) {}

RollbackStore::~RollbackStore() {
  std::error_code ignored;
  fs::remove_all(directory_, ignored);
}

bool RollbackStore::Retain(const std::string& id, const loader::Generation& outgoing) {
  const loader::GenerationInfo& generation = outgoing.info();
  // Named like a backend file (the loader checks the scheme), one directory per id. The bytes are
  // the sealed copy that ran; loading them again digests and judges them again.
  const fs::path copy = directory_ / id / generation.real_path.filename();
  std::error_code error;
  fs::create_directories(copy.parent_path(), error);
  Status written = error ? Status{StatusCode::kInternal, error.message()} : Status::Ok();
  if (written.ok()) {
    unlink(copy.c_str());  // a new file: the kept one's inode may be open in a load
    written = outgoing.image().WriteTo(copy);
  }
  if (!written.ok()) {
    Log().warn("backend {}: cannot keep generation {} for rollback ({}): {}", id, generation.number,
               copy.string(), written.message());
    return false;
  }
  Retained retained{copy, generation.real_path, generation.sha256};
  auto [it, inserted] = kept_.try_emplace(id, retained);
  if (!inserted) {
    if (it->second.copy != copy)
      unlink(it->second.copy.c_str());
    it->second = std::move(retained);
  }
  return true;
}

std::optional<RollbackStore::Retained> RollbackStore::Find(const std::string& id) const {
  auto it = kept_.find(id);
  if (it == kept_.end())
    return std::nullopt;
  return it->second;
}

}  // namespace backplane::registry_detail
