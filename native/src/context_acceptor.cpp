// The acceptor: one thread that accepts every incoming connection, authenticates it (HMAC
// challenge and response) and leaves it in the mailbox for its group, or answers a peer's query.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/platform.h"
#include "acceptor.h"

namespace mlxj {

namespace {

constexpr int kMaxPending = 64;     // handshakes in progress at once; a flood evicts the oldest
constexpr int kFullBackoffMs = 50;  // pause accepting when out of descriptors (poll would spin)

}  // namespace

bool Context::Shared::advance(Pending& p) {
  for (;;) {
    size_t want = p.stage == 3 ? p.verdict_bytes : stage_bytes(p.stage);
    while (p.done < want) {
      ssize_t r = stage_writes(p.stage) ? platform::send_nosignal(p.fd.get(), p.buf + p.done, want - p.done)
                                        : ::recv(p.fd.get(), p.buf + p.done, want - p.done, 0);
      if (r > 0) {
        p.done += size_t(r);
        if (p.stage == 0 && p.done >= 8 && std::memcmp(p.buf, kMagic, 8) != 0)
          return refuse(p.who, "not an mlx_jupyter peer (bad greeting)"), false;
        continue;
      }
      if (r < 0 && try_again(errno)) return true;
      std::string why = r == 0 ? "connection closed during the handshake" : errno_text(errno);
      if (r == 0 && p.stage == 2 && p.done == 0)  // the dialer checks our proof before it sends its own
        why = "authentication failed (it did not accept this rank's proof: its MLX_JUPYTER_TOKEN differs, "
              "so it is not part of this job)";
      return refuse(p.who, why), false;
    }
    p.done = 0;
    switch (p.stage++) {
      case 0: {
        std::memcpy(p.ni, parse_hello(p.buf, kHelloBytes)->nonce, 32);  // the magic was checked as it came
        random_bytes(p.na, 32);
        Digest ma = handshake_mac(token, 'A', p.ni, p.na, nullptr);
        std::memcpy(p.buf, kMagic, 8);
        std::memcpy(p.buf + 8, p.na, 32);
        std::memcpy(p.buf + 40, ma.data(), 32);
        break;
      }
      case 1:
        break;
      case 2:
        decide(p);
        if (!p.query) p.buf[0] = p.ok;
        break;
      default:
        if (p.query) return false;  // answered: the connection closes
        for (auto& hook : p.hooks)
          hook("rank " + std::to_string(p.h.initiator) + " left this group to form a new one");
        if (!p.ok) return refuse(p.who, p.why), false;
        if (verbose) log("accepted rank " + std::to_string(p.h.initiator) + " from " + p.who);
        std::lock_guard<std::mutex> lock(mu);
        mailbox[ConnKey{p.h.group, p.h.initiator, p.h.kind, p.h.index}] = std::move(p.fd);
        cv.notify_all();
        return false;
    }
  }
}

void Context::Shared::decide(Pending& p) {
  Answer answer = *parse_answer(p.buf, kAnswerBytes);  // any bytes of this size parse
  p.h = answer.header;
  if (!digest_equal(answer.mac, handshake_mac(token, 'I', p.ni, p.na, &p.h))) {
    p.why = "authentication failed (its MLX_JUPYTER_TOKEN differs: not part of this job)";
    return;
  }
  p.why = answer_problem(p.h, world_size);
  if (!p.why.empty()) return;
  if ((p.h.kind & 0xff) == uint32_t(ConnKind::Query)) return answer_query(p);
  ConnKey key{p.h.group, p.h.initiator, p.h.kind, p.h.index};
  std::lock_guard<std::mutex> lock(mu);
  // A connection we already have again: that peer left our group and is forming a new
  // one. Refuse it (the peer retries until we re-form too) and abort what we hold.
  if (consumed.count(key)) {
    p.why = "rank " + std::to_string(p.h.initiator) + " is forming a new group while this rank still holds the old one";
    for (const auto& [group, hook] : superseded)  // only the group it left, never the others we hold
      if (group == p.h.group) p.hooks.push_back(hook);
    return;
  }
  p.ok = 1;
}

void Context::Shared::answer_query(Pending& p) {
  QueryHook hook;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [group, h] : queries)  // the newest group of that id (the others are gone)
      if (group == p.h.group) hook = h;
  }
  QueryReply r;
  if (hook) r = hook(p.h.initiator, p.h.kind, p.h.index);  // (without mu: the group takes its own locks)
  p.query = true;
  p.ok = 1;
  p.verdict_bytes = kQueryReplyBytes;
  std::memset(p.buf, 0, kQueryReplyBytes);
  p.buf[0] = uint8_t(0x80 | uint8_t(r.answer));
  p.buf[1] = r.paused ? 1 : 0;
  uint32_t ms = r.since_pause_end_ms < 0 ? UINT32_MAX : uint32_t(std::min<int64_t>(r.since_pause_end_ms, UINT32_MAX - 1));
  std::memcpy(p.buf + 4, &ms, 4);
}

void Context::Shared::refuse(const std::string& who, const std::string& why) {
  std::string host = who.substr(0, who.rfind(':'));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!refused.insert(host + "\n" + why).second) return;
  }
  log("refused a connection from " + who + ": " + why + " (repeats from this address are not logged)");
}

void Context::Shared::log_once(const std::string& msg) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!refused.insert("\n" + msg).second) return;
  }
  log(msg);
}

void Context::accept_loop() {
  // Nothing may escape this thread (std::terminate would kill the rank): a failed
  // round is logged, and the loop goes on after a pause so it cannot spin.
  auto& pending = shared_->pending;
  auto& resume_accepting = shared_->resume_accepting;
  for (;;) {
    try {
      if (!accept_round()) {
        pending.clear();  // closed with the listeners: a stopped context holds no stranger
        return;
      }
    } catch (const std::exception& e) {
      log(std::string("the acceptor recovered from an error: ") + e.what());
      pending.clear();
      resume_accepting = Clock::now() + std::chrono::milliseconds(kFullBackoffMs);
    } catch (...) {
      pending.clear();
      resume_accepting = Clock::now() + std::chrono::milliseconds(kFullBackoffMs);
    }
  }
}

bool Context::accept_round() {
  auto& pending = shared_->pending;
  auto& resume_accepting = shared_->resume_accepting;
  auto now = Clock::now();
  bool accepting = now >= resume_accepting;
  std::vector<pollfd> fds;
  for (auto& p : pending)
    fds.push_back(pollfd{p.fd.get(), short(Shared::stage_writes(p.stage) ? POLLOUT : POLLIN), 0});
  size_t first_listener = fds.size();
  if (accepting)
    for (auto& l : listeners_) fds.push_back(pollfd{l.get(), POLLIN, 0});
  fds.push_back(pollfd{stop_.fd(), POLLIN, 0});
  auto wake = accepting ? Clock::time_point::max() : resume_accepting;
  for (auto& p : pending) wake = std::min(wake, p.deadline);
  int timeout = -1;
  if (wake != Clock::time_point::max())
    timeout = int(std::max<long long>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1));
  if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR)
    throw std::runtime_error("poll failed: " + errno_text(errno));
  if (fds.back().revents) return false;
  now = Clock::now();
  std::deque<Shared::Pending> next;
  for (size_t i = 0; i < pending.size(); ++i) {
    Shared::Pending& p = pending[i];
    bool going = true;
    if (fds[i].revents) {
      try {
        going = shared_->advance(p);
      } catch (const std::exception& e) {
        shared_->refuse(p.who, e.what());
        going = false;
      }
    }
    if (going && now >= p.deadline) {
      shared_->refuse(p.who, "no complete handshake within " + std::to_string(kHandshakeMs / 1000) + " s");
      going = false;
    }
    if (going) next.push_back(std::move(p));
  }
  pending.swap(next);
  for (size_t i = first_listener; accepting && i + 1 < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    for (int n = 0; n < kMaxPending; ++n) {  // a bounded batch: the other listeners get their turn
      int c = platform::accept_nonblocking(fds[i].fd);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: the waiting connection stays in the kernel's queue and
          // poll() would report it again at once. Give up the oldest handshake, or pause.
          if (!pending.empty()) {
            shared_->refuse(pending.front().who, "this rank ran out of file descriptors");
            pending.pop_front();
            continue;
          }
          shared_->log_once("out of file descriptors (" + errno_text(errno) +
                            "): not accepting connections for a moment; raise `ulimit -n`");
          resume_accepting = now + std::chrono::milliseconds(kFullBackoffMs);
        }
        break;
      }
      Shared::Pending p;
      p.fd = Fd(c);
      p.who = peer_name(c);
      p.deadline = now + std::chrono::milliseconds(kHandshakeMs);
      configure_stream(c, options_.dead_peer());
      // A flood must not lock peers out: the oldest handshake (most likely a silent
      // stranger) gives way, while a real peer's finishes within a round trip.
      if (pending.size() >= size_t(kMaxPending)) {
        shared_->refuse(pending.front().who, "too many handshakes at once (a flood of connections?)");
        pending.pop_front();
      }
      pending.push_back(std::move(p));
    }
  }
  return true;
}

}  // namespace mlxj
