// `backplane check [--json] FILE...`: would these backend files load, and if not, exactly why.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace backplane::server {

struct CheckOptions {
  std::vector<std::string> files;  // files or directories; empty: the default backend paths
  bool json = false;
  bool allow_unsafe_permissions = false;
};

// Runs every loading stage on each file, each file in a child process so that a backend that
// crashes in its constructors is reported instead of taking `check` down. Prints one line per
// stage and a verdict per file (or a JSON array). Returns 0 when every file would load, else 1.
int RunCheck(const CheckOptions& options);

}  // namespace backplane::server
