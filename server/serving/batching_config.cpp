#include "serving/batching_config.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "backplane/onnx/row_independence.hpp"

namespace backplane::server {
using nlohmann::json;

namespace {

std::string Key(std::string_view where, std::string_view key) {
  return std::string(where) + ": '" + std::string(key) + "' ";
}

// The first tensor of `values` whose first dimension is not symbolic, described; "" when none.
std::string FirstFixedBatchDim(const std::vector<ValueInfo>& values, std::string_view kind) {
  for (const auto& value : values) {
    const Shape& shape = value.info.shape;
    if (shape.empty()) {
      return std::string(kind) + " '" + value.name + "' is a scalar (shape []), which has no " +
             "batch dimension";
    }
    if (shape[0] >= 0) {
      return std::string(kind) + " '" + value.name + "' has shape " + ToString(shape) +
             ", whose first dimension is fixed at " + std::to_string(shape[0]);
    }
  }
  return {};
}

}  // namespace

Result<int64_t> ParseMaxBatchSize(const json& value, std::string_view where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() > kMaxBatchSizeLimit) {
    return InvalidArgument(Key(where, "max_batch_size") + "must be an integer from 1 to " +
                           std::to_string(kMaxBatchSizeLimit) +
                           " (rows a batch may hold), or 0 for a model that does not batch; got " +
                           value.dump());
  }
  return value.get<int64_t>();
}

Result<DynamicBatching> ParseDynamicBatching(const json& value, int64_t max_batch_size,
                                             std::string_view where) {
  if (!value.is_object()) {
    return InvalidArgument(Key(where, "dynamic_batching") +
                           "must be an object (keys: max_queue_delay_us, preferred_batch_sizes, "
                           "preserve_ordering); got " +
                           value.dump());
  }
  if (max_batch_size < 1) {
    return InvalidArgument(Key(where, "dynamic_batching") + "needs 'max_batch_size' from 1 to " +
                           std::to_string(kMaxBatchSizeLimit) +
                           " beside it: the most rows one batched execution may hold");
  }
  DynamicBatching batching;
  for (const auto& [key, item] : value.items()) {
    const std::string prefix = Key(where, "dynamic_batching." + key);
    if (key == "max_queue_delay_us") {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
          item.get<int64_t>() > kMaxQueueDelayUsLimit) {
        return InvalidArgument(
            prefix + "must be an integer from 0 to " + std::to_string(kMaxQueueDelayUsLimit) +
            " (microseconds a request may wait for company); got " + item.dump());
      }
      batching.max_queue_delay_us = item.get<int64_t>();
    } else if (key == "preferred_batch_sizes") {
      if (!item.is_array())
        return InvalidArgument(prefix + "must be an array of batch sizes; got " + item.dump());
      for (const auto& size : item) {
        if (!size.is_number_integer() || size.get<int64_t>() < 1) {
          return InvalidArgument(prefix + "holds " + size.dump() +
                                 ", which is not a positive integer batch size");
        }
        if (size.get<int64_t>() > max_batch_size) {
          return InvalidArgument(prefix + "holds " + size.dump() + ", more than max_batch_size " +
                                 std::to_string(max_batch_size) + ": no batch can reach it");
        }
        if (std::find(batching.preferred_batch_sizes.begin(), batching.preferred_batch_sizes.end(),
                      size.get<int64_t>()) != batching.preferred_batch_sizes.end()) {
          return InvalidArgument(prefix + "holds " + size.dump() + " twice");
        }
        batching.preferred_batch_sizes.push_back(size.get<int64_t>());
      }
      std::sort(batching.preferred_batch_sizes.begin(), batching.preferred_batch_sizes.end());
    } else if (key == "preserve_ordering") {
      if (!item.is_boolean())
        return InvalidArgument(prefix + "must be true or false; got " + item.dump());
      batching.preserve_ordering = item.get<bool>();
    } else {
      return InvalidArgument(Key(where, "dynamic_batching") + "has unknown key '" + key +
                             "' (known: max_queue_delay_us, preferred_batch_sizes, "
                             "preserve_ordering)");
    }
  }
  return batching;
}

Result<int64_t> BatchRows(std::span<const Tensor> inputs, const Network& network,
                          int64_t max_batch_size, std::string_view what) {
  if (inputs.empty())
    return InvalidArgument(std::string(what) + ": a batched model needs inputs to join");
  std::optional<int64_t> rows;
  std::string first_name;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = i < network.inputs.size() ? network.inputs[i].name
                                                       : std::string("#").append(std::to_string(i));
    const Shape& shape = inputs[i].info().shape;
    if (shape.empty()) {
      return InvalidArgument(std::string(what) + ": input '" + name +
                             "' is a scalar, but the model batches along the first dimension");
    }
    if (!rows) {
      rows = shape[0];
      first_name = name;
    } else if (shape[0] != *rows) {
      return InvalidArgument(std::string(what) + ": input '" + name + "' has " +
                             std::to_string(shape[0]) + " rows (first dimension) but input '" +
                             first_name + "' has " + std::to_string(*rows) +
                             "; the model batches along the first dimension, so they must agree");
    }
  }
  if (*rows > max_batch_size) {
    return InvalidArgument(std::string(what) + ": the request has " + std::to_string(*rows) +
                           " rows (first dimension), more than the model's max_batch_size " +
                           std::to_string(max_batch_size) + "; split it into requests of at most " +
                           std::to_string(max_batch_size) + " rows");
  }
  return *rows;
}

Status CheckBatchable(const Network& network, std::string_view what) {
  std::string fixed = FirstFixedBatchDim(network.inputs, "input");
  if (fixed.empty())
    fixed = FirstFixedBatchDim(network.outputs, "output");
  if (fixed.empty()) {
    // The rows of one execution are several clients' requests (and zero rows of padding):
    // each request's answer must come from its own rows alone.
    const Status independent = CheckRowsIndependent(network);
    if (independent.ok())
      return independent;
    return Status(independent.code(),
                  std::string(what) + ": cannot batch (max_batch_size in config.json) because " +
                      independent.message() +
                      ". Only a model whose rows stay apart can be batched (docs/operators.md, "
                      "\"Which models can be batched\"); remove max_batch_size and "
                      "dynamic_batching from its config.json to serve it unbatched");
  }
  return InvalidArgument(std::string(what) +
                         ": cannot batch (max_batch_size in config.json) because " + fixed +
                         "; requests are joined along the first dimension, so every input and "
                         "output needs a symbolic one. Export the model with a dynamic first "
                         "dimension (an ONNX dim_param such as \"N\"), or remove max_batch_size "
                         "and dynamic_batching from its config.json");
}

std::vector<int64_t> ExecutionBatchSizes(int64_t max_batch_size,
                                         std::span<const int64_t> preferred_batch_sizes) {
  std::vector<int64_t> sizes(preferred_batch_sizes.begin(), preferred_batch_sizes.end());
  for (int64_t size = 1; size < max_batch_size; size *= 2)
    sizes.push_back(size);
  sizes.push_back(max_batch_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace backplane::server
