#include "mlxj/wire.h"

#include <cstring>

namespace mlxj {

namespace {

template <class T>
std::optional<T> read_as(const uint8_t* p, size_t n) {
  if (n != sizeof(T)) return std::nullopt;
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

std::optional<Hello> parse_hello(const uint8_t* p, size_t n) {
  if (n != kHelloBytes || std::memcmp(p, kHandshakeMagic, 8) != 0) return std::nullopt;
  Hello h;
  std::memcpy(h.nonce, p + 8, kNonceBytes);
  return h;
}

std::optional<Greeting> parse_greeting(const uint8_t* p, size_t n) {
  if (n != kGreetingBytes || std::memcmp(p, kHandshakeMagic, 8) != 0) return std::nullopt;
  Greeting g;
  std::memcpy(g.nonce, p + 8, kNonceBytes);
  std::memcpy(g.mac.data(), p + 8 + kNonceBytes, 32);
  return g;
}

std::optional<Answer> parse_answer(const uint8_t* p, size_t n) {
  if (n != kAnswerBytes) return std::nullopt;
  Answer a;
  std::memcpy(&a.header, p, sizeof a.header);
  std::memcpy(a.mac.data(), p + sizeof a.header, 32);
  return a;
}

std::string answer_problem(const ConnHeader& h, int world_size) {
  if (h.world_size != uint32_t(world_size))
    return "it belongs to a job of " + std::to_string(h.world_size) + " ranks, this one has " + std::to_string(world_size);
  if (h.initiator >= uint32_t(world_size))
    return "it claims to be rank " + std::to_string(h.initiator) + " of a job of " + std::to_string(world_size);
  return "";
}

std::optional<MsgHeader> parse_msg_header(const uint8_t* p, size_t n) { return read_as<MsgHeader>(p, n); }

std::optional<LinkOffer> parse_link_offer(const uint8_t* p, size_t n) {
  auto o = read_as<LinkOffer>(p, n);
  if (!o || o->magic != kLinkMagic) return std::nullopt;
  return o;
}

std::optional<LinkReply> parse_link_reply(const uint8_t* p, size_t n) {
  auto r = read_as<LinkReply>(p, n);
  if (!r || r->magic != kLinkMagic) return std::nullopt;
  return r;
}

std::optional<std::string> parse_segment_info(const uint8_t* p, size_t n, uint64_t ring_bytes) {
  auto info = read_as<SegmentInfo>(p, n);
  if (!info || info->magic != kLinkMagic || info->length > kLocatorBytes || info->ring_bytes != ring_bytes)
    return std::nullopt;
  return std::string(info->locator, info->length);
}

std::optional<Locator> parse_locator(const std::string& locator, unsigned uid, std::string* why) {
  auto refuse = [why](const char* reason) -> std::optional<Locator> {
    if (why) *why = reason;
    return std::nullopt;
  };
  auto hash = locator.rfind('#');
  std::string nonce_text = hash == std::string::npos ? "" : locator.substr(hash + 1);
  if (nonce_text.size() != 16 || nonce_text.find_first_not_of("0123456789abcdef") != std::string::npos)
    return refuse("no segment nonce");
  Locator loc;
  loc.path = locator.substr(0, hash);
  loc.nonce = std::stoull(nonce_text, nullptr, 16);
  std::string dot = "/mlxj." + std::to_string(uid) + ".";
  std::string slot = loc.path.rfind(dot, 0) == 0 ? loc.path.substr(dot.size()) : "";
  if (all_digits(slot) && slot.size() < 4) {
    loc.named = true;
    return loc;
  }
  std::string rest = loc.path.rfind("/proc/", 0) == 0 ? loc.path.substr(6) : "";
  auto slash = rest.find("/fd/");
  if (slash == std::string::npos || !all_digits(rest.substr(0, slash)) || !all_digits(rest.substr(slash + 4)))
    return refuse("not a peer's memfd");
  return loc;
}

}  // namespace mlxj
