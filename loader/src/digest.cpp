#include "backplane/loader/digest.hpp"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "file_descriptor.hpp"

namespace backplane::loader {

namespace {

// SHA-256 fed piece by piece. Thread-compatible.
class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    // Only fails without memory, where nothing else would work either.
    if (context_ == nullptr || EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) != 1)
      std::abort();
  }
  void Update(const void* data, std::size_t size) { EVP_DigestUpdate(context_.get(), data, size); }
  std::string HexDigest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(context_.get(), digest, &length);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    hex.reserve(2 * length);
    for (unsigned int i = 0; i < length; ++i) {
      hex += kHex[digest[i] >> 4];
      hex += kHex[digest[i] & 0xf];
    }
    return hex;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context_;
};

}  // namespace

std::string Sha256Of(std::span<const std::byte> bytes) {
  Sha256 digest;
  digest.Update(bytes.data(), bytes.size());
  return digest.HexDigest();
}

Result<std::string> Sha256OfFile(const std::filesystem::path& file) {
  struct ::stat st {};
  auto fd = OpenRegularFile(file, "file", FinalSymlink::kFollow, &st);
  if (!fd.ok())
    return std::move(fd).error();
  Sha256 digest;
  unsigned char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd->get(), buffer, sizeof buffer);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return Status{LoadReason::kIoError,
                    "cannot read " + file.string() + ": " + std::strerror(errno)};
    }
    digest.Update(buffer, static_cast<std::size_t>(n));
  }
  return digest.HexDigest();
}

}  // namespace backplane::loader
