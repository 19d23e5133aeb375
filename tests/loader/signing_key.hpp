// An Ed25519 key pair made for a test: the public half in a PEM file, signing in memory.
#pragma once

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "test_util.hpp"

namespace backplane::testing {

class SigningKey {
 public:
  explicit SigningKey(const std::filesystem::path& public_pem)
      : key_(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"), EVP_PKEY_free) {
    EXPECT_NE(key_, nullptr);
    FILE* out = fopen(public_pem.c_str(), "w");
    EXPECT_NE(out, nullptr);
    EXPECT_EQ(PEM_write_PUBKEY(out, key_.get()), 1);
    fclose(out);
  }
  // Writes `file`'s signature to `signature_file`, as `openssl pkeyutl -sign -rawin` would.
  void Sign(const std::filesystem::path& file, const std::filesystem::path& signature_file) const {
    const std::string message = ReadFile(file);
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    ASSERT_EQ(EVP_DigestSignInit(context.get(), nullptr, nullptr, nullptr, key_.get()), 1);
    unsigned char signature[64];
    std::size_t length = sizeof signature;
    ASSERT_EQ(
        EVP_DigestSign(context.get(), signature, &length,
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()),
        1);
    WriteFile(signature_file, std::string_view(reinterpret_cast<const char*>(signature), length));
  }

 private:
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key_;
};

}  // namespace backplane::testing
