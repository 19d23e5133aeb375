// libFuzzer target for InspectElf: any byte string must give a result, never a crash, a read
// outside the input or a hang. Seed it with real shared objects, e.g. a copy of libm.so.6.
#include <cstddef>
#include <cstdint>
#include <span>

#include "backplane/loader/elf_inspector.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto image = std::as_bytes(std::span(data, size));
  const auto result = backplane::loader::InspectElf(image, "fuzz_input_backend.so");
  // Touch the outcome so that sanitizers see every byte of the strings built.
  volatile std::size_t sink =
      result.ok() ? result->build_id.size() : result.error().message().size();
  (void)sink;
  return 0;
}
