#include "backplane/loader/digest.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "file_descriptor.hpp"

namespace backplane::loader {

Result<std::string> Sha256OfFile(const std::filesystem::path& file) {
  auto io_error = [&](const char* what) {
    return Status{LoadReason::kIoError, std::string("cannot ") + what + " " + file.string() + ": " +
                                            std::strerror(errno)};
  };
  const FileDescriptor fd(open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0)
    return io_error("open");

  const std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(),
                                                                   EVP_MD_CTX_free);
  if (context == nullptr || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1)
    return Status{LoadReason::kIoError, "cannot start a SHA-256 digest (OpenSSL)"};
  unsigned char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return io_error("read");
    }
    EVP_DigestUpdate(context.get(), buffer, static_cast<std::size_t>(n));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace backplane::loader
