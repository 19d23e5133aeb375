// The bytes of a call between the host and a backend worker (isolation/): the SDK's types written
// into a slot of the shared region and read back on the other side.
//
// Both sides are the same build of Backplane, so the encoding is plain little-endian fields with
// lengths, no versioning. The reader still checks every length against what is left: a worker is
// a process running code we do not trust, and what it writes must never make the host read past
// its slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backplane/core/operator.hpp"
#include "backplane/core/options.hpp"
#include "backplane/core/status.hpp"
#include "backplane/sdk/backend.hpp"

namespace backplane::isolation {

// Appends to a caller's byte range; `ok()` turns false (and stays) once a write does not fit.
class WireWriter {
 public:
  explicit WireWriter(std::span<std::byte> out) : out_(out) {}

  template <typename T>
  requires std::is_trivially_copyable_v<T>
  void Put(const T& value) { PutBytes(&value, sizeof value); }
  void PutBytes(const void* data, std::size_t size);
  void PutString(std::string_view text);

  void Put(const Status& status);
  void Put(const TensorInfo& info);
  void Put(const OptionValue& value);
  void Put(const BackendOptions& options);
  void Put(const std::vector<OptionDescriptor>& descriptors);
  void Put(const std::vector<std::string>& texts);
  // Constant inputs are written as their bytes, so the worker holds its own copy.
  void Put(const OperatorDesc& op);
  void Put(const SubgraphDesc& subgraph);

  // Reserves `size` bytes (for tensor data written in place); null when they do not fit.
  std::byte* Reserve(std::size_t size);
  // Pads to a multiple of `alignment` from the start (tensor data starts on a cache line).
  void AlignTo(std::size_t alignment) { Reserve((alignment - used_ % alignment) % alignment); }

  bool ok() const { return ok_; }
  std::size_t size() const { return used_; }
  std::size_t capacity() const { return out_.size(); }

 private:
  std::span<std::byte> out_;
  std::size_t used_ = 0;
  bool ok_ = true;
};

// Storage that decoded OperatorDescs point into (their constant inputs): keep it as long as the
// descriptions, and as long as any workload created from them.
using ConstantStore = std::vector<std::vector<std::byte>>;

// Reads what WireWriter wrote; `ok()` turns false once a read would pass the end or a value is
// out of range, and every later read returns a default value.
class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  requires std::is_trivially_copyable_v<T> T Get() {
    if constexpr (std::is_same_v<T, bool>) {
      // A byte from the peer is no bool until checked: anything but 0 or 1 is out of range, and
      // copying it into a bool would make every later read of that bool undefined.
      const auto byte = Get<uint8_t>();
      if (byte > 1)
        Fail();
      return byte == 1;
    } else {
      T value{};
      GetBytes(&value, sizeof value);
      return value;
    }
  }
  void GetBytes(void* data, std::size_t size);
  std::string GetString();
  // A view of the next `size` bytes, or null (and !ok()) when there are fewer.
  const std::byte* Take(std::size_t size);
  void AlignTo(std::size_t alignment) { Take((alignment - used_ % alignment) % alignment); }
  std::size_t position() const { return used_; }
  // `size` bytes at `offset` from the start, wherever the reader is; null when out of range.
  const std::byte* At(std::size_t offset, std::size_t size) const {
    return offset <= in_.size() && size <= in_.size() - offset ? in_.data() + offset : nullptr;
  }

  Status GetStatus();
  TensorInfo GetTensorInfo();
  OptionValue GetOptionValue();
  BackendOptions GetOptions();
  std::vector<OptionDescriptor> GetDescriptors();
  std::vector<std::string> GetStrings();
  OperatorDesc GetOperator(ConstantStore& constants);
  SubgraphDesc GetSubgraph(ConstantStore& constants);

  bool ok() const { return ok_; }
  std::size_t remaining() const { return in_.size() - used_; }
  // What went wrong, for the error a caller returns ("a reply of 12 bytes ended early").
  Status Error(std::string_view what) const;

 private:
  std::size_t GetCount(std::size_t element_size);
  void Fail() { ok_ = false; }

  std::span<const std::byte> in_;
  std::size_t used_ = 0;
  bool ok_ = true;
};

}  // namespace backplane::isolation
