// The version each backend id ran before its active one, kept as a private copy so that a
// rollback can load it again as a new generation while the drained generation itself leaves the
// process. Private to the registry.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "backplane/loader/generation.hpp"

namespace backplane::registry_detail {

// Thread-compatible: used in the registry's change sequence only.
class RollbackStore {
 public:
  // Keeps its copies in `directory` (created on first use). Not durable: the directory lies
  // inside the loader's shadow directory, so that a dead process's copies are cleaned up with it.
  // Durable (a state_dir): the copies and their index survive the process, so that the next
  // start can serve the previous build even after the operator copied over its file; what the
  // index names is read back now (a damaged index is logged and read as empty).
  RollbackStore(std::filesystem::path directory, bool durable);
  ~RollbackStore();  // not durable: removes every copy and the directory
  RollbackStore(const RollbackStore&) = delete;
  RollbackStore& operator=(const RollbackStore&) = delete;

  // Writes `outgoing`'s code (its sealed copy: the bytes that ran) as the version to roll `id`
  // back to, replacing the one kept before. False (and logged) when it fails. `id` is a key: the
  // registry also keeps other versions of an id under keys of their own ("<purpose>/<id>").
  bool Retain(const std::string& id, const loader::Generation& outgoing);
  // A version kept for rollback: the copy, where its code came from, and its digest (checked
  // against the generation loaded from the copy, so a rollback runs exactly what ran before).
  struct Retained {
    std::filesystem::path copy;
    std::filesystem::path resolved_file;
    std::string sha256;
  };
  // The version to roll `id` back to, if one is kept.
  std::optional<Retained> Find(const std::string& id) const;

 private:
  void WriteIndex() const;

  const std::filesystem::path directory_;
  const bool durable_;
  std::map<std::string, Retained> kept_;  // by backend id
};

}  // namespace backplane::registry_detail
