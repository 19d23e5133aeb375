// Content digests of backend files: what the records, logs and metrics name so that two builds
// behind one file name can be told apart.
#pragma once

#include <filesystem>
#include <string>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// The SHA-256 of the file's content as 64 lowercase hex digits (the format of sha256sum), or
// kIoError naming the file. Reads the whole file; call it on a private copy (the shadow) so that
// what is named is what runs.
Result<std::string> Sha256OfFile(const std::filesystem::path& file);

}  // namespace backplane::loader
