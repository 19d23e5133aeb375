#include "backplane/isolation/wire.hpp"

#include <limits>

namespace backplane::isolation {

void WireWriter::PutBytes(const void* data, std::size_t size) {
  std::byte* at = Reserve(size);
  if (at != nullptr && size != 0)
    std::memcpy(at, data, size);
}

std::byte* WireWriter::Reserve(std::size_t size) {
  if (!ok_ || size > out_.size() - used_) {
    ok_ = false;
    return nullptr;
  }
  std::byte* at = out_.data() + used_;
  used_ += size;
  return at;
}

void WireWriter::PutString(std::string_view text) {
  Put(static_cast<uint64_t>(text.size()));
  PutBytes(text.data(), text.size());
}

void WireWriter::Put(const Status& status) {
  Put(static_cast<uint32_t>(status.code()));
  const auto reason = status.reason();
  Put(reason ? static_cast<uint32_t>(*reason) + 1 : uint32_t{0});
  PutString(status.message());
}

void WireWriter::Put(const TensorInfo& info) {
  Put(static_cast<int32_t>(info.type));
  Put(static_cast<uint64_t>(info.shape.size()));
  PutBytes(info.shape.data(), info.shape.size() * sizeof(int64_t));
}

void WireWriter::Put(const OptionValue& value) {
  Put(static_cast<uint32_t>(value.index()));
  std::visit(
      [&](const auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
          PutString(v);
        else
          Put(v);
      },
      value);
}

void WireWriter::Put(const BackendOptions& options) {
  Put(static_cast<uint64_t>(options.size()));
  for (const auto& [key, value] : options) {
    PutString(key);
    Put(value);
  }
}

void WireWriter::Put(const std::vector<OptionDescriptor>& descriptors) {
  Put(static_cast<uint64_t>(descriptors.size()));
  for (const auto& descriptor : descriptors) {
    PutString(descriptor.name);
    Put(static_cast<uint32_t>(descriptor.type));
    Put(descriptor.default_value);
    PutString(descriptor.help);
  }
}

void WireWriter::Put(const std::vector<std::string>& texts) {
  Put(static_cast<uint64_t>(texts.size()));
  for (const auto& text : texts)
    PutString(text);
}

void WireWriter::Put(const OperatorDesc& op) {
  PutString(op.op_type);
  PutString(op.name);
  Put(static_cast<uint64_t>(op.attributes.size()));
  for (const auto& [key, value] : op.attributes) {
    PutString(key);
    Put(static_cast<uint32_t>(value.index()));
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            PutString(v);
          } else if constexpr (std::is_same_v<V, std::vector<int64_t>> ||
                               std::is_same_v<V, std::vector<float>>) {
            Put(static_cast<uint64_t>(v.size()));
            PutBytes(v.data(), v.size() * sizeof(typename V::value_type));
          } else {
            Put(v);
          }
        },
        value);
  }
  Put(static_cast<uint64_t>(op.inputs.size()));
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    Put(op.inputs[i]);
    const void* constant = i < op.constant_inputs.size() ? op.constant_inputs[i] : nullptr;
    Put(static_cast<uint8_t>(constant != nullptr));
    if (constant != nullptr)
      PutBytes(constant, op.inputs[i].ByteSize());
  }
  Put(static_cast<uint64_t>(op.outputs.size()));
  for (const auto& output : op.outputs)
    Put(output);
}

void WireWriter::Put(const SubgraphDesc& subgraph) {
  Put(static_cast<uint64_t>(subgraph.layers.size()));
  for (std::size_t i = 0; i < subgraph.layers.size(); ++i) {
    Put(subgraph.layers[i]);
    Put(subgraph.layer_inputs.at(i));
    Put(subgraph.layer_outputs.at(i));
  }
  Put(subgraph.inputs);
  Put(static_cast<uint64_t>(subgraph.input_infos.size()));
  for (const auto& info : subgraph.input_infos)
    Put(info);
  Put(subgraph.outputs);
  Put(static_cast<uint64_t>(subgraph.output_infos.size()));
  for (const auto& info : subgraph.output_infos)
    Put(info);
}

void WireReader::GetBytes(void* data, std::size_t size) {
  const std::byte* at = Take(size);
  if (at != nullptr && size != 0)
    std::memcpy(data, at, size);
  else if (size != 0)
    std::memset(data, 0, size);
}

const std::byte* WireReader::Take(std::size_t size) {
  if (!ok_ || size > in_.size() - used_) {
    Fail();
    return nullptr;
  }
  const std::byte* at = in_.data() + used_;
  used_ += size;
  return at;
}

// A count of elements of at least `element_size` bytes each: never more than could follow.
std::size_t WireReader::GetCount(std::size_t element_size) {
  const auto count = Get<uint64_t>();
  if (count > remaining() / std::max<std::size_t>(element_size, 1)) {
    Fail();
    return 0;
  }
  return static_cast<std::size_t>(count);
}

std::string WireReader::GetString() {
  const std::size_t size = GetCount(1);
  const std::byte* at = Take(size);
  return at == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(at), size);
}

Status WireReader::GetStatus() {
  const auto code = Get<uint32_t>();
  const auto reason = Get<uint32_t>();
  std::string message = GetString();
  if (!ok_ || code == 0)
    return Status::Ok();
  if (code > static_cast<uint32_t>(StatusCode::kInternal) ||
      reason > static_cast<uint32_t>(LoadReason::kLastReason) + 1) {
    Fail();
    return Status::Ok();
  }
  if (reason != 0)
    return Status(static_cast<LoadReason>(reason - 1), std::move(message));
  return Status(static_cast<StatusCode>(code), std::move(message));
}

TensorInfo WireReader::GetTensorInfo() {
  TensorInfo info;
  info.type = static_cast<DataType>(Get<int32_t>());
  info.shape.resize(GetCount(sizeof(int64_t)));
  GetBytes(info.shape.data(), info.shape.size() * sizeof(int64_t));
  return info;
}

OptionValue WireReader::GetOptionValue() {
  switch (Get<uint32_t>()) {
    case 0:
      return Get<bool>();
    case 1:
      return Get<int64_t>();
    case 2:
      return Get<double>();
    case 3:
      return GetString();
    default:
      Fail();
      return false;
  }
}

BackendOptions WireReader::GetOptions() {
  BackendOptions options;
  for (std::size_t n = GetCount(9); n > 0 && ok_; --n) {
    std::string key = GetString();
    options.insert_or_assign(std::move(key), GetOptionValue());
  }
  return options;
}

std::vector<OptionDescriptor> WireReader::GetDescriptors() {
  std::vector<OptionDescriptor> descriptors(GetCount(21));
  for (auto& descriptor : descriptors) {
    descriptor.name = GetString();
    const auto type = Get<uint32_t>();
    if (type > static_cast<uint32_t>(OptionType::kString))
      Fail();
    descriptor.type = static_cast<OptionType>(type);
    descriptor.default_value = GetOptionValue();
    descriptor.help = GetString();
  }
  return descriptors;
}

std::vector<std::string> WireReader::GetStrings() {
  std::vector<std::string> texts(GetCount(8));
  for (auto& text : texts)
    text = GetString();
  return texts;
}

OperatorDesc WireReader::GetOperator(ConstantStore& constants) {
  OperatorDesc op;
  op.op_type = GetString();
  op.name = GetString();
  for (std::size_t n = GetCount(12); n > 0 && ok_; --n) {
    std::string key = GetString();
    AttributeValue value;
    switch (Get<uint32_t>()) {
      case 0:
        value = Get<int64_t>();
        break;
      case 1:
        value = Get<float>();
        break;
      case 2:
        value = GetString();
        break;
      case 3: {
        std::vector<int64_t> values(GetCount(sizeof(int64_t)));
        GetBytes(values.data(), values.size() * sizeof(int64_t));
        value = std::move(values);
        break;
      }
      case 4: {
        std::vector<float> values(GetCount(sizeof(float)));
        GetBytes(values.data(), values.size() * sizeof(float));
        value = std::move(values);
        break;
      }
      default:
        Fail();
    }
    op.attributes.insert_or_assign(std::move(key), std::move(value));
  }
  for (std::size_t n = GetCount(13); n > 0 && ok_; --n) {
    op.inputs.push_back(GetTensorInfo());
    const void* constant = nullptr;
    if (Get<uint8_t>() != 0) {
      const auto size = CheckedByteSize(op.inputs.back(), "a constant input");
      const std::byte* bytes = size.ok() ? Take(*size) : nullptr;
      if (bytes == nullptr) {
        Fail();
      } else {
        constants.emplace_back(bytes, bytes + *size);
        constant = constants.back().data();
      }
    }
    op.constant_inputs.push_back(constant);
  }
  for (std::size_t n = GetCount(12); n > 0 && ok_; --n)
    op.outputs.push_back(GetTensorInfo());
  return op;
}

SubgraphDesc WireReader::GetSubgraph(ConstantStore& constants) {
  SubgraphDesc subgraph;
  for (std::size_t n = GetCount(40); n > 0 && ok_; --n) {
    subgraph.layers.push_back(GetOperator(constants));
    subgraph.layer_inputs.push_back(GetStrings());
    subgraph.layer_outputs.push_back(GetStrings());
  }
  subgraph.inputs = GetStrings();
  for (std::size_t n = GetCount(12); n > 0 && ok_; --n)
    subgraph.input_infos.push_back(GetTensorInfo());
  subgraph.outputs = GetStrings();
  for (std::size_t n = GetCount(12); n > 0 && ok_; --n)
    subgraph.output_infos.push_back(GetTensorInfo());
  return subgraph;
}

Status WireReader::Error(std::string_view what) const {
  return Internal(std::string(what) + " of " + std::to_string(in_.size()) +
                  " bytes is malformed (read " + std::to_string(used_) + " bytes before it ended)");
}

}  // namespace backplane::isolation
