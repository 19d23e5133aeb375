// A model's batching configuration in Triton's vocabulary (config.json: "max_batch_size" and
// "dynamic_batching"), its validation, and the load-time check that a network can be batched at
// all. Pure functions, value types.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <vector>

#include "backplane/core/status.hpp"
#include "backplane/core/tensor.hpp"
#include "backplane/onnx/network.hpp"

namespace backplane::server {

// Upper bounds of the batching keys: a config beyond them is a typo, not a plan.
inline constexpr int64_t kMaxBatchSizeLimit = 65536;
inline constexpr int64_t kMaxQueueDelayUsLimit = 1'000'000;  // a second of waiting for company

// "dynamic_batching": {"max_queue_delay_us": 2000, "preferred_batch_sizes": [16, 64],
// "preserve_ordering": false}. Value type.
struct DynamicBatching {
  // How long a request may wait for company, from its arrival. 0 (Triton's default): a batch
  // takes what is waiting when an execution slot frees up, and never waits on purpose.
  int64_t max_queue_delay_us = 0;
  // Ascending, each in 1..max_batch_size: a batch of one of these sizes leaves at once.
  std::vector<int64_t> preferred_batch_sizes;
  // true: answers leave in the order the requests arrived (one batch executes at a time, and a
  // batch is an unbroken run of arrivals); failures of a request alone (parse, deadline) are
  // answered at once.
  bool preserve_ordering = false;
  friend bool operator==(const DynamicBatching&, const DynamicBatching&) = default;
};

// The batch sizes a batched model executes at: a batch of R rows runs at the smallest of these
// that is >= R, its other rows zeros (never returned). Powers of two below max_batch_size, the
// preferred sizes and max_batch_size, ascending. Why: a model with a symbolic batch compiles a
// program per input shape and keeps a few (NetworkOptions::shape_program_capacity); batches of
// every size from 1 to 64 evicted and recompiled them all the time (bench/batching_bench.sh: a
// third of a wide MLP's batches ran uncompiled). Padding costs under 2x the rows;
// TF Serving's allowed_batch_sizes pads the same way.
std::vector<int64_t> ExecutionBatchSizes(int64_t max_batch_size,
                                         std::span<const int64_t> preferred_batch_sizes);

// Parses the "dynamic_batching" value; `max_batch_size` (already parsed, >= 1) bounds the
// preferred sizes. kInvalidArgument naming `where`, the key and the reason.
Result<DynamicBatching> ParseDynamicBatching(const nlohmann::json& value, int64_t max_batch_size,
                                             std::string_view where);
// Parses the "max_batch_size" value: an integer from 1 to kMaxBatchSizeLimit, or 0 (Triton's "the
// model does not batch").
Result<int64_t> ParseMaxBatchSize(const nlohmann::json& value, std::string_view where);

// The rows (first dimension) of a request's inputs, in the network's order: kInvalidArgument
// naming `what` when there is no input, an input is a scalar, the inputs' first dimensions differ,
// or the rows exceed `max_batch_size` (naming both numbers).
Result<int64_t> BatchRows(std::span<const Tensor> inputs, const Network& network,
                          int64_t max_batch_size, std::string_view what);

// A network can be batched along dimension 0 when every input and every output has a symbolic
// (dynamic) first dimension, along which requests are joined and outputs split, and its rows stay
// apart through every node (CheckRowsIndependent): a row's answer then depends on nothing but
// that row, whatever shares its execution, so neither company nor zero rows of padding change
// it. kInvalidArgument (the config asks what the model cannot do) naming the model (`what`), the
// first tensor or node that is not, why, and the fix.
Status CheckBatchable(const Network& network, std::string_view what);

}  // namespace backplane::server
