// Content digests of backend files: what the records, logs and metrics name so that two builds
// behind one file name can be told apart.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

#include "backplane/core/status.hpp"

namespace backplane::loader {

// The SHA-256 of `bytes` as 64 lowercase hex digits (the format of sha256sum). The loader digests
// the sealed copy it maps, so that what is named is what runs.
std::string Sha256Of(std::span<const std::byte> bytes);

// Sha256Of a file's content, for `backplane check --digest`: opened without blocking and read
// only when it is a regular file (kNotRegular otherwise), kIoError naming the file.
Result<std::string> Sha256OfFile(const std::filesystem::path& file);

}  // namespace backplane::loader
