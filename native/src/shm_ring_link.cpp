#include "mlxj/shm_ring_link.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>

#include "mlxj/errors.h"
#include "mlxj/platform.h"
#include "mlxj/reduce.h"

namespace mlxj {

namespace {

// A message that fits in the ring is published at most this much at a time: the peer then
// folds what we just wrote while it is still in cache, and we write the next part meanwhile.
// A message larger than the ring is published as far as the ring has room: the ring then
// paces it anyway, and 64 KiB steps cost a quarter of the bandwidth at 64 MiB (issue 23).
constexpr size_t kPublishBytes = size_t(64) << 10;

class ShmLink final : public Link {
 public:
  ShmLink(Fd bell, std::shared_ptr<SharedSegment> seg, size_t ring_bytes, bool creator, std::string name)
      : bell_(std::move(bell)), seg_(std::move(seg)), name_(std::move(name)) {
    int out = creator ? 0 : 1;
    cap_ = ring_bytes;  // ours, never read from the segment: that is the peer's to scribble on
    auto* state = reinterpret_cast<RingState*>(seg_->payload());
    uint8_t* rings = seg_->payload() + 2 * sizeof(RingState);
    tx_ = &state[out];
    rx_ = &state[1 - out];
    tx_ring_ = rings + size_t(out) * ring_bytes;
    rx_ring_ = rings + size_t(1 - out) * ring_bytes;
    tx_written_ = tx_read_ = rx_read_ = 0;  // a fresh segment; the peer's later stores are checked on load
  }

  const std::string& name() const override { return name_; }

  void begin_send(const MsgHeader& h, const void* data, size_t size) override {
    if (!seg_) fail(ErrorKind::Aborted, "the shared memory to " + name_ + " was released (its group was aborted)");
    if (rx_->withdrawn.load(std::memory_order_acquire)) gave_up();  // nothing is published to a peer that gave up
    send_ = {true, h, 0, const_cast<uint8_t*>(static_cast<const uint8_t*>(data)), size};
  }
  void begin_recv(const MsgHeader& expect, void* data, size_t size, const Fold* fold) override {
    if (!seg_) fail(ErrorKind::Aborted, "the shared memory to " + name_ + " was released (its group was aborted)");
    recv_ = {true, expect, 0, static_cast<uint8_t*>(data), size};
    fold_ = fold ? *fold : Fold{};
  }
  // Reducing straight out of the ring saves a copy and a second pass over the data.
  bool folds() const override { return true; }
  bool sending() const override { return send_.active; }
  bool receiving() const override { return recv_.active; }
  size_t received() const override {
    if (!recv_.active) return recv_.size;
    return recv_.done > sizeof(MsgHeader) ? recv_.done - sizeof(MsgHeader) : 0;
  }
  bool spins() const override { return true; }
  const char* kind() const override { return "shm"; }

  bool progress() override {
    if (slept_) drain_bell();
    bool moved = false;
    if (send_.active) moved |= push();
    if (recv_.active) moved |= pull();
    // A peer may write its last message and leave before we look: what it left in the
    // ring is still ours to read, so its leaving counts only once nothing more moves.
    if (peer_gone_ && !moved && (send_.active || recv_.active)) {
      if (rx_->withdrawn.load(std::memory_order_acquire)) gave_up();
      peer_closed(name_);
    }
    return moved;
  }

  void wait_set(std::vector<pollfd>& out) const override {
    if (!send_.active && !recv_.active) return;  // a peer that left must not wake us for nothing
    bool ready = false;
    if (send_.active) {  // ring full: ask for a bell, then look again (no lost wake-up)
      tx_->producer_waiting.store(1, std::memory_order_seq_cst);
      ready |= tx_->written.load(std::memory_order_relaxed) - tx_->read.load(std::memory_order_seq_cst) < cap_;
    }
    if (recv_.active) {
      rx_->consumer_waiting.store(1, std::memory_order_seq_cst);
      ready |= rx_->written.load(std::memory_order_seq_cst) != rx_->read.load(std::memory_order_relaxed);
    }
    slept_ = true;
    // A writable socket makes poll() return at once when there is work after all.
    out.push_back(pollfd{bell_.get(), short(POLLIN | (ready ? POLLOUT : 0)), 0});
  }

  // Reading the bell here is harmless: a bell only says "look at the ring", and
  // every op looks at the ring before it sleeps.
  bool peer_left() override {
    if (!peer_gone_) drain_bell();
    return peer_gone_;
  }

  std::optional<MsgHeader> waiting_header() const override {
    if (!seg_ || recv_.active) return std::nullopt;
    uint64_t r = rx_read_, w = rx_->written.load(std::memory_order_acquire);
    if (w < r || w - r > cap_ || w - r < sizeof(MsgHeader)) return std::nullopt;  // pull() judges odd counters
    MsgHeader h;
    copy_out(r, reinterpret_cast<uint8_t*>(&h), sizeof h);
    return h;
  }

  void withdraw(uint32_t from, GiveUp why, int origin, const std::string& reason) override {
    if (!seg_ || tx_->withdrawn.load(std::memory_order_relaxed)) return;  // (released, or said already)
    size_t len = std::min(reason.size(), sizeof tx_->reason);
    tx_->origin = origin;
    tx_->why = uint32_t(why);
    std::memcpy(tx_->reason, reason.data(), len);
    tx_->reason_len.store(uint32_t(len), std::memory_order_release);
    tx_->withdrawn.store(from, std::memory_order_seq_cst);
  }
  void shutdown() override { ::shutdown(bell_.get(), SHUT_RDWR); }
  void release() override {
    send_.active = recv_.active = false;
    seg_.reset();  // unmapped: nothing of the segment is left in this process
  }

 private:
  struct Transfer {
    bool active = false;
    MsgHeader header;
    size_t done = 0;  // bytes of header + payload moved
    uint8_t* data = nullptr;
    size_t size = 0;
  };

  // Copies message bytes [from, from+n) out of (header, payload) into dst.
  void gather(const Transfer& t, size_t from, uint8_t* dst, size_t n) const {
    const auto* h = reinterpret_cast<const uint8_t*>(&t.header);
    while (n) {
      size_t k;
      if (from < sizeof(MsgHeader)) {
        k = std::min(n, sizeof(MsgHeader) - from);
        std::memcpy(dst, h + from, k);
      } else {
        k = n;
        std::memcpy(dst, t.data + (from - sizeof(MsgHeader)), k);
      }
      dst += k; from += k; n -= k;
    }
  }

  bool push() {
    // Our cached view of `read` only errs on the safe side: reload it when it shows too little room.
    uint64_t w = tx_written_;
    size_t total = sizeof(MsgHeader) + send_.size, want = total - send_.done;
    if (cap_ - (w - tx_read_) < want) {
      uint64_t r = tx_->read.load(std::memory_order_acquire);
      // The consumer can only have released what we wrote, and never less than before.
      if (r > w || r < tx_read_) corrupt("its read counter " + std::to_string(r) + " is outside [" +
                                         std::to_string(tx_read_) + ", " + std::to_string(w) + "]");
      tx_read_ = r;
    }
    size_t step = send_.size > cap_ ? cap_ : kPublishBytes;
    size_t n = std::min({want, cap_ - size_t(w - tx_read_), step});
    if (n == 0) return false;
    size_t at = size_t(w % cap_), first = std::min(n, cap_ - at);
    gather(send_, send_.done, tx_ring_ + at, first);
    if (n > first) gather(send_, send_.done + first, tx_ring_, n - first);
    tx_written_ = w + n;
    tx_->written.store(w + n, std::memory_order_seq_cst);
    send_.done += n;
    if (send_.done == total) send_.active = false;
    // Look before clearing: an atomic exchange on every push would bounce the line between cores.
    if (tx_->consumer_waiting.load(std::memory_order_seq_cst) && tx_->consumer_waiting.exchange(0)) ring_bell();
    return true;
  }

  // Copies n bytes from ring position pos.
  void copy_out(uint64_t pos, uint8_t* dst, size_t n) const {
    size_t at = size_t(pos % cap_), first = std::min(n, cap_ - at);
    std::memcpy(dst, rx_ring_ + at, first);
    if (n > first) std::memcpy(dst + first, rx_ring_, n - first);
  }

  // out[at, at+bytes) = mine op src (or src op mine).
  void fold_span(const uint8_t* src, size_t at, size_t bytes) const {
    const uint8_t* mine = fold_.mine + at;
    reduce_to(fold_.out + at, fold_.mine_first ? mine : src, fold_.mine_first ? src : mine,
              bytes / dtype_size(fold_.t), fold_.t, fold_.op);
  }

  // Folds the whole elements of payload [at, at+n) found at ring position pos; returns the bytes used.
  size_t fold_in(uint64_t pos, size_t at, size_t n) const {
    size_t es = dtype_size(fold_.t);
    n -= n % es;
    size_t o = size_t(pos % cap_), first = std::min(n, cap_ - o), done = first - first % es;
    fold_span(rx_ring_ + o, at, done);
    if (done < first) {  // an element straddles the end of the ring
      uint8_t tmp[16];
      copy_out(pos + done, tmp, es);
      fold_span(tmp, at + done, es);
      done += es;
    }
    if (n > done) fold_span(rx_ring_ + (done - first), at + done, n - done);
    return n;
  }

  [[noreturn]] void gave_up() const {
    size_t len = std::min<size_t>(rx_->reason_len.load(std::memory_order_acquire), sizeof rx_->reason);
    std::string why(rx_->reason, len);
    for (char& c : why)  // written by another process: keep it printable
      if (c < 0x20 || c > 0x7e) c = '?';
    int origin = rx_->origin;
    peer_gave_up(name_, origin >= -1 && origin < 1 << 24 ? origin : -1, GiveUp(rx_->why & 3), why);
  }

  // A collective's message of the peer's is taken only if the peer has not withdrawn from that
  // collective (point-to-point messages, seq 0, are complete sends: always good).
  void check_taken(const MsgHeader& got) const {
    uint32_t from = rx_->withdrawn.load(std::memory_order_seq_cst);
    if (from && got.seq && got.seq >= from) gave_up();
  }

  bool pull() {
    uint64_t r = rx_read_, w = rx_->written.load(std::memory_order_acquire);
    if (w == r) {
      // Nothing more will come from a peer that withdrew (written is looked at again: it may
      // have published its last message between our two loads).
      if (rx_->withdrawn.load(std::memory_order_seq_cst) && rx_->written.load(std::memory_order_seq_cst) == r)
        gave_up();
      return false;
    }
    // The producer can only have published what fits in the ring after what we released.
    if (w < r || w - r > cap_)
      corrupt("its written counter " + std::to_string(w) + " is outside [" + std::to_string(r) + ", " +
              std::to_string(r + cap_) + "]");
    if (recv_.done < sizeof(MsgHeader)) {
      size_t k = std::min<size_t>(sizeof(MsgHeader) - recv_.done, w - r);
      copy_out(r, reinterpret_cast<uint8_t*>(&got_) + recv_.done, k);
      r += k;
      recv_.done += k;
      // Never touch the payload before checking the header: a mismatched size must not overrun the buffer.
      if (recv_.done == sizeof(MsgHeader)) {
        check_header(recv_.header, got_, name_);
        check_taken(got_);
      }
    }
    if (recv_.done >= sizeof(MsgHeader)) {
      size_t at = recv_.done - sizeof(MsgHeader), n = std::min<size_t>(recv_.size - at, w - r);
      if (fold_.out) {
        n = fold_in(r, at, n);
      } else if (n) {
        copy_out(r, recv_.data + at, n);
      }
      r += n;
      recv_.done += n;
    }
    if (r == rx_read_) return false;  // only part of an element so far
    if (recv_.done == sizeof(MsgHeader) + recv_.size) check_taken(got_);  // the take: the peer still stands by it
    rx_read_ = r;
    rx_->read.store(r, std::memory_order_seq_cst);
    if (recv_.done == sizeof(MsgHeader) + recv_.size) recv_.active = false;
    if (rx_->producer_waiting.load(std::memory_order_seq_cst) && rx_->producer_waiting.exchange(0)) ring_bell();
    return true;
  }

  [[noreturn]] void corrupt(const std::string& what) const {
    fail(ErrorKind::Peer, "the shared memory with " + name_ + " is corrupt (" + what +
                              "): the peer crashed mid-write or another process of this user wrote into it");
  }

  // A peer that has left (done with us, or dead) is noted, not an error yet: see progress().
  static bool left(int err) { return err == EPIPE || err == ECONNRESET; }

  void ring_bell() {
    char c = 1;
    if (platform::send_nosignal(bell_.get(), &c, 1) >= 0 || try_again(errno)) return;
    if (!left(errno)) peer_lost(errno, name_);
    peer_gone_ = true;
  }

  // One read, not a loop until empty: a peer that rings without end cannot hold
  // us here, and bytes left over only make the next poll() return at once.
  void drain_bell() {
    slept_ = false;
    char buf[256];
    ssize_t r = ::recv(bell_.get(), buf, sizeof buf, 0);
    if (r > 0) return;
    if (r < 0 && try_again(errno)) return;
    // A peer leaving with bell bytes of ours unread resets the connection instead of closing it.
    if (r < 0 && !left(errno)) peer_lost(errno, name_);
    peer_gone_ = true;
  }

  Fd bell_;
  std::shared_ptr<SharedSegment> seg_;
  std::string name_;
  size_t cap_;
  RingState *tx_, *rx_;
  uint8_t *tx_ring_, *rx_ring_;
  Transfer send_, recv_;
  Fold fold_;
  MsgHeader got_;
  uint64_t tx_written_, tx_read_, rx_read_;  // our copies: we write the first and last, the second may lag
  mutable bool slept_ = false;
  bool peer_gone_ = false;  // its end of the bell was closed or reset
};

}  // namespace

std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, size_t ring_bytes, bool creator,
                                    std::string name) {
  if (seg->payload_bytes() < shm_link_bytes(ring_bytes)) fail(ErrorKind::Config, "shared memory too small for the link's rings");
  return std::make_unique<ShmLink>(std::move(doorbell), std::move(seg), ring_bytes, creator, std::move(name));
}

}  // namespace mlxj
