// The 16-byte header in front of every message (tcp_transport.cpp, shm_transport.cpp):
// a peer's header against the one this rank expects, and the error that names both.
#include <cstring>

#include "check.h"
#include "mlxj/errors.h"
#include "mlxj/wire.h"

using namespace mlxj;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto any = parse_msg_header(data, size);
  FUZZ_CHECK(bool(any) == (size == sizeof(MsgHeader)));
  if (size < 2 * sizeof(MsgHeader)) return 0;
  // The first header is this rank's call, the second what arrived.
  auto expected = parse_msg_header(data, sizeof(MsgHeader));
  auto got = parse_msg_header(data + sizeof(MsgHeader), sizeof(MsgHeader));
  FUZZ_CHECK(expected && got);
  FUZZ_CHECK(!describe(*got).empty() && !describe(*expected).empty());
  bool same = got->magic == expected->magic && got->op == expected->op && got->dtype == expected->dtype &&
              got->seq == expected->seq && got->nbytes == expected->nbytes;
  try {
    check_header(*expected, *got, "rank 1 (127.0.0.1:1)");
    FUZZ_CHECK(same);
  } catch (const CommError& e) {
    FUZZ_CHECK(!same && e.kind() == ErrorKind::Protocol && std::strstr(e.what(), "rank 1") != nullptr);
  }
  return 0;
}
