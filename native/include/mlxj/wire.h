// What peers send during connection and link setup, and the pure functions that
// read it: bytes in, a checked value or nothing out (no I/O), so they can be fuzzed
// (native/fuzz) apart from the sockets that carry them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "mlxj/sha256.h"
#include "mlxj/transport.h"

namespace mlxj {

// --- Connection handshake (context.cpp): hello, greeting, answer, ok byte.
constexpr char kHandshakeMagic[8] = {'M', 'L', 'X', 'J', 'H', 'S', '0', '1'};
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloBytes = 8 + kNonceBytes;                // magic, initiator's nonce
constexpr size_t kGreetingBytes = 8 + kNonceBytes + 32;        // magic, acceptor's nonce, its MAC

struct ConnHeader {
  uint64_t group;
  uint32_t initiator, kind, index, world_size;
};
static_assert(sizeof(ConnHeader) == 24, "wire layout");
constexpr size_t kAnswerBytes = sizeof(ConnHeader) + 32;  // header, initiator's MAC

struct Hello {
  uint8_t nonce[kNonceBytes];
};
struct Greeting {
  uint8_t nonce[kNonceBytes];
  Digest mac;
};
struct Answer {
  ConnHeader header;
  Digest mac;
};

// Nothing unless `n` is the message's size and it starts with the handshake magic.
std::optional<Hello> parse_hello(const uint8_t* p, size_t n);
std::optional<Greeting> parse_greeting(const uint8_t* p, size_t n);
// Nothing unless `n` is kAnswerBytes (the MAC is checked by the caller).
std::optional<Answer> parse_answer(const uint8_t* p, size_t n);
// Why an authenticated header does not belong to a job of `world_size` ranks ("" if it does).
std::string answer_problem(const ConnHeader& h, int world_size);

// --- Message header (tcp_transport.cpp, shm_transport.cpp): checked by check_header().
std::optional<MsgHeader> parse_msg_header(const uint8_t* p, size_t n);

// --- Link setup (link_setup.cpp): offer, reply, segment info, ack.
constexpr uint32_t kLinkMagic = 0x4d4a4c4b;  // "MJLK"
constexpr size_t kLocatorBytes = 96;

struct LinkOffer {
  uint32_t magic, want_shm;
  uint8_t host[32];
};
struct LinkReply {
  uint32_t magic, ok;
};
struct SegmentInfo {
  uint32_t magic, length;
  char locator[kLocatorBytes];
  uint64_t ring_bytes;
};

std::optional<LinkOffer> parse_link_offer(const uint8_t* p, size_t n);
std::optional<LinkReply> parse_link_reply(const uint8_t* p, size_t n);
// The locator a segment info announces, if it is well formed and for rings of `ring_bytes`.
std::optional<std::string> parse_segment_info(const uint8_t* p, size_t n, uint64_t ring_bytes);

// --- Shared-memory locators (shm_transport.cpp): "<path>#<16 hex digits of nonce>".
struct Locator {
  std::string path;
  uint64_t nonce = 0;
  bool named = false;  // a POSIX shm name /mlxj.<uid>.<slot>; otherwise /proc/<pid>/fd/<n>
};
// Nothing unless the locator is one of the two shapes we create, for user `uid`; then `why` says what is wrong.
std::optional<Locator> parse_locator(const std::string& locator, unsigned uid, std::string* why = nullptr);

}  // namespace mlxj
