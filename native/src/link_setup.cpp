#include "mlxj/link_setup.h"

#include <algorithm>
#include <cstring>

#include "mlxj/errors.h"
#include "mlxj/sha256.h"
#include "mlxj/shm_ring_link.h"
#include "mlxj/tcp_transport.h"
#include "mlxj/wire.h"

namespace mlxj {

namespace {

constexpr size_t kRingBytes = size_t(4) << 20;
using Offer = LinkOffer;
using Reply = LinkReply;

Digest this_host(const CoreOptions& opts) {
  std::string id = host_identity(opts.host_id);
  return sha256(id.data(), id.size());
}

void exchange(int fd, void* buf, size_t n, bool write, const Wait& wait, const std::string& peer) {
  std::string why;
  // A peer may be late to its side of the setup (busy, or its recv comes later):
  // wait for it as long as the op may wait, and honour abort and Ctrl-C meanwhile.
  const std::string waiting_for =
      "waiting for " + peer + " to set up the link (it may not have reached this call yet, or be waiting on another rank)";
  auto check = [&] { check_wait(wait, waiting_for); };
  if (!io_exact(fd, buf, n, write, wait.deadline, &why, check)) {
    check_wait(wait, waiting_for);  // past the deadline: a timeout, not a broken peer
    fail(ErrorKind::Peer, "setting up the link to " + peer + " failed: " + why +
                              " (it exited or gave up: its own error says why)");
  }
}

}  // namespace

std::unique_ptr<Link> establish_link(std::vector<Fd> conns, bool initiator, std::string name, const Wait& wait,
                                     const CoreOptions& opts) {
  int fd = conns[0].get();
  Digest mine = this_host(opts);
  bool use_shm = false;
  std::shared_ptr<SharedSegment> seg;
  if (initiator) {
    Offer offer{kLinkMagic, opts.shm ? 1u : 0u, {}};
    std::memcpy(offer.host, mine.data(), 32);
    exchange(fd, &offer, sizeof offer, true, wait, name);
    uint8_t answer[sizeof(Reply)];
    exchange(fd, answer, sizeof answer, false, wait, name);
    auto reply = parse_link_reply(answer, sizeof answer);
    if (!reply) fail(ErrorKind::Protocol, name + " answered the link setup with garbage");
    if (reply->ok) {
      try {
        seg = create_segment(shm_link_bytes(kRingBytes), opts.named_shm);
      } catch (const CommError&) {
        seg.reset();  // an empty locator: the peer answers no, and the link uses TCP
      }
      SegmentInfo info{kLinkMagic, 0, {}, kRingBytes};
      std::string loc = seg ? seg->locator() : "";
      info.length = uint32_t(std::min(loc.size(), sizeof info.locator));
      std::memcpy(info.locator, loc.data(), info.length);
      exchange(fd, &info, sizeof info, true, wait, name);
      uint8_t ack[sizeof(Reply)];
      exchange(fd, ack, sizeof ack, false, wait, name);
      auto acked = parse_link_reply(ack, sizeof ack);
      use_shm = seg && acked && acked->ok;
      if (seg) seg->release_name(use_shm);  // mapped by both (or given up): no name, no descriptor left
    }
  } else {
    uint8_t offered[sizeof(Offer)];
    exchange(fd, offered, sizeof offered, false, wait, name);
    auto offer = parse_link_offer(offered, sizeof offered);
    if (!offer) fail(ErrorKind::Protocol, name + " sent garbage instead of a link setup");
    Digest theirs;
    std::memcpy(theirs.data(), offer->host, 32);
    Reply answer{kLinkMagic, (offer->want_shm && opts.shm && digest_equal(theirs, mine)) ? 1u : 0u};
    exchange(fd, &answer, sizeof answer, true, wait, name);
    if (answer.ok) {
      uint8_t info[sizeof(SegmentInfo)];
      exchange(fd, info, sizeof info, false, wait, name);
      Reply ack{kLinkMagic, 0};
      if (auto locator = parse_segment_info(info, sizeof info, kRingBytes)) {
        try {
          seg = open_segment(*locator, shm_link_bytes(kRingBytes));
          ack.ok = 1;
        } catch (const CommError&) {
          seg.reset();  // fall back to TCP
        }
      }
      exchange(fd, &ack, sizeof ack, true, wait, name);
      use_shm = ack.ok;
    }
  }
  if (use_shm) {
    conns.resize(1);  // the first connection stays as doorbell and liveness signal
    return make_shm_link(std::move(conns[0]), std::move(seg), kRingBytes, initiator, std::move(name));
  }
  return make_tcp_link(std::move(conns), std::move(name), opts.dead_peer());
}

}  // namespace mlxj
