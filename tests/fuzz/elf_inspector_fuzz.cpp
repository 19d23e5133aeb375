// libFuzzer target for the ELF inspector (loader/src/elf_inspector.cpp): any byte string must give
// facts or an error, never a crash, a read outside the input or a hang; and the verdict must not
// depend on where the bytes come from (checked: a difference aborts). The bytes are judged three
// ways, each with the same name in its messages:
//  - from memory: InspectElf on the fuzzer's buffer;
//  - as the loader judges a backend file: the bytes written to a file, SealedImage::Read of it
//    (the sealed memory copy), its Map(), then InspectElf on the mapping (Loader::LoadNew);
//  - as the dependency check reads a library: ReadElfFile of the same file (a private mapping of
//    it), then CheckUnloadable.
// The three must agree on success, the error's code, reason and message, and every fact. The file
// is new for each input (under $TMPDIR, else /dev/shm, else /tmp) and removed once judged. Seed it
// with real shared objects, e.g. a copy of libm.so.6.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "backplane/loader/elf_inspector.hpp"
#include "backplane/loader/sealed_image.hpp"

namespace {

using namespace backplane;
using namespace backplane::loader;

constexpr const char* kName = "fuzz_input_backend.so";

[[noreturn]] void Fail(const char* what, const std::string& left, const std::string& right) {
  std::fprintf(stderr, "elf_inspector_fuzz: %s differs:\n  from memory: %s\n  from the file: %s\n",
               what, left.c_str(), right.c_str());
  std::abort();
}

std::string Describe(const Result<ElfFacts>& result) {
  return result.ok() ? std::string("ok") : result.error().ToString();
}

std::string Join(const std::vector<std::string>& items) {
  std::string joined = "[";
  for (const std::string& item : items)
    joined += item + ",";
  return joined + "]";
}

// Every field of ElfFacts (a new field belongs here too).
void CompareFacts(const ElfFacts& a, const ElfFacts& b) {
  auto same = [](const char* what, const std::string& x, const std::string& y) {
    if (x != y)
      Fail(what, x, y);
  };
  same("build_id", a.build_id, b.build_id);
  same("nodelete", std::to_string(a.nodelete), std::to_string(b.nodelete));
  same("unique_symbols", Join(a.unique_symbols), Join(b.unique_symbols));
  same("unique_symbol_count", std::to_string(a.unique_symbol_count),
       std::to_string(b.unique_symbol_count));
  same("thread_atexit_import", a.thread_atexit_import, b.thread_atexit_import);
  same("stack", std::to_string(static_cast<int>(a.stack)),
       std::to_string(static_cast<int>(b.stack)));
  same("exported_symbols", Join(a.exported_symbols), Join(b.exported_symbols));
  same("exported_symbol_count", std::to_string(a.exported_symbol_count),
       std::to_string(b.exported_symbol_count));
  same("binds_now", std::to_string(a.binds_now), std::to_string(b.binds_now));
  same("thread_pool_entry_point", a.thread_pool_entry_point, b.thread_pool_entry_point);
  same("thread_start_import", a.thread_start_import, b.thread_start_import);
  same("registry_writes", Join(a.registry_writes), Join(b.registry_writes));
  same("tbb_task_imports", Join(a.tbb_task_imports), Join(b.tbb_task_imports));
  same("needed", Join(a.needed), Join(b.needed));
  same("search_path", a.search_path, b.search_path);
  same("search_path_is_runpath", std::to_string(a.search_path_is_runpath),
       std::to_string(b.search_path_is_runpath));
}

void CompareVerdicts(const char* how, const Result<ElfFacts>& memory,
                     const Result<ElfFacts>& file) {
  if (memory.ok() != file.ok() ||
      (!memory.ok() && (memory.error().code() != file.error().code() ||
                        memory.error().reason() != file.error().reason() ||
                        memory.error().message() != file.error().message()))) {
    Fail(how, Describe(memory), Describe(file));
  }
  if (memory.ok())
    CompareFacts(*memory, *file);
}

// A new file for each input, under $TMPDIR, else /dev/shm (memory: this runs for every input),
// else /tmp. Removed once judged: libFuzzer ends a timed run without running atexit handlers.
std::string WriteScratch(std::span<const std::byte> image) {
  const char* directory = std::getenv("TMPDIR");
  std::string path = directory != nullptr && *directory != '\0' ? directory : "/tmp";
  if (directory == nullptr && std::filesystem::is_directory("/dev/shm"))
    path = "/dev/shm";
  path += "/elf_inspector_fuzz.XXXXXX";
  const int fd = mkstemp(path.data());
  bool written = fd >= 0;
  for (std::size_t done = 0; written && done < image.size();) {
    const ssize_t n = write(fd, image.data() + done, image.size() - done);
    written = n > 0;
    done += written ? static_cast<std::size_t>(n) : 0;
  }
  // Closed before it is read: the sealed copy refuses a file that a process has open for writing.
  if (fd < 0 || !written || close(fd) != 0) {
    std::perror("elf_inspector_fuzz: writing the scratch file");
    std::abort();
  }
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto image = std::as_bytes(std::span(data, size));
  const auto from_memory = InspectElf(image, kName);

  const std::string file = WriteScratch(image);
  auto sealed = SealedImage::Read(file, "elf_inspector_fuzz");
  if (!sealed.ok())
    Fail("reading the file", "-", sealed.error().ToString());
  auto mapped = sealed->Map();
  if (!mapped.ok())
    Fail("mapping the sealed copy", "-", mapped.error().ToString());
  CompareVerdicts("the verdict on the sealed copy", from_memory, InspectElf(mapped->span(), kName));

  auto read = ReadElfFile(file, kName);
  if (read.ok())
    read = CheckUnloadable(std::move(read).value(), kName);
  CompareVerdicts("the verdict of ReadElfFile + CheckUnloadable", from_memory, read);
  unlink(file.c_str());  // kept when a difference aborts: it is the input
  return 0;
}
