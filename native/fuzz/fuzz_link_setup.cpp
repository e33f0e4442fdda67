// The link setup's messages (link_setup.cpp) and the shared-memory locator the
// segment info carries (shm_transport.cpp): only our own shapes are accepted.
#include <cstring>
#include <string>

#include "check.h"
#include "mlxj/wire.h"

using namespace mlxj;

namespace {

constexpr uint64_t kRing = uint64_t(4) << 20;
constexpr unsigned kUid = 1000;

void check_locator(const std::string& text) {
  std::string why;
  auto loc = parse_locator(text, kUid, &why);
  FUZZ_CHECK(bool(loc) == why.empty());
  if (!loc) return;
  // Never a path outside the two shapes: no "..", no other user's names, the nonce after the last '#'.
  FUZZ_CHECK(loc->path.find("..") == std::string::npos);
  FUZZ_CHECK(text.size() == loc->path.size() + 17 && text[loc->path.size()] == '#');
  if (loc->named) {
    FUZZ_CHECK(loc->path.rfind("/mlxj.1000.", 0) == 0 && loc->path.size() <= 14);
  } else {
    FUZZ_CHECK(loc->path.rfind("/proc/", 0) == 0 && loc->path.find("/fd/") != std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto offer = parse_link_offer(data, size);
  FUZZ_CHECK(!offer || (size == sizeof(LinkOffer) && offer->magic == kLinkMagic));
  auto reply = parse_link_reply(data, size);
  FUZZ_CHECK(!reply || (size == sizeof(LinkReply) && reply->magic == kLinkMagic));
  // A segment info at its exact size: the fuzzer's bytes, padded or cut.
  uint8_t info[sizeof(SegmentInfo)] = {};
  std::memcpy(info, data, size < sizeof info ? size : sizeof info);
  for (uint64_t ring : {kRing, uint64_t(0)}) {
    auto locator = parse_segment_info(info, sizeof info, ring);
    if (locator) {
      FUZZ_CHECK(locator->size() <= kLocatorBytes);
      check_locator(*locator);
    }
  }
  check_locator(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
