// A context (context.h): its listeners and acceptor thread started and stopped, the dialer's side of
// the handshake (connect, query), a connection taken from the mailbox, and the waits that bound them.
#include "mlxj/context.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>

#include "mlxj/errors.h"
#include "acceptor.h"

namespace mlxj {

Digest handshake_mac(const std::string& token, char role, const uint8_t* ni, const uint8_t* na, const ConnHeader* h) {
  uint8_t msg[1 + 32 + 32 + sizeof(ConnHeader)];
  msg[0] = uint8_t(role);
  std::memcpy(msg + 1, ni, 32);
  std::memcpy(msg + 33, na, 32);
  size_t n = 65;
  if (h) {
    std::memcpy(msg + 65, h, sizeof *h);
    n += sizeof *h;
  }
  return hmac_sha256(token, msg, n);
}

Context::Context(int rank, std::vector<std::vector<Endpoint>> addresses, CoreOptions options)
    : rank_(rank), addresses_(std::move(addresses)), options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  shared_->rank = rank;
  shared_->world_size = int(addresses_.size());
  shared_->token = options_.token;
  shared_->verbose = options_.verbose;
  if (size() > 1) {
    for (const auto& ep : addresses_[rank]) listeners_.push_back(listen_on(ep));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
}

Context::~Context() { close(); }

void Context::close() {
  std::lock_guard<std::mutex> lock(close_mu_);  // two threads may close at once
  stop_.wake();
  if (acceptor_.joinable()) acceptor_.join();
  listeners_.clear();
}

std::string Context::describe(int rank) const {
  std::string s = "rank " + std::to_string(rank);
  if (rank >= 0 && rank < size() && !addresses_[rank].empty()) s += " (" + addresses_[rank][0].str() + ")";
  return s;
}

void Context::log(const std::string& msg) const { shared_->log(msg); }

void Context::on_superseded(uint64_t group, std::function<void(const std::string&)> hook) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->superseded.emplace_back(group, std::move(hook));
}

void Context::on_query(uint64_t group, QueryHook hook) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->queries.emplace_back(group, std::move(hook));
}

QueryReply Context::query(int peer, const ConnKey& key, Clock::time_point deadline, const Wait& wait) {
  QueryReply none;
  const Endpoint& ep = addresses_[peer][0];
  std::string why;
  Fd fd = try_connect(ep, deadline, &why);
  if (!fd.valid()) return none;
  configure_stream(fd.get(), options_.dead_peer());
  auto stop = [&] {  // abort and Ctrl-C, not the op's deadline (it has passed: that is why we ask)
    if (wait.check_abort) wait.check_abort();
    if (wait.interrupted && wait.interrupted()) throw Interrupted();
  };
  uint8_t hello[8 + 32], reply[8 + 32 + 32], ni[32], verdict[kQueryReplyBytes];
  random_bytes(ni, 32);
  std::memcpy(hello, kMagic, 8);
  std::memcpy(hello + 8, ni, 32);
  std::string err;
  if (!io_exact(fd.get(), hello, sizeof hello, true, deadline, &err, stop) ||
      !io_exact(fd.get(), reply, sizeof reply, false, deadline, &err, stop) || !greeted_by_peer(reply, ni))
    return none;
  ConnHeader h{key.group, key.initiator, key.kind, key.index, uint32_t(size())};
  Digest mi = handshake_mac(shared_->token, 'I', ni, reply + 8, &h);
  uint8_t answer[sizeof h + 32];
  std::memcpy(answer, &h, sizeof h);
  std::memcpy(answer + sizeof h, mi.data(), 32);
  if (!io_exact(fd.get(), answer, sizeof answer, true, deadline, &err, stop) ||
      !io_exact(fd.get(), verdict, sizeof verdict, false, deadline, &err, stop) || !(verdict[0] & 0x80))
    return none;
  QueryReply r;
  uint8_t a = verdict[0] & 0x7f;
  r.answer = a <= uint8_t(QueryAnswer::Refused) ? QueryAnswer(a) : QueryAnswer::Unknown;
  r.paused = verdict[1] != 0;
  uint32_t ms;
  std::memcpy(&ms, verdict + 4, 4);
  r.since_pause_end_ms = ms == UINT32_MAX ? -1 : int64_t(ms);
  return r;
}

void check_wait(const Wait& wait, const std::string& waiting_for) {
  if (wait.check_abort) wait.check_abort();
  if (wait.interrupted && wait.interrupted()) throw Interrupted();
  if (Clock::now() >= wait.deadline) fail(ErrorKind::Timeout, wait.what + " timed out " + waiting_for);
}

void wait_slice(const Wait& wait, int ms, const std::string& waiting_for) {
  if (wait.check_abort) wait.check_abort();
  auto now = Clock::now();
  if (now >= wait.deadline) fail(ErrorKind::Timeout, wait.what + " timed out " + waiting_for);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wait.deadline - now).count() + 1;
  int slice = int(std::min<long long>(ms, left));
  if (wait.abort) {
    pollfd p{wait.abort->fd(), POLLIN, 0};
    ::poll(&p, 1, slice);
  } else {
    ::poll(nullptr, 0, slice);
  }
  if (wait.interrupted && wait.interrupted()) throw Interrupted();
  if (wait.check_abort) wait.check_abort();
}

bool Context::greeted_by_peer(const uint8_t* reply, const uint8_t* nonce) const {
  auto g = parse_greeting(reply, kGreetingBytes);
  return g && digest_equal(g->mac, handshake_mac(shared_->token, 'A', nonce, g->nonce, nullptr));
}

Fd Context::connect(int peer, size_t addr_index, const ConnKey& key, const Wait& wait) {
  const Endpoint& ep = addresses_[peer][addr_index];
  std::string why = "not listening yet", logged;
  int backoff = 5;
  bool retried = false;
  auto log_once = [&](const std::string& msg) {
    if (msg != logged) log("refusing " + describe(peer) + " at " + ep.str() + ": " + msg);
    logged = msg;
  };
  for (;;) {
    auto attempt_deadline = std::min(wait.deadline, Clock::now() + std::chrono::seconds(1));
    Fd fd = try_connect(ep, attempt_deadline, &why);
    if (fd.valid()) {
      configure_stream(fd.get(), options_.dead_peer());
      auto deadline = std::min(wait.deadline, Clock::now() + std::chrono::milliseconds(kHandshakeMs));
      // Abort and Ctrl-C are honoured during the handshake too, not only between attempts.
      auto stop = [&] {  // (with why the attempt before failed: the deadline may fall in any attempt)
        check_wait(wait, "during the handshake with " + describe(peer) + " at " + ep.str() +
                             (retried ? " (the attempt before: " + why + ")" : ""));
      };
      uint8_t hello[8 + 32], reply[8 + 32 + 32], ni[32];
      random_bytes(ni, 32);
      std::memcpy(hello, kMagic, 8);
      std::memcpy(hello + 8, ni, 32);
      std::string err;
      if (!io_exact(fd.get(), hello, sizeof hello, true, deadline, &err, stop) ||
          !io_exact(fd.get(), reply, sizeof reply, false, deadline, &err, stop)) {
        why = "handshake failed: " + err;
      } else if (!greeted_by_peer(reply, ni)) {
        // Not fatal: the real peer may still take over this address; keep trying until the deadline.
        // Our own proof is never sent to a listener that failed to prove itself: we hang up.
        bool ours = std::memcmp(reply, kMagic, 8) == 0;
        why = ours ? "the process listening there failed authentication (its MLX_JUPYTER_TOKEN differs: another job)"
                   : "the process listening there is not an mlx_jupyter rank (bad greeting): check the hostfile and port offset";
        log_once(why);
      } else {
        ConnHeader h{key.group, key.initiator, key.kind, key.index, uint32_t(size())};
        Digest mi = handshake_mac(shared_->token, 'I', ni, reply + 8, &h);
        uint8_t answer[sizeof h + 32];
        std::memcpy(answer, &h, sizeof h);
        std::memcpy(answer + sizeof h, mi.data(), 32);
        uint8_t ok = 0;
        if (io_exact(fd.get(), answer, sizeof answer, true, deadline, &err, stop) &&
            io_exact(fd.get(), &ok, 1, false, deadline, &err, stop) && ok == 1)
          return fd;
        why = ok == 0 && err.empty()
                  ? "refused by the peer (it still holds the group this rank left, and must call init() again "
                    "too; or its token or world size differ: see its log)"
                  : "handshake failed: " + err;
      }
    }
    wait_slice(wait, backoff, "connecting to " + describe(peer) + " at " + ep.str() + " (" + why + ")");
    backoff = std::min(backoff * 2, 100);
    retried = true;
  }
}

Fd Context::accept(const ConnKey& key, int peer, const Wait& wait) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(shared_->mu);
      auto it = shared_->mailbox.find(key);
      if (it == shared_->mailbox.end()) {
        shared_->cv.wait_for(lock, std::chrono::milliseconds(50));
        it = shared_->mailbox.find(key);
      }
      if (it != shared_->mailbox.end()) {
        Fd fd = std::move(it->second);
        shared_->mailbox.erase(it);
        shared_->consumed.insert(key);
        return fd;
      }
    }
    wait_slice(wait, 0, "waiting for " + describe(peer) + " to connect");
  }
}

}  // namespace mlxj
