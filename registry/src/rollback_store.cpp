#include "rollback_store.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "durable_file.hpp"
#include "registry_log.hpp"

namespace backplane::registry_detail {
namespace fs = std::filesystem;

namespace {

// One line per id: "<id>\t<sha256>\t<copy>\t<resolved file>". Ids and the copies' names (a backend
// file name under the id's directory) hold no tab or newline; a resolved file that does is not
// kept (it only says where the code came from).
constexpr char kIndexName[] = "index";

}  // namespace

RollbackStore::RollbackStore(fs::path directory, bool durable)
    : directory_(std::move(directory)), durable_(durable) {
  if (!durable_)
    return;
  std::ifstream in(directory_ / kIndexName);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::vector<std::string> fields;
    std::istringstream split(line);
    for (std::string field; std::getline(split, field, '\t');)
      fields.push_back(field);
    std::error_code error;
    if (fields.size() != 4 || fields[0].empty() || fields[1].size() != 64 ||
        !fs::is_regular_file(fields[2], error)) {
      Log().warn(
          "rollback index {} line {} ignored: not '<id> <sha256> <copy> <file>' naming a "
          "kept copy",
          (directory_ / kIndexName).string(), number);
      continue;
    }
    kept_.insert_or_assign(fields[0], Retained{fields[2], fields[3], fields[1]});
  }
}

RollbackStore::~RollbackStore() {
  if (durable_)
    return;
  std::error_code ignored;
  fs::remove_all(directory_, ignored);
}

void RollbackStore::WriteIndex() const {
  std::string text;
  for (const auto& [id, retained] : kept_) {
    const std::string resolved = retained.resolved_file.string();
    text += id + "\t" + retained.sha256 + "\t" + retained.copy.string() + "\t" +
            (resolved.find_first_of("\t\n") == std::string::npos ? resolved : "?") + "\n";
  }
  if (Status written = WriteFileDurably(directory_ / kIndexName, text); !written.ok())
    Log().warn("rollback index not updated: {}", written.message());
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
    // The next start may need it after any crash, so it is on disk before the index names it.
    if (written.ok() && durable_)
      written = SyncFileAndDirectory(copy);
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
  if (durable_)
    WriteIndex();
  return true;
}

std::optional<RollbackStore::Retained> RollbackStore::Find(const std::string& id) const {
  auto it = kept_.find(id);
  if (it == kept_.end())
    return std::nullopt;
  return it->second;
}

}  // namespace backplane::registry_detail
