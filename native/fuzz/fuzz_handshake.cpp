// The connection handshake's messages as the acceptor and the initiator read them
// (context.cpp): hello, greeting, and the authenticated answer's header checks.
#include <algorithm>
#include <cstring>

#include "check.h"
#include "mlxj/wire.h"

using namespace mlxj;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Off the socket each message is read at its exact size; a stranger controls every byte.
  for (size_t n : {size, std::min(size, kHelloBytes), std::min(size, kGreetingBytes), std::min(size, kAnswerBytes)}) {
    bool magic = n >= 8 && std::memcmp(data, kHandshakeMagic, 8) == 0;
    auto hello = parse_hello(data, n);
    FUZZ_CHECK(bool(hello) == (n == kHelloBytes && magic));
    if (hello) FUZZ_CHECK(std::memcmp(hello->nonce, data + 8, kNonceBytes) == 0);
    auto greeting = parse_greeting(data, n);
    FUZZ_CHECK(bool(greeting) == (n == kGreetingBytes && magic));
    if (greeting) FUZZ_CHECK(std::memcmp(greeting->mac.data(), data + 8 + kNonceBytes, 32) == 0);
    auto answer = parse_answer(data, n);
    FUZZ_CHECK(bool(answer) == (n == kAnswerBytes));
    if (answer) {
      const ConnHeader& h = answer->header;
      for (int world : {1, 2, 3, 1 << 20, int(h.world_size & 0x7fffffff)}) {
        bool fits = h.world_size == uint32_t(world) && h.initiator < uint32_t(world);
        FUZZ_CHECK(answer_problem(h, world).empty() == fits);
      }
    }
  }
  return 0;
}
