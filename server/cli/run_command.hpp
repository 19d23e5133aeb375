// `backplane run MODEL.onnx`: load a model on the backends, run it, say where each layer ran and
// why a layer is not on the backend preferred first.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"

namespace backplane::server {

struct RunOptions {
  std::string model;
  std::vector<std::string> backend_dirs;     // empty: the default backend paths
  std::vector<std::string> preferences;      // backend ids, most preferred first
  std::vector<std::string> backend_options;  // "ID.KEY=VALUE", applied in order before the load
  std::vector<std::string> inputs;           // TensorProto files, in graph input order
  std::string output_dir;                    // where output_N.pb go; empty: not written
  std::string test_data;                     // an ONNX test-data folder (test_data_set_*)
  int repeat = 1;
};

// One `--option ID.KEY=VALUE`, split at the first '.' and the first '=' after it. The value stays
// text: only the backend's description of the option says which type to read it as.
struct BackendOptionText {
  std::string backend_id;
  std::string key;
  std::string value;
};

// kInvalidArgument starting with `text` when it is not ID.KEY=VALUE with ID and KEY non-empty
// (VALUE may be empty: the empty string, for a string option). The command line checks --option
// with it (CLI11 puts "--option: " before the message).
Result<BackendOptionText> ParseBackendOptionText(std::string_view text);

// 0 on success (with test data: every output within tolerance), 1 when an option, the model, an
// input or a comparison fails (the error on stderr names what and why).
int RunModel(const RunOptions& options);

}  // namespace backplane::server
