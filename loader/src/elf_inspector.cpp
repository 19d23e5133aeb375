#include "backplane/loader/elf_inspector.hpp"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime_evidence.hpp"

namespace backplane::loader {
namespace {

// The image is parsed with the host's own ELF class and byte order (anything else is refused
// before parsing), the way glibc's ElfW() does.
constexpr bool kHost64 = sizeof(void*) == 8;
constexpr unsigned char kHostClass = kHost64 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kHostData =
    std::endian::native == std::endian::little ? ELFDATA2LSB : ELFDATA2MSB;
using Ehdr = std::conditional_t<kHost64, Elf64_Ehdr, Elf32_Ehdr>;
using Phdr = std::conditional_t<kHost64, Elf64_Phdr, Elf32_Phdr>;
using Shdr = std::conditional_t<kHost64, Elf64_Shdr, Elf32_Shdr>;
using Dyn = std::conditional_t<kHost64, Elf64_Dyn, Elf32_Dyn>;
using Sym = std::conditional_t<kHost64, Elf64_Sym, Elf32_Sym>;
using Nhdr = std::conditional_t<kHost64, Elf64_Nhdr, Elf32_Nhdr>;
using Addr = std::conditional_t<kHost64, Elf64_Addr, Elf32_Addr>;

#if defined(__x86_64__)
constexpr std::optional<std::uint16_t> kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr std::optional<std::uint16_t> kHostMachine = EM_AARCH64;
#else
constexpr std::optional<std::uint16_t> kHostMachine = std::nullopt;
#endif

constexpr std::uint64_t kMaxU64 = ~std::uint64_t{0};
// Symbol lists in ElfFacts keep at most this many names (the counts are exact).
constexpr std::size_t kMaxListedSymbols = 64;
constexpr std::size_t kMaxRegistryWrites = 16;

// libtbb's entry points (oneTBB 2021, ABI namespace r1) that only code with TBB's task templates
// compiled in calls: spawning a task (tbb::task_group::run, parallel algorithms), running one
// and waiting (parallel_for and friends, task_group::run_and_wait), or enqueueing one into an
// arena (task_arena::enqueue). Matched by mangled prefix, whatever the overload.
bool IsTbbTaskSubmission(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {
      "_ZN3tbb6detail2r15spawnE",              // tbb::detail::r1::spawn(...)
      "_ZN3tbb6detail2r116execute_and_waitE",  // tbb::detail::r1::execute_and_wait(...)
      "_ZN3tbb6detail2r16submitE",             // tbb::detail::r1::submit(...)
      "_ZN3tbb6detail2r17enqueueE",            // tbb::detail::r1::enqueue(...)
  };
  return std::any_of(std::begin(kPrefixes), std::end(kPrefixes),
                     [&](std::string_view prefix) { return name.starts_with(prefix); });
}

std::string_view MachineName(std::uint16_t machine) {
  switch (machine) {
    case EM_386:
      return "x86";
    case EM_MIPS:
      return "MIPS";
    case EM_PPC:
      return "PowerPC";
    case EM_PPC64:
      return "PowerPC64";
    case EM_S390:
      return "S/390";
    case EM_ARM:
      return "ARM";
    case EM_X86_64:
      return "x86-64";
    case EM_AARCH64:
      return "AArch64";
    case EM_RISCV:
      return "RISC-V";
    case 258:  // EM_LOONGARCH, missing from older <elf.h>
      return "LoongArch";
  }
  return "unknown";
}

std::string DescribeMachine(std::uint16_t machine) {
  return "machine " + std::to_string(machine) + " (" + std::string(MachineName(machine)) + ")";
}

// Every read is preceded by a Contains() check on the same span; structs are copied out with
// memcpy because nothing in a file guarantees their alignment.
bool Contains(std::span<const std::byte> bytes, std::uint64_t offset, std::uint64_t length) {
  return offset <= bytes.size() && length <= bytes.size() - offset;
}

template <typename T>
T ReadAt(std::span<const std::byte> bytes, std::uint64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

Status NotElf(std::string_view file, std::string_view cause) {
  return {LoadReason::kNotElf, std::string(file) + " " + std::string(cause)};
}

// Fields that contradict each other cannot come from a linker; the file is damaged.
Status Corrupt(std::string_view file, const std::string& cause) {
  return {LoadReason::kNotElf, std::string(file) + " is a corrupt ELF file: " + cause +
                                   "; rebuild it and deploy it again"};
}

// `end` is nullopt when offset + size overflows 64 bits.
Status Truncated(std::string_view file, const std::string& what, std::optional<std::uint64_t> end,
                 std::uint64_t file_size) {
  std::string where =
      end ? "ends at byte " + std::to_string(*end) : "ends beyond byte " + std::to_string(kMaxU64);
  return {LoadReason::kElfTruncated,
          std::string(file) + " is truncated: " + what + " " + where + " but the file has " +
              std::to_string(file_size) +
              " bytes; a deploy still being written? publish with write-temp + fsync + rename"};
}

std::optional<Status> CheckInFile(std::span<const std::byte> image, std::string_view file,
                                  const std::string& what, std::uint64_t offset,
                                  std::uint64_t length) {
  if (Contains(image, offset, length))
    return std::nullopt;
  std::optional<std::uint64_t> end;
  if (offset <= kMaxU64 - length)
    end = offset + length;
  return Truncated(file, what, end, image.size());
}

Status WrongArch(std::string_view file, const std::string& cause) {
  return {LoadReason::kWrongArch, std::string(file) + " " + cause};
}

std::string Hex(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), kDigits[value & 0xf]);
    value >>= 4;
  } while (value != 0);
  return "0x" + out;
}

// The dynamic symbol table, as the dynamic linker will see it.
struct SymbolTable {
  std::span<const std::byte> symbols;  // count * sizeof(Sym) bytes
  std::uint64_t count = 0;
  std::span<const std::byte> strings;
};

std::string_view NameAt(std::span<const std::byte> strings, std::uint64_t offset) {
  if (offset >= strings.size())
    return {};
  const char* begin = reinterpret_cast<const char*>(strings.data()) + offset;
  const std::size_t limit = strings.size() - offset;
  const void* nul = std::memchr(begin, '\0', limit);
  return {begin, nul ? static_cast<std::size_t>(static_cast<const char*>(nul) - begin) : limit};
}

// Bytes of the file backing virtual address `vaddr`, up to the end of the file image of the
// PT_LOAD segment that holds it. The segments were checked to lie inside the file.
std::optional<std::span<const std::byte>> MapAddress(std::span<const std::byte> image,
                                                     const std::vector<Phdr>& phdrs,
                                                     std::uint64_t vaddr) {
  for (const Phdr& ph : phdrs) {
    if (ph.p_type != PT_LOAD)
      continue;
    if (vaddr < ph.p_vaddr || vaddr - ph.p_vaddr >= ph.p_filesz)
      continue;
    const std::uint64_t delta = vaddr - ph.p_vaddr;
    return image.subspan(ph.p_offset + delta, ph.p_filesz - delta);
  }
  return std::nullopt;
}

// Number of symbols in DT_SYMTAB, from DT_HASH's nchain or by walking DT_GNU_HASH to the end of
// the longest chain (the GNU table has no count of its own).
std::optional<std::uint64_t> CountFromGnuHash(std::span<const std::byte> table) {
  if (!Contains(table, 0, 16))
    return std::nullopt;
  const auto nbuckets = ReadAt<std::uint32_t>(table, 0);
  const auto symoffset = ReadAt<std::uint32_t>(table, 4);
  const auto bloom_size = ReadAt<std::uint32_t>(table, 8);
  const std::uint64_t buckets = 16 + std::uint64_t{bloom_size} * sizeof(Addr);
  const std::uint64_t chains = buckets + std::uint64_t{nbuckets} * 4;
  if (!Contains(table, buckets, chains - buckets))
    return std::nullopt;
  std::uint32_t last = 0;
  for (std::uint64_t i = 0; i < nbuckets; ++i) {
    last = std::max(last, ReadAt<std::uint32_t>(table, buckets + i * 4));
  }
  if (last == 0)
    return symoffset;
  if (last < symoffset)
    return std::nullopt;
  for (std::uint64_t index = last;; ++index) {
    const std::uint64_t entry = chains + (index - symoffset) * 4;
    if (!Contains(table, entry, 4))
      return std::nullopt;
    if (ReadAt<std::uint32_t>(table, entry) & 1)
      return index + 1;
  }
}

struct DynamicInfo {
  bool nodelete = false;
  bool bind_now = false;  // DT_BIND_NOW, DF_BIND_NOW or DF_1_NOW: what -z now sets
  std::optional<std::uint64_t> symtab, strtab, strsz, syment, hash, gnu_hash;
  // String-table offsets, resolved once DT_STRTAB is known.
  std::vector<std::uint64_t> needed;
  std::optional<std::uint64_t> rpath, runpath;
};

DynamicInfo ReadDynamic(std::span<const std::byte> image, const std::vector<Phdr>& phdrs) {
  DynamicInfo info;
  for (const Phdr& ph : phdrs) {
    if (ph.p_type != PT_DYNAMIC)
      continue;
    for (std::uint64_t at = 0; at + sizeof(Dyn) <= ph.p_filesz; at += sizeof(Dyn)) {
      const Dyn dyn = ReadAt<Dyn>(image, ph.p_offset + at);
      if (dyn.d_tag == DT_NULL)
        break;
      const std::uint64_t value = dyn.d_un.d_val;
      switch (dyn.d_tag) {
        case DT_FLAGS_1:
          if (value & DF_1_NODELETE)
            info.nodelete = true;
          if (value & DF_1_NOW)
            info.bind_now = true;
          break;
        case DT_FLAGS:
          if (value & DF_BIND_NOW)
            info.bind_now = true;
          break;
        case DT_BIND_NOW:
          info.bind_now = true;
          break;
        case DT_NEEDED:
          // Bounded: a corrupt section of millions of DT_NEEDED entries must not eat memory.
          if (info.needed.size() < 1024)
            info.needed.push_back(value);
          break;
        case DT_RPATH:
          info.rpath = info.rpath.value_or(value);
          break;
        case DT_RUNPATH:
          info.runpath = info.runpath.value_or(value);
          break;
        case DT_SYMTAB:
          info.symtab = info.symtab.value_or(value);
          break;
        case DT_STRTAB:
          info.strtab = info.strtab.value_or(value);
          break;
        case DT_STRSZ:
          info.strsz = info.strsz.value_or(value);
          break;
        case DT_SYMENT:
          info.syment = info.syment.value_or(value);
          break;
        case DT_HASH:
          info.hash = info.hash.value_or(value);
          break;
        case DT_GNU_HASH:
          info.gnu_hash = info.gnu_hash.value_or(value);
          break;
        default:
          break;
      }
    }
  }
  return info;
}

// Fallback for images without section headers: find the table through PT_DYNAMIC. Without a
// hash table the symbols cannot be counted, but then the dynamic linker cannot look any of them
// up either (dlsym of the entry points fails later), so skipping is safe.
Result<std::optional<SymbolTable>> SymbolsFromDynamic(std::span<const std::byte> image,
                                                      std::string_view file,
                                                      const std::vector<Phdr>& phdrs,
                                                      const DynamicInfo& dyn) {
  if (!dyn.symtab || (!dyn.hash && !dyn.gnu_hash))
    return std::optional<SymbolTable>{};
  if (dyn.syment && *dyn.syment != sizeof(Sym)) {
    return Corrupt(file, "DT_SYMENT is " + std::to_string(*dyn.syment) + " but must be " +
                             std::to_string(sizeof(Sym)));
  }
  std::optional<std::uint64_t> count;
  if (dyn.hash) {
    auto table = MapAddress(image, phdrs, *dyn.hash);
    if (table && Contains(*table, 0, 8))
      count = ReadAt<std::uint32_t>(*table, 4);
    if (!count)
      return Corrupt(file, "DT_HASH " + Hex(*dyn.hash) + " is outside every PT_LOAD");
  } else {
    auto table = MapAddress(image, phdrs, *dyn.gnu_hash);
    if (table)
      count = CountFromGnuHash(*table);
    if (!count) {
      return Corrupt(file, "DT_GNU_HASH " + Hex(*dyn.gnu_hash) +
                               " is outside every PT_LOAD or its chains do not end");
    }
  }
  SymbolTable table;
  table.count = *count;
  if (table.count > kMaxU64 / sizeof(Sym)) {
    return Corrupt(file,
                   "the dynamic hash table claims " + std::to_string(table.count) + " symbols");
  }
  if (table.count == 0)
    return std::optional<SymbolTable>{table};
  auto symbols = MapAddress(image, phdrs, *dyn.symtab);
  if (!symbols || !Contains(*symbols, 0, table.count * sizeof(Sym))) {
    return Corrupt(file, "DT_SYMTAB " + Hex(*dyn.symtab) + " with " + std::to_string(table.count) +
                             " symbols is outside every PT_LOAD");
  }
  table.symbols = symbols->first(table.count * sizeof(Sym));
  if (dyn.strtab) {
    auto strings = MapAddress(image, phdrs, *dyn.strtab);
    const std::uint64_t size = dyn.strsz.value_or(0);
    if (!strings || !Contains(*strings, 0, size)) {
      return Corrupt(file, "DT_STRTAB " + Hex(*dyn.strtab) + " of " + std::to_string(size) +
                               " bytes is outside every PT_LOAD");
    }
    table.strings = strings->first(size);
  }
  return std::optional<SymbolTable>{table};
}

// Lower-case hex of the first NT_GNU_BUILD_ID note in `notes`. Notes are padded to 4 bytes, or to
// 8 in segments aligned to 8 (as binutils and glibc read them).
std::optional<std::string> FindBuildId(std::span<const std::byte> notes, std::uint64_t alignment) {
  const std::uint64_t align = alignment == 8 ? 8 : 4;
  auto align_up = [align](std::uint64_t value) { return (value + align - 1) & ~(align - 1); };
  std::uint64_t at = 0;
  while (Contains(notes, at, sizeof(Nhdr))) {
    const Nhdr note = ReadAt<Nhdr>(notes, at);
    // Both sizes are 32-bit and `at` is within the span, so none of this can overflow.
    const std::uint64_t name = at + sizeof(Nhdr);
    const std::uint64_t desc = align_up(name + note.n_namesz);
    if (!Contains(notes, desc, note.n_descsz))
      break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
        std::memcmp(notes.data() + name, "GNU", 4) == 0) {
      static constexpr char kDigits[] = "0123456789abcdef";
      std::string hex;
      for (std::byte b : notes.subspan(desc, note.n_descsz)) {
        hex += kDigits[std::to_integer<unsigned>(b) >> 4];
        hex += kDigits[std::to_integer<unsigned>(b) & 0xf];
      }
      return hex;
    }
    at = align_up(desc + note.n_descsz);
  }
  return std::nullopt;
}

std::string PhdrWhat(std::size_t index, std::string_view type) {
  return "program header " + std::to_string(index) + " (" + std::string(type) + ")";
}

}  // namespace

Result<ElfFacts> ReadElf(std::span<const std::byte> image, std::string_view file) {
  // 1. Is it ELF at all?
  if (image.size() < SELFMAG || std::memcmp(image.data(), ELFMAG, SELFMAG) != 0) {
    return NotElf(file,
                  "is not an ELF file (bad magic): it does not start with \\x7fELF; a backend must "
                  "be a shared object (.so) built with backplane_add_backend()");
  }
  if (auto error = CheckInFile(image, file, "the ELF identification", 0, EI_NIDENT)) {
    return *std::move(error);
  }
  const auto elf_class = std::to_integer<unsigned>(image[EI_CLASS]);
  const auto elf_data = std::to_integer<unsigned>(image[EI_DATA]);
  if (elf_class != ELFCLASS32 && elf_class != ELFCLASS64) {
    return WrongArch(file, "has an invalid ELF class " + std::to_string(elf_class) +
                               " but this host needs " + (kHost64 ? "64" : "32") +
                               "-bit ELF (ELFCLASS" + (kHost64 ? "64" : "32") + ")");
  }

  // 2. Truncation, before arch checks that a half-written file would fail spuriously. The header
  // size is known from the class alone.
  const std::uint64_t header_size =
      elf_class == ELFCLASS64 ? sizeof(Elf64_Ehdr) : sizeof(Elf32_Ehdr);
  if (auto error = CheckInFile(image, file, "the ELF header", 0, header_size)) {
    return *std::move(error);
  }
  // Nothing past the header can be read in a foreign class or byte order.
  if (elf_class != kHostClass) {
    const std::string is = elf_class == ELFCLASS32 ? "32" : "64";
    const std::string needs = kHost64 ? "64" : "32";
    return WrongArch(file, "is a " + is + "-bit ELF file (ELFCLASS" + is + ") but this host is " +
                               needs + "-bit and needs ELFCLASS" + needs +
                               "; rebuild the backend for this host");
  }
  if (elf_data != kHostData) {
    auto order = [](unsigned data) -> std::string {
      if (data == ELFDATA2LSB)
        return "little-endian (ELFDATA2LSB)";
      if (data == ELFDATA2MSB)
        return "big-endian (ELFDATA2MSB)";
      return "of invalid byte order " + std::to_string(data);
    };
    return WrongArch(file, "is " + order(elf_data) + " but this host is " + order(kHostData) +
                               "; rebuild the backend for this host");
  }
  const Ehdr ehdr = ReadAt<Ehdr>(image, 0);

  std::vector<Phdr> phdrs;
  if (ehdr.e_phnum != 0) {
    if (ehdr.e_phentsize != sizeof(Phdr)) {
      return Corrupt(file, "e_phentsize is " + std::to_string(ehdr.e_phentsize) + " but must be " +
                               std::to_string(sizeof(Phdr)));
    }
    if (auto error = CheckInFile(image, file, "the program header table", ehdr.e_phoff,
                                 std::uint64_t{ehdr.e_phnum} * sizeof(Phdr))) {
      return *std::move(error);
    }
    phdrs.reserve(ehdr.e_phnum);
    for (std::uint64_t i = 0; i < ehdr.e_phnum; ++i) {
      phdrs.push_back(ReadAt<Phdr>(image, ehdr.e_phoff + i * sizeof(Phdr)));
    }
  }

  std::vector<Shdr> shdrs;
  if (ehdr.e_shoff != 0) {
    if (ehdr.e_shentsize != sizeof(Shdr)) {
      return Corrupt(file, "e_shentsize is " + std::to_string(ehdr.e_shentsize) + " but must be " +
                               std::to_string(sizeof(Shdr)));
    }
    // With 0xff00 sections or more, e_shnum is 0 and section 0's sh_size holds the count.
    std::uint64_t count = ehdr.e_shnum;
    if (count == 0) {
      if (auto error =
              CheckInFile(image, file, "the section header table", ehdr.e_shoff, sizeof(Shdr))) {
        return *std::move(error);
      }
      count = ReadAt<Shdr>(image, ehdr.e_shoff).sh_size;
    }
    const std::optional<std::uint64_t> table_size =
        count <= kMaxU64 / sizeof(Shdr) ? std::optional(count * sizeof(Shdr)) : std::nullopt;
    if (!table_size || !Contains(image, ehdr.e_shoff, *table_size)) {
      std::optional<std::uint64_t> end;
      if (table_size && ehdr.e_shoff <= kMaxU64 - *table_size)
        end = ehdr.e_shoff + *table_size;
      return Truncated(file, "the section header table", end, image.size());
    }
    shdrs.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      shdrs.push_back(ReadAt<Shdr>(image, ehdr.e_shoff + i * sizeof(Shdr)));
    }
  }

  for (std::size_t i = 0; i < phdrs.size(); ++i) {
    const Phdr& ph = phdrs[i];
    std::string_view type;
    switch (ph.p_type) {
      case PT_LOAD:
        type = "PT_LOAD";
        break;
      case PT_DYNAMIC:
        type = "PT_DYNAMIC";
        break;
      case PT_NOTE:
        type = "PT_NOTE";
        break;
      default:
        continue;
    }
    if (auto error = CheckInFile(image, file, PhdrWhat(i, type), ph.p_offset, ph.p_filesz)) {
      return *std::move(error);
    }
  }

  std::vector<SymbolTable> symbol_tables;
  for (std::size_t i = 0; i < shdrs.size(); ++i) {
    const Shdr& sh = shdrs[i];
    if (sh.sh_type == SHT_NOTE) {
      if (auto error = CheckInFile(image, file, "note section " + std::to_string(i), sh.sh_offset,
                                   sh.sh_size)) {
        return *std::move(error);
      }
    }
    if (sh.sh_type != SHT_DYNSYM)
      continue;
    const std::string what =
        "the dynamic symbol table (.dynsym, section " + std::to_string(i) + ")";
    if (auto error = CheckInFile(image, file, what, sh.sh_offset, sh.sh_size)) {
      return *std::move(error);
    }
    if (sh.sh_entsize != sizeof(Sym)) {
      return Corrupt(file, what + " has sh_entsize " + std::to_string(sh.sh_entsize) +
                               " but must have " + std::to_string(sizeof(Sym)));
    }
    if (sh.sh_link >= shdrs.size() || shdrs[sh.sh_link].sh_type != SHT_STRTAB) {
      return Corrupt(file, what + " links to section " + std::to_string(sh.sh_link) +
                               ", which is not a string table");
    }
    const Shdr& str = shdrs[sh.sh_link];
    if (auto error = CheckInFile(
            image, file, "the string table of .dynsym (section " + std::to_string(sh.sh_link) + ")",
            str.sh_offset, str.sh_size)) {
      return *std::move(error);
    }
    SymbolTable table;
    table.count = sh.sh_size / sizeof(Sym);
    table.symbols = image.subspan(sh.sh_offset, table.count * sizeof(Sym));
    table.strings = image.subspan(str.sh_offset, str.sh_size);
    symbol_tables.push_back(table);
  }

  // 3. Architecture and file type.
  if (kHostMachine && ehdr.e_machine != *kHostMachine) {
    return WrongArch(file, "is built for " + DescribeMachine(ehdr.e_machine) +
                               " but this host is " + std::string(MachineName(*kHostMachine)) +
                               "; rebuild the backend for this host");
  }
  if (ehdr.e_type != ET_DYN) {
    std::string is;
    switch (ehdr.e_type) {
      case ET_EXEC:
        is = "is an executable (ET_EXEC)";
        break;
      case ET_REL:
        is = "is a relocatable object file (ET_REL)";
        break;
      case ET_CORE:
        is = "is a core dump (ET_CORE)";
        break;
      default:
        is = "has ELF type " + std::to_string(ehdr.e_type);
        break;
    }
    return WrongArch(file, is + ", not a shared object (ET_DYN); link the backend with -shared "
                                "(backplane_add_backend() does)");
  }

  // 4. Can it ever leave the process again?
  const DynamicInfo dynamic = ReadDynamic(image, phdrs);
  if (symbol_tables.empty()) {
    auto from_dynamic = SymbolsFromDynamic(image, file, phdrs, dynamic);
    if (!from_dynamic.ok())
      return std::move(from_dynamic).error();
    if (from_dynamic.value())
      symbol_tables.push_back(*from_dynamic.value());
  }

  ElfFacts facts;
  facts.nodelete = dynamic.nodelete;
  facts.binds_now = dynamic.bind_now;
  for (const SymbolTable& table : symbol_tables) {
    for (std::uint64_t i = 0; i < table.count; ++i) {
      const Sym sym = ReadAt<Sym>(table.symbols, i * sizeof(Sym));
      // ELF32_ST_BIND and ELF64_ST_BIND are the same shift (and so are the others).
      const unsigned bind = ELF64_ST_BIND(sym.st_info);
      const unsigned type = ELF64_ST_TYPE(sym.st_info);
      const unsigned visibility = ELF64_ST_VISIBILITY(sym.st_other);
      const std::string_view name = NameAt(table.strings, sym.st_name);
      if (sym.st_shndx == SHN_UNDEF) {
        if (facts.thread_atexit_import.empty() &&
            (name == "__cxa_thread_atexit" || name == "__cxa_thread_atexit_impl")) {
          facts.thread_atexit_import = name;
        }
        if (facts.thread_start_import.empty() && IsThreadStart(name))
          facts.thread_start_import = name;
        if (facts.registry_writes.size() < kMaxRegistryWrites && RegistryWrittenBy(name) != nullptr)
          facts.registry_writes.emplace_back(name);
        if (IsTbbTaskSubmission(name) && facts.tbb_task_imports.size() < kMaxListedSymbols)
          facts.tbb_task_imports.emplace_back(name);
        continue;
      }
      if (bind == STB_GNU_UNIQUE && facts.unique_symbols.size() < kMaxListedSymbols)
        facts.unique_symbols.emplace_back(name.empty() ? "(unnamed)" : name);
      if (bind == STB_GNU_UNIQUE)
        ++facts.unique_symbol_count;
      // What another object could bind to: version-node names (SHN_ABS) and section or file
      // symbols are not code or data anyone imports.
      const bool exported = (bind == STB_GLOBAL || bind == STB_WEAK || bind == STB_GNU_UNIQUE) &&
                            (visibility == STV_DEFAULT || visibility == STV_PROTECTED) &&
                            sym.st_shndx != SHN_ABS && type != STT_SECTION && type != STT_FILE &&
                            !name.empty();
      if (exported && facts.thread_pool_entry_point.empty() && IsThreadPoolEntryPoint(name))
        facts.thread_pool_entry_point = name;
      if (exported && facts.exported_symbols.size() < kMaxListedSymbols)
        facts.exported_symbols.emplace_back(name);
      if (exported)
        ++facts.exported_symbol_count;
    }
  }
  const auto stack = std::find_if(phdrs.begin(), phdrs.end(),
                                  [](const Phdr& ph) { return ph.p_type == PT_GNU_STACK; });
  facts.stack = stack == phdrs.end()      ? ElfFacts::Stack::kUnspecified
                : (stack->p_flags & PF_X) ? ElfFacts::Stack::kExecutable
                                          : ElfFacts::Stack::kNotExecutable;

  // Dependencies and where the dynamic linker will look for them (its strings live in DT_STRTAB).
  if (dynamic.strtab) {
    auto strings = MapAddress(image, phdrs, *dynamic.strtab);
    if (strings) {
      const std::span<const std::byte> table =
          strings->first(std::min<std::uint64_t>(strings->size(), dynamic.strsz.value_or(0)));
      for (std::uint64_t offset : dynamic.needed) {
        const std::string_view name = NameAt(table, offset);
        if (!name.empty())
          facts.needed.emplace_back(name);
      }
      if (dynamic.runpath) {
        facts.search_path = NameAt(table, *dynamic.runpath);
        facts.search_path_is_runpath = true;
      } else if (dynamic.rpath) {
        facts.search_path = NameAt(table, *dynamic.rpath);
      }
    }
  }

  // 5. Identity.
  std::optional<std::string> build_id;
  for (const Phdr& ph : phdrs) {
    if (ph.p_type != PT_NOTE)
      continue;
    build_id = FindBuildId(image.subspan(ph.p_offset, ph.p_filesz), ph.p_align);
    if (build_id)
      break;
  }
  for (std::size_t i = 0; !build_id && i < shdrs.size(); ++i) {
    if (shdrs[i].sh_type != SHT_NOTE)
      continue;
    build_id =
        FindBuildId(image.subspan(shdrs[i].sh_offset, shdrs[i].sh_size), shdrs[i].sh_addralign);
  }
  if (build_id)
    facts.build_id = *std::move(build_id);
  return facts;
}

std::vector<std::string> UnloadabilityCauses(const ElfFacts& facts) {
  std::vector<std::string> causes;
  if (facts.nodelete) {
    causes.push_back(
        "is linked with -z nodelete (DF_1_NODELETE): glibc would never unmap it, so it could not "
        "be replaced; remove -z nodelete (backplane_add_backend() never sets it)");
  }
  if (facts.unique_symbol_count != 0) {
    // Every one, as the author must fix every one; a library like libstdc++ has a hundred.
    constexpr std::size_t kNamed = 16;
    std::string names;
    for (std::size_t i = 0; i < facts.unique_symbols.size() && i < kNamed; ++i)
      names += (names.empty() ? "" : ", ") + Demangle(facts.unique_symbols[i]);
    if (facts.unique_symbol_count > kNamed) {
      names += " and " + std::to_string(facts.unique_symbol_count - kNamed) +
               " more; nm -DC --defined-only lists them with type u";
    }
    causes.push_back("defines " + std::to_string(facts.unique_symbol_count) +
                     " STB_GNU_UNIQUE symbol" + (facts.unique_symbol_count == 1 ? "" : "s") + " (" +
                     names +
                     "): glibc would never unmap it and a new version would bind to this "
                     "version's objects; build with -fno-gnu-unique or backplane_add_backend()");
  }
  if (!facts.thread_atexit_import.empty()) {
    causes.push_back("imports " + facts.thread_atexit_import +
                     ": a thread_local object with a non-trivial destructor pins the library "
                     "while any thread lives; make thread_local data trivially destructible or "
                     "keep it in the backend instance");
  }
  if (facts.stack == ElfFacts::Stack::kUnspecified) {
    // glibc's default stack permissions when PT_GNU_STACK is absent include PF_X.
    causes.push_back(
        "has no PT_GNU_STACK header, so glibc gives it an executable stack: loading it would make "
        "every thread stack executable, which unloading cannot undo; link with -z noexecstack");
  } else if (facts.stack == ElfFacts::Stack::kExecutable) {
    causes.push_back(
        "requires an executable stack (PT_GNU_STACK is RWX): loading it would make every thread "
        "stack executable, which unloading cannot undo; link with -z noexecstack");
  }
  return causes;
}

Result<ElfFacts> CheckUnloadable(ElfFacts facts, std::string_view file) {
  const std::vector<std::string> causes = UnloadabilityCauses(facts);
  if (causes.empty())
    return facts;
  std::string message = std::string(file) + " " + causes.front();
  for (std::size_t i = 1; i < causes.size(); ++i)
    message += "; it also " + causes[i];
  return Status{LoadReason::kNotUnloadable, std::move(message)};
}

Result<ElfFacts> InspectElf(std::span<const std::byte> image, std::string_view file) {
  auto facts = ReadElf(image, file);
  if (!facts.ok())
    return facts;
  return CheckUnloadable(std::move(facts).value(), file);
}

Result<ElfFacts> ReadElfFile(const std::filesystem::path& path, std::string_view named) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status{LoadReason::kIoError,
                  "cannot open " + path.string() + ": " + std::strerror(errno)};
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size == 0) {
    const int error = errno;
    close(fd);
    if (st.st_size == 0)
      return ReadElf({}, named);
    return Status{LoadReason::kIoError,
                  "cannot stat " + path.string() + ": " + std::strerror(error)};
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* image = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (image == MAP_FAILED)
    return Status{LoadReason::kIoError,
                  "cannot map " + path.string() + ": " + std::strerror(errno)};
  auto facts = ReadElf({static_cast<const std::byte*>(image), size}, named);
  munmap(image, size);
  return facts;
}

std::string Demangle(std::string_view symbol) {
  int status = 0;
  const std::string mangled(symbol);
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  if (status != 0 || demangled == nullptr)
    return mangled;
  return demangled.get();
}

std::string TbbTaskAdvice(const ElfFacts& facts) {
  if (facts.tbb_task_imports.empty())
    return "";
  std::string names;
  for (const std::string& symbol : facts.tbb_task_imports) {
    std::string name = Demangle(symbol);
    name = name.substr(0, name.find('('));  // the overload does not matter here
    if (names.find(name) == std::string::npos)
      names += (names.empty() ? "" : ", ") + name;
  }
  return "instantiates TBB's task templates itself (imports " + names +
         "): a worker can still be in this library's code after its waits return, so the host "
         "runs its calls in an arena of its own and unloads it only once no thread is inside; "
         "run parallel work through the host's IHost instead (SDK 1.2, IBackend::SetHost; "
         "docs/backend-authors.md, Parallel work)";
}

}  // namespace backplane::loader
