// Tests for InspectElf on ELF images synthesized byte by byte (one property changed per case) and
// on real files of the system. The synthesized images are ELF64 little-endian for the host
// machine, so these tests assume an x86-64 or AArch64 host, as the project does.
#include "backplane/loader/elf_inspector.hpp"

#include <elf.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.hpp"

namespace backplane::loader {
namespace {

::testing::AssertionResult Contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\ndoes not contain \"" << part << "\"";
}

#if defined(__aarch64__)
constexpr std::uint16_t kHostMachine = EM_AARCH64;
constexpr std::uint16_t kForeignMachine = EM_X86_64;
constexpr std::string_view kForeignMachineText = "machine 62 (x86-64)";
constexpr std::string_view kHostMachineText = "this host is AArch64";
#else
constexpr std::uint16_t kHostMachine = EM_X86_64;
constexpr std::uint16_t kForeignMachine = EM_AARCH64;
constexpr std::string_view kForeignMachineText = "machine 183 (AArch64)";
constexpr std::string_view kHostMachineText = "this host is x86-64";
#endif

constexpr std::string_view kPublishFix = "publish with write-temp + fsync + rename";

struct TestSymbol {
  std::string name;
  unsigned char bind = STB_GLOBAL;
  bool defined = true;
};

enum class HashKind { kSysv, kGnu };

// One property per field; the defaults describe an image InspectElf accepts.
struct ElfSpec {
  std::uint16_t type = ET_DYN;
  std::uint16_t machine = kHostMachine;
  std::vector<TestSymbol> symbols = {{"GetBackendId"}, {"GetVersion"}, {"BackendFactory"}};
  bool nodelete = false;
  bool gnu_stack = true;
  std::uint32_t stack_flags = PF_R | PF_W;
  std::vector<std::uint8_t> build_id = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  bool section_headers = true;
  HashKind hash = HashKind::kSysv;
  // 8: the note segment is 8-aligned and starts with a GNU property note whose padding differs
  // between 4- and 8-byte note alignment.
  std::size_t note_alignment = 4;
};

// Where the builder put things, for tests that damage one of them.
struct ElfLayout {
  std::size_t load_end = 0;  // end of the single PT_LOAD, which starts at offset 0
  std::size_t dynsym_offset = 0;
  std::size_t dynsym_size = 0;
  std::size_t dynstr_offset = 0;
  std::size_t dynstr_size = 0;
  std::size_t note_offset = 0;  // of the build-id note
  std::size_t dynamic_offset = 0;
  std::size_t shoff = 0;
  int load_phdr = -1, dynamic_phdr = -1, note_phdr = -1, stack_phdr = -1;
  int dynsym_section = -1, dynstr_section = -1;
};

struct BuiltElf {
  std::vector<std::byte> bytes;
  ElfLayout layout;

  std::span<const std::byte> span() const { return bytes; }
};

class ByteWriter {
 public:
  std::size_t size() const { return bytes_.size(); }
  std::size_t Align(std::size_t alignment) {
    while (bytes_.size() % alignment != 0)
      bytes_.push_back(std::byte{0});
    return bytes_.size();
  }
  std::size_t AppendRaw(const void* data, std::size_t size) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + size);
    if (size != 0)
      std::memcpy(bytes_.data() + at, data, size);
    return at;
  }
  template <typename T>
  std::size_t Append(const T& value) {
    return AppendRaw(&value, sizeof(T));
  }
  template <typename T>
  void Put(std::size_t at, const T& value) {
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
  }
  std::vector<std::byte> Take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// A minimal ELF64 ET_DYN image laid out like ld's output: header, program headers, build-id note,
// .dynsym, .dynstr, hash table, .dynamic (all in one PT_LOAD whose addresses equal file offsets),
// then .shstrtab and the section header table.
BuiltElf BuildElf(const ElfSpec& spec) {
  BuiltElf out;
  ElfLayout& layout = out.layout;
  ByteWriter w;
  w.Append(Elf64_Ehdr{});

  int phnum = 0;
  layout.load_phdr = phnum++;
  layout.dynamic_phdr = phnum++;
  if (!spec.build_id.empty())
    layout.note_phdr = phnum++;
  if (spec.gnu_stack)
    layout.stack_phdr = phnum++;
  const std::size_t phoff = w.size();
  for (int i = 0; i < phnum; ++i)
    w.Append(Elf64_Phdr{});

  std::size_t note_start = 0;
  std::size_t note_size = 0;
  if (!spec.build_id.empty()) {
    note_start = w.Align(spec.note_alignment);
    if (spec.note_alignment == 8) {
      w.Append(Elf64_Nhdr{4, 4, NT_GNU_PROPERTY_TYPE_0});
      w.AppendRaw("GNU", 4);
      w.Append(std::uint32_t{0xfeedface});
      w.Align(8);
    }
    layout.note_offset = w.size();
    w.Append(Elf64_Nhdr{4, static_cast<Elf64_Word>(spec.build_id.size()), NT_GNU_BUILD_ID});
    w.AppendRaw("GNU", 4);
    w.AppendRaw(spec.build_id.data(), spec.build_id.size());
    note_size = w.Align(spec.note_alignment) - note_start;
  }

  std::string dynstr(1, '\0');
  std::vector<Elf64_Word> name_offsets;
  for (const TestSymbol& symbol : spec.symbols) {
    name_offsets.push_back(static_cast<Elf64_Word>(dynstr.size()));
    dynstr += symbol.name;
    dynstr += '\0';
  }
  constexpr std::uint16_t kDynamicSection = 4;  // any defined section will do
  layout.dynsym_offset = w.Align(8);
  w.Append(Elf64_Sym{});
  for (std::size_t i = 0; i < spec.symbols.size(); ++i) {
    Elf64_Sym sym{};
    sym.st_name = name_offsets[i];
    sym.st_info = ELF64_ST_INFO(spec.symbols[i].bind, STT_OBJECT);
    sym.st_shndx = spec.symbols[i].defined ? kDynamicSection : SHN_UNDEF;
    sym.st_value = spec.symbols[i].defined ? 0x1000 : 0;
    w.Append(sym);
  }
  const std::uint32_t nsyms = static_cast<std::uint32_t>(spec.symbols.size() + 1);
  layout.dynsym_size = w.size() - layout.dynsym_offset;
  layout.dynstr_offset = w.AppendRaw(dynstr.data(), dynstr.size());
  layout.dynstr_size = dynstr.size();

  const std::size_t hash_offset = w.Align(8);
  if (spec.hash == HashKind::kSysv) {
    w.Append(std::uint32_t{1});  // nbucket
    w.Append(nsyms);             // nchain: the symbol count
    w.Append(std::uint32_t{0});  // bucket[0]
    for (std::uint32_t i = 0; i < nsyms; ++i)
      w.Append(std::uint32_t{0});
  } else {
    const std::uint32_t symoffset = 1;
    w.Append(std::uint32_t{1});  // nbuckets
    w.Append(symoffset);
    w.Append(std::uint32_t{1});  // bloom_size
    w.Append(std::uint32_t{6});  // bloom_shift
    w.Append(~std::uint64_t{0});
    w.Append(std::uint32_t{nsyms > symoffset ? symoffset : 0});
    for (std::uint32_t i = symoffset; i < nsyms; ++i) {
      w.Append(std::uint32_t{i + 1 == nsyms ? 1u : 0u});  // low bit ends the chain
    }
  }
  const std::size_t hash_size = w.size() - hash_offset;

  const std::size_t dynamic_offset = layout.dynamic_offset = w.Align(8);
  auto dyn = [&w](std::int64_t tag, std::uint64_t value) {
    Elf64_Dyn entry{};
    entry.d_tag = tag;
    entry.d_un.d_val = value;
    w.Append(entry);
  };
  dyn(spec.hash == HashKind::kSysv ? DT_HASH : DT_GNU_HASH, hash_offset);
  dyn(DT_SYMTAB, layout.dynsym_offset);
  dyn(DT_STRTAB, layout.dynstr_offset);
  dyn(DT_STRSZ, layout.dynstr_size);
  dyn(DT_SYMENT, sizeof(Elf64_Sym));
  if (spec.nodelete)
    dyn(DT_FLAGS_1, DF_1_NODELETE | DF_1_NOW);
  dyn(DT_NULL, 0);
  const std::size_t dynamic_size = w.size() - dynamic_offset;
  layout.load_end = w.size();

  std::vector<Elf64_Shdr> sections;
  std::string shstrtab(1, '\0');
  auto section = [&](const char* name, Elf64_Word type, std::size_t offset, std::size_t size,
                     Elf64_Word link, std::size_t entsize, std::size_t align, Elf64_Word info = 0) {
    Elf64_Shdr sh{};
    sh.sh_name = static_cast<Elf64_Word>(shstrtab.size());
    shstrtab += name;
    shstrtab += '\0';
    sh.sh_type = type;
    sh.sh_flags = type == SHT_STRTAB && std::strcmp(name, ".shstrtab") == 0 ? 0 : SHF_ALLOC;
    sh.sh_addr = sh.sh_flags ? offset : 0;
    sh.sh_offset = offset;
    sh.sh_size = size;
    sh.sh_link = link;
    sh.sh_info = info;
    sh.sh_entsize = entsize;
    sh.sh_addralign = align;
    sections.push_back(sh);
    return static_cast<int>(sections.size() - 1);
  };
  sections.push_back(Elf64_Shdr{});
  layout.dynsym_section =
      section(".dynsym", SHT_DYNSYM, layout.dynsym_offset, layout.dynsym_size, 2, 24, 8, 1);
  layout.dynstr_section =
      section(".dynstr", SHT_STRTAB, layout.dynstr_offset, layout.dynstr_size, 0, 0, 1);
  section(spec.hash == HashKind::kSysv ? ".hash" : ".gnu.hash",
          spec.hash == HashKind::kSysv ? SHT_HASH : SHT_GNU_HASH, hash_offset, hash_size, 1,
          spec.hash == HashKind::kSysv ? 4 : 0, 8);
  section(".dynamic", SHT_DYNAMIC, dynamic_offset, dynamic_size, 2, sizeof(Elf64_Dyn), 8);
  if (!spec.build_id.empty()) {
    section(".note.gnu.build-id", SHT_NOTE, note_start, note_size, 0, 0, spec.note_alignment);
  }
  const int shstrndx = section(".shstrtab", SHT_STRTAB, 0, 0, 0, 0, 1);

  Elf64_Ehdr ehdr{};
  std::memcpy(ehdr.e_ident, ELFMAG, SELFMAG);
  ehdr.e_ident[EI_CLASS] = ELFCLASS64;
  ehdr.e_ident[EI_DATA] = ELFDATA2LSB;
  ehdr.e_ident[EI_VERSION] = EV_CURRENT;
  // ld marks objects with STB_GNU_UNIQUE symbols as GNU/Linux ABI.
  const bool has_unique = std::any_of(spec.symbols.begin(), spec.symbols.end(),
                                      [](const TestSymbol& s) { return s.bind == STB_GNU_UNIQUE; });
  ehdr.e_ident[EI_OSABI] = has_unique ? ELFOSABI_GNU : ELFOSABI_SYSV;
  ehdr.e_type = spec.type;
  ehdr.e_machine = spec.machine;
  ehdr.e_version = EV_CURRENT;
  ehdr.e_phoff = phoff;
  ehdr.e_ehsize = sizeof(Elf64_Ehdr);
  ehdr.e_phentsize = sizeof(Elf64_Phdr);
  ehdr.e_phnum = static_cast<Elf64_Half>(phnum);
  ehdr.e_shentsize = sizeof(Elf64_Shdr);
  if (spec.section_headers) {
    const std::size_t shstrtab_offset = w.AppendRaw(shstrtab.data(), shstrtab.size());
    sections[shstrndx].sh_offset = shstrtab_offset;
    sections[shstrndx].sh_size = shstrtab.size();
    layout.shoff = w.Align(8);
    for (const Elf64_Shdr& sh : sections)
      w.Append(sh);
    ehdr.e_shoff = layout.shoff;
    ehdr.e_shnum = static_cast<Elf64_Half>(sections.size());
    ehdr.e_shstrndx = static_cast<Elf64_Half>(shstrndx);
  }
  w.Put(0, ehdr);

  auto phdr = [&](int index, Elf64_Word type, Elf64_Word flags, std::size_t offset,
                  std::size_t size, std::size_t align) {
    Elf64_Phdr ph{};
    ph.p_type = type;
    ph.p_flags = flags;
    ph.p_offset = offset;
    ph.p_vaddr = ph.p_paddr = offset;
    ph.p_filesz = ph.p_memsz = size;
    ph.p_align = align;
    w.Put(phoff + index * sizeof(Elf64_Phdr), ph);
  };
  phdr(layout.load_phdr, PT_LOAD, PF_R | PF_W, 0, layout.load_end, 0x1000);
  phdr(layout.dynamic_phdr, PT_DYNAMIC, PF_R | PF_W, dynamic_offset, dynamic_size, 8);
  if (layout.note_phdr >= 0)
    phdr(layout.note_phdr, PT_NOTE, PF_R, note_start, note_size, spec.note_alignment);
  if (layout.stack_phdr >= 0)
    phdr(layout.stack_phdr, PT_GNU_STACK, spec.stack_flags, 0, 0, 16);

  out.bytes = w.Take();
  return out;
}

template <typename T>
T Get(const std::vector<std::byte>& bytes, std::size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

template <typename T>
void Set(std::vector<std::byte>& bytes, std::size_t at, const T& value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

template <typename Edit>
void EditEhdr(BuiltElf& elf, Edit edit) {
  auto ehdr = Get<Elf64_Ehdr>(elf.bytes, 0);
  edit(ehdr);
  Set(elf.bytes, 0, ehdr);
}

template <typename Edit>
void EditPhdr(BuiltElf& elf, int index, Edit edit) {
  const std::size_t at = Get<Elf64_Ehdr>(elf.bytes, 0).e_phoff + index * sizeof(Elf64_Phdr);
  auto phdr = Get<Elf64_Phdr>(elf.bytes, at);
  edit(phdr);
  Set(elf.bytes, at, phdr);
}

template <typename Edit>
void EditShdr(BuiltElf& elf, int index, Edit edit) {
  const std::size_t at = elf.layout.shoff + index * sizeof(Elf64_Shdr);
  auto shdr = Get<Elf64_Shdr>(elf.bytes, at);
  edit(shdr);
  Set(elf.bytes, at, shdr);
}

std::span<const std::byte> AsBytes(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

std::optional<std::vector<std::byte>> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return std::nullopt;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty())
    std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The path of a library this test process has loaded, e.g. "libm.so.6", as the dynamic linker
// found it.
std::optional<std::string> LoadedLibraryPath(std::string_view soname) {
  struct Search {
    std::string_view soname;
    std::optional<std::string> path;
  } search{soname, std::nullopt};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        if (std::filesystem::path(name).filename() == s->soname) {
          s->path = std::string(name);
          return 1;
        }
        return 0;
      },
      &search);
  return search.path;
}

// Build id of a loaded library, read from its mapped PT_NOTE segments rather than from its file.
std::string MappedBuildId(std::string_view path) {
  struct Search {
    std::string_view path;
    std::string build_id;
  } search{path, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (!info->dlpi_name || s->path != info->dlpi_name)
          return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE)
            continue;
          const auto* notes = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
          const std::size_t align = ph.p_align == 8 ? 8 : 4;
          auto up = [align](std::size_t v) { return (v + align - 1) / align * align; };
          for (std::size_t at = 0; at + sizeof(ElfW(Nhdr)) <= ph.p_memsz;) {
            ElfW(Nhdr) note;
            std::memcpy(&note, notes + at, sizeof(note));
            const std::size_t desc = up(at + sizeof(note) + note.n_namesz);
            if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4) {
              char hex[3];
              for (std::size_t j = 0; j < note.n_descsz; ++j) {
                std::snprintf(hex, sizeof(hex), "%02x", notes[desc + j]);
                s->build_id += hex;
              }
              return 1;
            }
            at = up(desc + note.n_descsz);
          }
        }
        return 1;
      },
      &search);
  return search.build_id;
}

constexpr const char* kLibm = "/lib/x86_64-linux-gnu/libm.so.6";
constexpr const char* kLibstdcxx = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";

// --- Synthesized images -------------------------------------------------------------------------

TEST(ElfInspectorTest, AcceptsMinimalSharedObject) {
  const BuiltElf elf = BuildElf({});
  const auto result = InspectElf(elf.span(), "vendor_cpu_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "0123456789abcdef");
}

TEST(ElfInspectorTest, ReportsBuildIdBytesAsLowerCaseHex) {
  ElfSpec spec;
  spec.build_id = {0xde, 0xad, 0xBE, 0xEF, 0x00, 0x0a, 0xff, 0x10, 0x7f, 0x80,
                   0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0xfe};
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "deadbeef000aff107f80010203040506070809fe");
}

TEST(ElfInspectorTest, ReportsEmptyBuildIdWhenThereIsNone) {
  ElfSpec spec;
  spec.build_id.clear();
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "");
}

TEST(ElfInspectorTest, FindsBuildIdInSectionWhenSegmentHasNone) {
  BuiltElf elf = BuildElf({});
  // Turn the PT_NOTE into a PT_NULL; the SHT_NOTE section still holds the note.
  EditPhdr(elf, elf.layout.note_phdr, [](Elf64_Phdr& ph) { ph.p_type = PT_NULL; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "0123456789abcdef");
}

TEST(ElfInspectorTest, FindsBuildIdAfterNoteInEightByteAlignedSegment) {
  ElfSpec spec;
  spec.note_alignment = 8;
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "0123456789abcdef");
}

TEST(ElfInspectorTest, IgnoresBuildIdNoteWithOtherOwner) {
  BuiltElf elf = BuildElf({});
  Set(elf.bytes, elf.layout.note_offset + sizeof(Elf64_Nhdr), std::array<char, 4>{'X', 'Y', 'Z'});
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "");
}

TEST(ElfInspectorTest, IgnoresNoteWhoseDescriptorRunsPastItsSegment) {
  BuiltElf elf = BuildElf({});
  Set(elf.bytes, elf.layout.note_offset + 4, Elf64_Word{0x7fffffff});  // n_descsz
  EditShdr(elf, 5, [](Elf64_Shdr& sh) { sh.sh_type = SHT_PROGBITS; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id, "");
}

TEST(ElfInspectorTest, RejectsNodelete) {
  ElfSpec spec;
  spec.nodelete = true;
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_EQ(result.error().message(),
            "acme_npu_backend.so is linked with -z nodelete (DF_1_NODELETE): glibc would never "
            "unmap it, so it could not be replaced; remove -z nodelete (backplane_add_backend() "
            "never sets it)");
}

TEST(ElfInspectorTest, IgnoresDynamicEntriesAfterNull) {
  ElfSpec spec;
  spec.nodelete = true;
  BuiltElf elf = BuildElf(spec);
  // The linker pads .dynamic with DT_NULL entries; the dynamic linker stops at the first one.
  // Move the terminator in front of DT_FLAGS_1 (the entry before it is DT_SYMENT).
  std::size_t at = elf.layout.dynamic_offset;
  while (Get<Elf64_Dyn>(elf.bytes, at).d_tag != DT_FLAGS_1)
    at += sizeof(Elf64_Dyn);
  Set(elf.bytes, at - sizeof(Elf64_Dyn), Elf64_Dyn{});
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  EXPECT_TRUE(result.ok()) << result.error().ToString();
}

TEST(ElfInspectorTest, RejectsGnuUniqueSymbol) {
  ElfSpec spec;
  spec.symbols.push_back({"_ZGVZN4acme8RegistryEvE8instance", STB_GNU_UNIQUE, true});
  spec.symbols.push_back({"_ZN4acme5OtherE", STB_GNU_UNIQUE, true});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  // Every one named, demangled: the author has to fix each.
  EXPECT_EQ(result.error().message(),
            "acme_npu_backend.so defines 2 STB_GNU_UNIQUE symbols (guard variable for "
            "acme::Registry()::instance, acme::Other): glibc would never unmap it and a new "
            "version would bind to this version's objects; build with -fno-gnu-unique or "
            "backplane_add_backend()");
}

TEST(ElfInspectorTest, AcceptsUndefinedGnuUniqueReference) {
  ElfSpec spec;
  spec.symbols.push_back({"_ZN4acme5OtherE", STB_GNU_UNIQUE, false});
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  EXPECT_TRUE(result.ok()) << result.error().ToString();
}

TEST(ElfInspectorTest, RejectsCxaThreadAtexitImport) {
  ElfSpec spec;
  spec.symbols.push_back({"__cxa_thread_atexit", STB_GLOBAL, false});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_EQ(result.error().message(),
            "acme_npu_backend.so imports __cxa_thread_atexit: a thread_local object with a "
            "non-trivial destructor pins the library while any thread lives; make thread_local "
            "data trivially destructible or keep it in the backend instance");
}

TEST(ElfInspectorTest, RejectsCxaThreadAtexitImplImport) {
  ElfSpec spec;
  spec.symbols.push_back({"__cxa_thread_atexit_impl", STB_WEAK, false});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), "imports __cxa_thread_atexit_impl: "));
  EXPECT_TRUE(Contains(result.error().message(), "make thread_local data trivially destructible"));
}

TEST(ElfInspectorTest, AcceptsDefinedCxaThreadAtexitAndSimilarImports) {
  ElfSpec spec;
  spec.symbols.push_back({"__cxa_thread_atexit", STB_GLOBAL, true});
  spec.symbols.push_back({"__cxa_thread_atexit_impl2", STB_GLOBAL, false});
  spec.symbols.push_back({"__cxa_thread_atexi", STB_GLOBAL, false});
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  EXPECT_TRUE(result.ok()) << result.error().ToString();
}

// Rule 5: importing the libtbb entry points through which TBB's task templates submit tasks is
// the evidence that a library has those templates compiled in. Loadable, but reported, and what
// only asks TBB a question (max_concurrency) or defines such a name does not count.
TEST(ElfInspectorTest, ReportsImportsThatSubmitTbbTasks) {
  ElfSpec spec;
  spec.symbols.push_back(
      {"_ZN3tbb6detail2r15spawnERNS0_2d14taskERNS2_18task_group_contextE", STB_GLOBAL, false});
  spec.symbols.push_back(
      {"_ZN3tbb6detail2r116execute_and_waitERNS0_2d14taskERNS2_18task_group_"
       "contextERNS2_12wait_contextES6_",
       STB_GLOBAL, false});
  spec.symbols.push_back(
      {"_ZN3tbb6detail2r115max_concurrencyEPKNS0_2d115task_arena_baseE", STB_GLOBAL, false});
  spec.symbols.push_back({"_ZN3tbb6detail2r17enqueueERNS0_2d14taskEPNS2_15task_arena_baseE",
                          STB_GLOBAL, true});  // defined here: not an import
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->tbb_task_imports.size(), 2u);
  const std::string advice = TbbTaskAdvice(result.value());
  EXPECT_TRUE(Contains(advice,
                       "instantiates TBB's task templates itself (imports "
                       "tbb::detail::r1::spawn, tbb::detail::r1::execute_and_wait): "));
  EXPECT_TRUE(Contains(advice, "run parallel work through the host's IHost instead"));

  ElfSpec question;
  question.symbols.push_back(
      {"_ZN3tbb6detail2r115max_concurrencyEPKNS0_2d115task_arena_baseE", STB_GLOBAL, false});
  const auto asks = InspectElf(BuildElf(question).span(), "acme_npu_backend.so");
  ASSERT_TRUE(asks.ok());
  EXPECT_TRUE(asks->tbb_task_imports.empty());
  EXPECT_EQ(TbbTaskAdvice(asks.value()), "");
}

TEST(ElfInspectorTest, RejectsExecutableStack) {
  ElfSpec spec;
  spec.stack_flags = PF_R | PF_W | PF_X;
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_EQ(result.error().message(),
            "acme_npu_backend.so requires an executable stack (PT_GNU_STACK is RWX): loading it "
            "would make every thread stack executable, which unloading cannot undo; link with -z "
            "noexecstack");
}

TEST(ElfInspectorTest, RejectsMissingGnuStackHeader) {
  ElfSpec spec;
  spec.gnu_stack = false;
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), "has no PT_GNU_STACK header"));
  EXPECT_TRUE(Contains(result.error().message(), "link with -z noexecstack"));
}

TEST(ElfInspectorTest, ReportsEveryReasonItCannotBeUnloaded) {
  ElfSpec spec;
  spec.nodelete = true;
  spec.stack_flags = PF_R | PF_W | PF_X;
  spec.symbols.push_back({"__cxa_thread_atexit_impl", STB_WEAK, false});
  spec.symbols.push_back({"_ZN4acme5OtherE", STB_GNU_UNIQUE, true});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  const std::string& message = result.error().message();
  EXPECT_EQ(message.find("acme_npu_backend.so is linked with -z nodelete"), 0u) << message;
  EXPECT_TRUE(Contains(message, "; it also defines 1 STB_GNU_UNIQUE symbol (acme::Other)"));
  EXPECT_TRUE(Contains(message, "; it also imports __cxa_thread_atexit_impl"));
  EXPECT_TRUE(Contains(message, "; it also requires an executable stack"));
}

TEST(ElfInspectorTest, FindsGnuUniqueWithoutSectionHeadersThroughSysvHash) {
  ElfSpec spec;
  spec.section_headers = false;
  spec.hash = HashKind::kSysv;
  spec.symbols.push_back({"_ZN4acme5OtherE", STB_GNU_UNIQUE, true});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), "defines 1 STB_GNU_UNIQUE symbol (acme::Other)"));
}

TEST(ElfInspectorTest, FindsGnuUniqueWithoutSectionHeadersThroughGnuHash) {
  ElfSpec spec;
  spec.section_headers = false;
  spec.hash = HashKind::kGnu;
  // Last in the table, so only a correct walk to the end of the chain finds it.
  spec.symbols.push_back({"_ZN4acme5OtherE", STB_GNU_UNIQUE, true});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), "defines 1 STB_GNU_UNIQUE symbol (acme::Other)"));
}

TEST(ElfInspectorTest, FindsImportWithoutSectionHeadersThroughGnuHash) {
  ElfSpec spec;
  spec.section_headers = false;
  spec.hash = HashKind::kGnu;
  spec.symbols.push_back({"__cxa_thread_atexit", STB_GLOBAL, false});
  const auto result = InspectElf(BuildElf(spec).span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), "imports __cxa_thread_atexit:"));
}

TEST(ElfInspectorTest, AcceptsCleanImageWithoutSectionHeaders) {
  for (HashKind hash : {HashKind::kSysv, HashKind::kGnu}) {
    ElfSpec spec;
    spec.section_headers = false;
    spec.hash = hash;
    const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
    ASSERT_TRUE(result.ok()) << result.error().ToString();
    EXPECT_EQ(result->build_id, "0123456789abcdef");
  }
}

TEST(ElfInspectorTest, RejectsDynamicSymbolTableOutsideLoadSegments) {
  ElfSpec spec;
  spec.section_headers = false;
  BuiltElf elf = BuildElf(spec);
  // Shrink PT_LOAD so that DT_SYMTAB's address is no longer backed by the file.
  EditPhdr(elf, elf.layout.load_phdr,
           [&](Elf64_Phdr& ph) { ph.p_filesz = elf.layout.dynsym_offset; });
  const auto result = InspectElf(elf.span(), "acme_npu_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotElf);
  EXPECT_TRUE(Contains(result.error().message(), "is a corrupt ELF file"));
}

TEST(ElfInspectorTest, RejectsEmptyFile) {
  const auto result = InspectElf({}, "empty_x_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotElf);
  EXPECT_TRUE(
      Contains(result.error().message(), "empty_x_backend.so is not an ELF file (bad magic)"));
}

TEST(ElfInspectorTest, RejectsThreeBytesOfMagic) {
  const auto result = InspectElf(AsBytes("\x7f"
                                         "EL"),
                                 "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotElf);
}

TEST(ElfInspectorTest, RejectsTextFile) {
  const auto result =
      InspectElf(AsBytes("#!/bin/sh\necho this is not a library\n"), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotElf);
  EXPECT_TRUE(Contains(result.error().message(), "a_b_backend.so is not an ELF file (bad magic)"));
  EXPECT_TRUE(Contains(result.error().message(), "backplane_add_backend()"));
}

TEST(ElfInspectorTest, RejectsMagicOnly) {
  const auto result = InspectElf(AsBytes("\x7f"
                                         "ELF"),
                                 "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_EQ(result.error().message(),
            "a_b_backend.so is truncated: the ELF identification ends at byte 16 but the file has "
            "4 bytes; a deploy still being written? publish with write-temp + fsync + rename");
}

TEST(ElfInspectorTest, RejectsTruncatedHeader) {
  const BuiltElf elf = BuildElf({});
  const auto result = InspectElf(elf.span().first(40), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_EQ(result.error().message(),
            "a_b_backend.so is truncated: the ELF header ends at byte 64 but the file has 40 "
            "bytes; a deploy still being written? publish with write-temp + fsync + rename");
}

TEST(ElfInspectorTest, RejectsProgramHeadersPastEnd) {
  BuiltElf elf = BuildElf({});
  const std::size_t size = elf.bytes.size();
  EditEhdr(elf, [&](Elf64_Ehdr& e) { e.e_phoff = size - 8; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(),
                       "the program header table ends at byte " +
                           std::to_string(size - 8 + 4 * sizeof(Elf64_Phdr)) +
                           " but the file has " + std::to_string(size) + " bytes"));
  EXPECT_TRUE(Contains(result.error().message(), kPublishFix));
}

TEST(ElfInspectorTest, RejectsSectionHeadersPastEnd) {
  const BuiltElf elf = BuildElf({});
  const auto result = InspectElf(elf.span().first(elf.bytes.size() - 1), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(), "the section header table ends at byte " +
                                                     std::to_string(elf.bytes.size())));
}

TEST(ElfInspectorTest, RejectsLoadSegmentPastEnd) {
  BuiltElf elf = BuildElf({});
  const std::size_t size = elf.bytes.size();
  EditPhdr(elf, elf.layout.load_phdr, [&](Elf64_Phdr& ph) { ph.p_filesz = size + 100; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_EQ(result.error().message(),
            "a_b_backend.so is truncated: program header 0 (PT_LOAD) ends at byte " +
                std::to_string(size + 100) + " but the file has " + std::to_string(size) +
                " bytes; a deploy still being written? publish with write-temp + fsync + rename");
}

TEST(ElfInspectorTest, RejectsSegmentWhoseEndOverflows) {
  BuiltElf elf = BuildElf({});
  EditPhdr(elf, elf.layout.dynamic_phdr, [](Elf64_Phdr& ph) {
    ph.p_offset = ~std::uint64_t{0} - 7;
    ph.p_filesz = 16;
  });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(),
                       "program header 1 (PT_DYNAMIC) ends beyond byte 18446744073709551615"));
}

TEST(ElfInspectorTest, RejectsNoteSegmentPastEnd) {
  BuiltElf elf = BuildElf({});
  EditPhdr(elf, elf.layout.note_phdr, [](Elf64_Phdr& ph) { ph.p_offset = 1 << 20; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(), "program header 2 (PT_NOTE) ends at byte"));
}

TEST(ElfInspectorTest, RejectsDynsymPastEnd) {
  BuiltElf elf = BuildElf({});
  EditShdr(elf, elf.layout.dynsym_section, [](Elf64_Shdr& sh) { sh.sh_size = 24 << 20; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(),
                       "the dynamic symbol table (.dynsym, section 1) ends at byte " +
                           std::to_string(elf.layout.dynsym_offset + (24 << 20))));
}

TEST(ElfInspectorTest, RejectsDynstrPastEnd) {
  BuiltElf elf = BuildElf({});
  EditShdr(elf, elf.layout.dynstr_section, [](Elf64_Shdr& sh) { sh.sh_offset = 1 << 30; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
  EXPECT_TRUE(Contains(result.error().message(), "the string table of .dynsym (section 2)"));
}

TEST(ElfInspectorTest, RejectsEveryProperPrefixOfAnImage) {
  const BuiltElf elf = BuildElf({});
  for (std::size_t size = 0; size < elf.bytes.size(); ++size) {
    const auto result = InspectElf(elf.span().first(size), "a_b_backend.so");
    ASSERT_FALSE(result.ok()) << "prefix of " << size << " bytes was accepted";
    const auto reason = result.error().reason();
    EXPECT_TRUE(reason == (size < 4 ? LoadReason::kNotElf : LoadReason::kElfTruncated))
        << size << ": " << result.error().ToString();
  }
}

TEST(ElfInspectorTest, RejectsWrongProgramHeaderEntrySize) {
  BuiltElf elf = BuildElf({});
  EditEhdr(elf, [](Elf64_Ehdr& e) { e.e_phentsize = 32; });
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotElf);
  EXPECT_TRUE(Contains(result.error().message(),
                       "is a corrupt ELF file: e_phentsize is 32 but must be 56"));
}

TEST(ElfInspectorTest, Rejects32BitClass) {
  BuiltElf elf = BuildElf({});
  elf.bytes[EI_CLASS] = std::byte{ELFCLASS32};
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(),
                       "a_b_backend.so is a 32-bit ELF file (ELFCLASS32) but this host is 64-bit"));
}

TEST(ElfInspectorTest, RejectsBigEndian) {
  BuiltElf elf = BuildElf({});
  elf.bytes[EI_DATA] = std::byte{ELFDATA2MSB};
  const auto result = InspectElf(elf.span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(),
                       "is big-endian (ELFDATA2MSB) but this host is little-endian"));
}

TEST(ElfInspectorTest, RejectsForeignMachine) {
  ElfSpec spec;
  spec.machine = kForeignMachine;
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_EQ(result.error().message(),
            "a_b_backend.so is built for " + std::string(kForeignMachineText) + " but " +
                std::string(kHostMachineText) + "; rebuild the backend for this host");
}

TEST(ElfInspectorTest, RejectsExecutable) {
  ElfSpec spec;
  spec.type = ET_EXEC;
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(),
                       "is an executable (ET_EXEC), not a shared object (ET_DYN); link the "
                       "backend with -shared"));
}

TEST(ElfInspectorTest, RejectsRelocatableObject) {
  ElfSpec spec;
  spec.type = ET_REL;
  const auto result = InspectElf(BuildElf(spec).span(), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(), "is a relocatable object file (ET_REL)"));
}

TEST(ElfInspectorTest, ReportsTruncationBeforeWrongMachine) {
  ElfSpec spec;
  spec.machine = kForeignMachine;
  const BuiltElf elf = BuildElf(spec);
  const auto result = InspectElf(elf.span().first(elf.bytes.size() / 2), "a_b_backend.so");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kElfTruncated);
}

// --- Real files ---------------------------------------------------------------------------------

TEST(ElfInspectorTest, AcceptsLibmWithItsBuildId) {
  const std::optional<std::string> path = LoadedLibraryPath("libm.so.6");
  if (!path) {
    // The test binary links libstdc++, which needs libm: only a foreign system lacks it.
    if (::backplane::testing::RunningInCi())
      FAIL() << "libm.so.6 is not loaded in this process (CI=true: tests never skip)";
    GTEST_SKIP() << "libm.so.6 is not loaded in this process";
  }
  const auto bytes = ReadFile(*path);
  ASSERT_TRUE(bytes) << *path;
  const auto result = InspectElf(*bytes, *path);
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id.size(), 40u) << result->build_id;
  EXPECT_EQ(result->build_id, MappedBuildId(*path));
}

TEST(ElfInspectorTest, RejectsLibstdcxxForGnuUniqueSymbols) {
  const auto bytes = ReadFile(kLibstdcxx);
  BACKPLANE_REQUIRE_PATH(kLibstdcxx);
  ASSERT_TRUE(bytes) << kLibstdcxx << " cannot be read";
  const auto result = InspectElf(*bytes, kLibstdcxx);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  EXPECT_TRUE(Contains(result.error().message(), std::string(kLibstdcxx) + " defines "));
  // A hundred of them: the first sixteen named, the rest counted, with how to list them.
  EXPECT_TRUE(Contains(result.error().message(), "STB_GNU_UNIQUE symbols (std::"));
  EXPECT_TRUE(Contains(result.error().message(), " more; nm -DC --defined-only lists them"));
  EXPECT_TRUE(Contains(result.error().message(), "-fno-gnu-unique"));
  EXPECT_TRUE(Contains(result.error().message(), "it also imports __cxa_thread_atexit_impl"));
}

// Section headers are optional at run time; without them the dynamic symbol table is found through
// PT_DYNAMIC and counted by walking libstdc++'s real DT_GNU_HASH table.
void DropSectionHeaders(std::vector<std::byte>& bytes) {
  auto ehdr = Get<Elf64_Ehdr>(bytes, 0);
  ehdr.e_shoff = 0;
  ehdr.e_shnum = 0;
  ehdr.e_shstrndx = 0;
  Set(bytes, 0, ehdr);
}

TEST(ElfInspectorTest, RejectsLibstdcxxWithoutSectionHeaders) {
  auto bytes = ReadFile(kLibstdcxx);
  BACKPLANE_REQUIRE_PATH(kLibstdcxx);
  ASSERT_TRUE(bytes) << kLibstdcxx << " cannot be read";
  const auto with_sections = InspectElf(*bytes, kLibstdcxx);
  ASSERT_FALSE(with_sections.ok());
  DropSectionHeaders(*bytes);
  const auto result = InspectElf(*bytes, kLibstdcxx);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kNotUnloadable);
  // The same table read both ways: the same first GNU_UNIQUE symbol and the same import.
  EXPECT_EQ(result.error().message(), with_sections.error().message());
}

TEST(ElfInspectorTest, AcceptsLibmWithoutSectionHeaders) {
  auto bytes = ReadFile(kLibm);
  BACKPLANE_REQUIRE_PATH(kLibm);
  ASSERT_TRUE(bytes) << kLibm << " cannot be read";
  DropSectionHeaders(*bytes);
  const auto result = InspectElf(*bytes, kLibm);
  ASSERT_TRUE(result.ok()) << result.error().ToString();
  EXPECT_EQ(result->build_id.size(), 40u);
}

TEST(ElfInspectorTest, AcceptsPieExecutableAsSharedObject) {
  // A PIE is ET_DYN like a shared object; telling them apart is left to the missing entry points.
  const auto bytes = ReadFile("/bin/true");
  BACKPLANE_REQUIRE_PATH("/bin/true");
  ASSERT_TRUE(bytes) << "/bin/true cannot be read";
  const auto result = InspectElf(*bytes, "/bin/true");
  EXPECT_TRUE(result.ok()) << result.error().ToString();
}

TEST(ElfInspectorTest, RejectsEveryTruncationOfLibm) {
  const auto bytes = ReadFile(kLibm);
  BACKPLANE_REQUIRE_PATH(kLibm);
  ASSERT_TRUE(bytes) << kLibm << " cannot be read";
  const std::span<const std::byte> image(*bytes);
  const std::size_t size = image.size();
  ASSERT_TRUE(InspectElf(image, kLibm).ok());
  for (std::size_t length = 0; length < size; ++length) {
    const auto result = InspectElf(image.first(length), kLibm);
    ASSERT_FALSE(result.ok()) << "libm cut to " << length << " bytes was accepted";
    const LoadReason expected = length < 4 ? LoadReason::kNotElf : LoadReason::kElfTruncated;
    ASSERT_EQ(result.error().reason(), expected) << length << ": " << result.error().ToString();
  }
  const auto half = InspectElf(image.first(size / 2), kLibm);
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.error().message(),
            std::string(kLibm) + " is truncated: the section header table ends at byte " +
                std::to_string(size) + " but the file has " + std::to_string(size / 2) +
                " bytes; a deploy still being written? publish with write-temp + fsync + rename");
}

TEST(ElfInspectorTest, RejectsLibmWith32BitClass) {
  auto bytes = ReadFile(kLibm);
  BACKPLANE_REQUIRE_PATH(kLibm);
  ASSERT_TRUE(bytes) << kLibm << " cannot be read";
  (*bytes)[EI_CLASS] = std::byte{ELFCLASS32};
  const auto result = InspectElf(*bytes, kLibm);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(), "ELFCLASS32"));
}

TEST(ElfInspectorTest, RejectsLibmWithForeignMachine) {
  auto bytes = ReadFile(kLibm);
  BACKPLANE_REQUIRE_PATH(kLibm);
  ASSERT_TRUE(bytes) << kLibm << " cannot be read";
  Set(*bytes, offsetof(Elf64_Ehdr, e_machine), std::uint16_t{kForeignMachine});
  const auto result = InspectElf(*bytes, kLibm);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().reason(), LoadReason::kWrongArch);
  EXPECT_TRUE(Contains(result.error().message(), std::string(kForeignMachineText)));
  EXPECT_TRUE(Contains(result.error().message(), std::string(kHostMachineText)));
}

}  // namespace
}  // namespace backplane::loader
