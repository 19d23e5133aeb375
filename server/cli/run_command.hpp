// `backplane run MODEL.onnx`: load a model on the backends, run it, say where each layer ran.
#pragma once

#include <string>
#include <vector>

namespace backplane::server {

struct RunOptions {
  std::string model;
  std::vector<std::string> backend_dirs;  // empty: the default backend paths
  std::vector<std::string> preferences;   // backend ids, most preferred first
  std::vector<std::string> inputs;        // TensorProto files, in graph input order
  std::string output_dir;                 // where output_N.pb go; empty: not written
  std::string test_data;                  // an ONNX test-data folder (test_data_set_*)
  int repeat = 1;
};

// 0 on success (with test data: every output within tolerance), 1 when the model, an input or a
// comparison fails (the error on stderr names what and why).
int RunModel(const RunOptions& options);

}  // namespace backplane::server
