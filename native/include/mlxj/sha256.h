// SHA-256 and HMAC-SHA-256, for the connection handshake (no crypto library needed).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mlxj {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t size);
Digest hmac_sha256(const std::string& key, const void* msg, size_t size);
// Constant-time comparison, so a stranger learns nothing from timing.
bool digest_equal(const Digest& a, const Digest& b);

}  // namespace mlxj
