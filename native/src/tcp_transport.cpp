#include "mlxj/tcp_transport.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <sys/uio.h>

#include "mlxj/dtype.h"
#include "mlxj/errors.h"
#include "mlxj/platform.h"

namespace mlxj {

namespace {

constexpr size_t kStripe = 256 * 1024;  // striping unit across parallel connections

class TcpLink final : public Link {
 public:
  TcpLink(std::vector<Fd> conns, std::string name, std::chrono::milliseconds dead_peer)
      : conns_(std::move(conns)), alive_(conns_.size(), Liveness(dead_peer)), dead_peer_(dead_peer),
        name_(std::move(name)) {
    send_.done.assign(conns_.size(), 0);
    recv_.done.assign(conns_.size(), 0);
  }

  const std::string& name() const override { return name_; }

  void begin_send(const MsgHeader& h, const void* data, size_t size) override {
    if (urgent() >= 0) gave_up();  // nothing is sent to a peer that gave up
    start(send_, h, const_cast<uint8_t*>(static_cast<const uint8_t*>(data)), size);
  }
  void begin_recv(const MsgHeader& expect, void* data, size_t size, const Fold*) override {
    start(recv_, expect, static_cast<uint8_t*>(data), size);
  }
  bool sending() const override { return send_.active; }
  bool receiving() const override { return recv_.active; }

  bool progress() override {
    bool moved = false;
    for (size_t c = 0; c < conns_.size(); ++c) {
      if (send_.active) moved |= pump(send_, c, true);
      if (recv_.active) moved |= pump(recv_, c, false);
    }
    finish_if_done(send_);
    finish_if_done(recv_);
    return moved;
  }

  size_t received() const override {
    if (!recv_.active) return recv_.size;
    size_t first_missing = recv_.size;
    for (size_t c = 0; c < conns_.size(); ++c)
      if (recv_.done[c] < conn_total(recv_, c)) first_missing = std::min(first_missing, position(recv_, c));
    return recv_.header_done < sizeof(MsgHeader) ? 0 : first_missing;
  }

  void wait_set(std::vector<pollfd>& out) const override {
    for (size_t c = 0; c < conns_.size(); ++c) {
      short ev = (pending(send_, c) ? POLLOUT : 0) | (pending(recv_, c) ? POLLIN : 0);
      if (ev) out.push_back(pollfd{conns_[c].get(), ev, 0});
    }
  }

  // The withdrawal travels as one urgent byte, out of the stream (so it never lands inside a
  // message another thread is sending): why (2 bits), the collective's parity (a peer taking
  // our message of collective k sees a withdrawal from k or k + 1, never later: that would need
  // its own part in k + 1), the origin's world rank (5 bits, 31: another). The peer finds the byte
  // after the last message we sent before it (sockatmark).
  void withdraw(uint32_t from, GiveUp why, int origin, const std::string&) override {
    if (withdrawn_.exchange(true)) return;
    uint8_t who = origin >= 0 && origin < 31 ? uint8_t(origin) : 31;
    platform::send_urgent(conns_[0].get(), uint8_t(uint8_t(why) << 6 | (from & 1) << 5 | who));
  }
  void shutdown() override {
    for (auto& fd : conns_) ::shutdown(fd.get(), SHUT_RDWR);
  }
  void check_alive(Clock::time_point now) override {
    for (size_t c = 0; c < conns_.size(); ++c)
      if (alive_[c].silent(conns_[c].get(), now))
        fail(ErrorKind::Peer, name_ + " stopped responding (its host is down or the network is cut): nothing was "
                              "acknowledged for " + std::to_string(dead_peer_.count() / 1000.0).substr(0, 5) +
                              " s (MLX_JUPYTER_DEAD_PEER_TIMEOUT)");
  }
  const char* kind() const override { return "tcp"; }
  // On a fast network the reply often comes within microseconds: a short spin
  // of non-blocking reads beats a poll() sleep and wake-up.
  bool spins() const override { return true; }

 private:
  struct Transfer {
    bool active = false;
    MsgHeader header;  // to send, or the one expected
    MsgHeader got;     // the one received
    size_t header_done = 0;
    uint8_t* data = nullptr;
    size_t size = 0;
    size_t stripe = 0;
    std::vector<size_t> done;  // payload bytes moved per connection
  };

  void start(Transfer& t, const MsgHeader& h, uint8_t* data, size_t size) {
    t.active = true;
    t.header = h;
    t.header_done = 0;
    t.data = data;
    t.size = size;
    t.stripe = conns_.size() == 1 ? std::max<size_t>(size, 1) : kStripe;
    std::fill(t.done.begin(), t.done.end(), 0);
  }

  // Bytes of the payload that connection c carries: stripes c, c+k, c+2k, ...
  size_t conn_total(const Transfer& t, size_t c) const {
    size_t k = conns_.size(), stripes = (t.size + t.stripe - 1) / t.stripe;
    if (c >= stripes) return 0;
    size_t mine = (stripes - c + k - 1) / k, last = c + (mine - 1) * k;
    size_t last_len = std::min(t.stripe, t.size - last * t.stripe);
    return (mine - 1) * t.stripe + last_len;
  }

  bool pending(const Transfer& t, size_t c) const {
    return t.active && ((c == 0 && t.header_done < sizeof(MsgHeader)) || t.done[c] < conn_total(t, c));
  }

  // Absolute payload offset of connection c's next byte.
  size_t position(const Transfer& t, size_t c) const {
    size_t q = t.done[c] / t.stripe;
    return (c + q * conns_.size()) * t.stripe + t.done[c] % t.stripe;
  }

  bool pump(Transfer& t, size_t c, bool is_send) {
    bool moved = false;
    for (;;) {
      iovec iov[2];
      int n = 0;
      bool header_pending = c == 0 && t.header_done < sizeof(MsgHeader);
      if (header_pending) {
        auto* hp = reinterpret_cast<uint8_t*>(is_send ? &t.header : &t.got);
        iov[n++] = {hp + t.header_done, sizeof(MsgHeader) - t.header_done};
      }
      size_t total = conn_total(t, c);
      if (t.done[c] < total) {
        size_t pos = position(t, c), stripe_left = t.stripe - t.done[c] % t.stripe;
        iov[n++] = {t.data + pos, std::min(stripe_left, t.size - pos)};
      }
      if (n == 0) return moved;
      if (!is_send && c == 0 && urgent() >= 0 && ::sockatmark(conns_[0].get()) == 1) gave_up();
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t r = is_send ? platform::sendmsg_nosignal(conns_[c].get(), &msg) : ::recvmsg(conns_[c].get(), &msg, 0);
      if (r < 0) {
        if (try_again(errno)) return moved;
        int err = errno;
        if (urgent() >= 0) gave_up();
        peer_lost(err, name_);
      }
      if (r == 0 && !is_send) {
        if (urgent() >= 0) gave_up();
        peer_closed(name_);
      }
      moved = true;
      size_t got = size_t(r);
      if (header_pending) {
        size_t h = std::min(got, sizeof(MsgHeader) - t.header_done);
        t.header_done += h;
        got -= h;
        if (!is_send && t.header_done == sizeof(MsgHeader)) check_header(t.header, t.got, name_);
      }
      t.done[c] += got;
    }
  }

  void finish_if_done(Transfer& t) {
    if (!t.active || t.header_done < sizeof(MsgHeader)) return;
    for (size_t c = 0; c < conns_.size(); ++c)
      if (t.done[c] < conn_total(t, c)) return;
    // The take: a collective's message right before the peer's withdrawal from that very
    // collective is not taken (point-to-point messages, seq 0, are complete sends: good).
    if (&t == &recv_ && t.got.seq && urgent() >= 0 && (oob_ >> 5 & 1) == int(t.got.seq & 1) &&
        ::sockatmark(conns_[0].get()) == 1)
      gave_up();
    t.active = false;
  }

  // The peer's withdrawal byte once it has come, else -1 (one non-blocking look).
  int urgent() {
    uint8_t b;
    if (oob_ < 0 && ::recv(conns_[0].get(), &b, 1, MSG_OOB | MSG_DONTWAIT) == 1) oob_ = b;
    return oob_;
  }
  [[noreturn]] void gave_up() const {
    peer_gave_up(name_, (oob_ & 31) == 31 ? -1 : oob_ & 31, GiveUp(oob_ >> 6), "");
  }

  std::vector<Fd> conns_;
  std::vector<Liveness> alive_;
  std::chrono::milliseconds dead_peer_;
  std::string name_;
  Transfer send_, recv_;
  int oob_ = -1;                        // the peer's withdrawal byte (op thread)
  std::atomic<bool> withdrawn_{false};  // ours was sent (any thread)
};

}  // namespace

std::unique_ptr<Link> make_tcp_link(std::vector<Fd> conns, std::string name, std::chrono::milliseconds dead_peer) {
  return std::make_unique<TcpLink>(std::move(conns), std::move(name), dead_peer);
}

}  // namespace mlxj
