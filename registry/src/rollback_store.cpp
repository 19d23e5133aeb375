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

bool RollbackStore::Retain(const std::string& id, const loader::GenerationInfo& generation) {
  // Named like a backend file (the loader checks the scheme), one directory per id.
  const fs::path copy = directory_ / id / generation.real_path.filename();
  std::error_code error;
  fs::create_directories(copy.parent_path(), error);
  if (!error)
    fs::copy_file(generation.shadow_path, copy, fs::copy_options::overwrite_existing, error);
  if (error) {
    Log().warn("backend {}: cannot keep generation {} for rollback ({}): {}", id, generation.number,
               copy.string(), error.message());
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
