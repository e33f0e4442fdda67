#include "mlxj/context.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <iostream>
#include <set>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/sha256.h"

#ifdef MSG_NOSIGNAL
#define MSG_NOSIGNAL_PORTABLE MSG_NOSIGNAL
#else
#define MSG_NOSIGNAL_PORTABLE 0  // macOS: SO_NOSIGPIPE is set on the socket
#endif

namespace mlxj {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'X', 'J', 'H', 'S', '0', '1'};
constexpr int kHandshakeMs = 5000;  // a silent stranger holds a handshake thread this long at most

struct ConnHeader {
  uint64_t group;
  uint32_t initiator, kind, index, world_size;
};
static_assert(sizeof(ConnHeader) == 24, "wire layout");

Digest mac(const std::string& token, char role, const uint8_t* ni, const uint8_t* na, const ConnHeader* h) {
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

}  // namespace

struct Context::Shared {
  int rank = 0;
  int world_size = 0;
  std::string token;
  bool verbose = false;
  std::mutex mu;
  std::condition_variable cv;
  std::map<ConnKey, Fd> mailbox;

  void log(const std::string& msg) const {
    std::cerr << "[mlx_jupyter rank " << rank << "] " << msg << std::endl;
  }

  // The acceptor's side of the challenge-response; on success the connection
  // goes into the mailbox, otherwise it is refused and logged.
  void handshake(Fd fd) {
    std::string who = peer_name(fd.get()), why;
    auto deadline = Clock::now() + std::chrono::milliseconds(kHandshakeMs);
    uint8_t hello[8 + 32], reply[8 + 32 + 32], ni[32], na[32];
    if (!io_exact(fd.get(), hello, sizeof hello, false, deadline, &why)) return refuse(who, why);
    if (std::memcmp(hello, kMagic, 8) != 0) return refuse(who, "not an mlx_jupyter peer (bad greeting)");
    std::memcpy(ni, hello + 8, 32);
    random_bytes(na, 32);
    Digest ma = mac(token, 'A', ni, na, nullptr);
    std::memcpy(reply, kMagic, 8);
    std::memcpy(reply + 8, na, 32);
    std::memcpy(reply + 40, ma.data(), 32);
    if (!io_exact(fd.get(), reply, sizeof reply, true, deadline, &why)) return refuse(who, why);
    uint8_t answer[sizeof(ConnHeader) + 32];
    if (!io_exact(fd.get(), answer, sizeof answer, false, deadline, &why)) return refuse(who, why);
    ConnHeader h;
    std::memcpy(&h, answer, sizeof h);
    Digest got;
    std::memcpy(got.data(), answer + sizeof h, 32);
    uint8_t ok = 0;
    if (!digest_equal(got, mac(token, 'I', ni, na, &h))) {
      why = "authentication failed (its MLX_JUPYTER_TOKEN differs: not part of this job)";
    } else if (h.world_size != uint32_t(world_size) || h.initiator >= uint32_t(world_size)) {
      why = "it belongs to a job of " + std::to_string(h.world_size) + " ranks, this one has " + std::to_string(world_size);
    } else {
      ok = 1;
    }
    ConnKey key{h.group, h.initiator, h.kind, h.index};
    std::vector<std::function<void(const std::string&)>> hooks;
    if (ok) {
      std::lock_guard<std::mutex> lock(mu);
      // A connection we already have again: that peer left our group and is forming a new
      // one. Refuse it (the peer retries until we re-form too) and abort what we hold.
      if (consumed.count(key)) {
        ok = 0;
        why = "rank " + std::to_string(h.initiator) + " is forming a new group while this rank still holds the old one";
        hooks = superseded;
      }
    }
    io_exact(fd.get(), &ok, 1, true, deadline, &why);
    for (auto& hook : hooks)
      hook("rank " + std::to_string(h.initiator) + " left this group to form a new one");
    if (!ok) return refuse(who, why);
    if (verbose) log("accepted rank " + std::to_string(h.initiator) + " from " + who);
    std::lock_guard<std::mutex> lock(mu);
    mailbox[key] = std::move(fd);
    cv.notify_all();
  }

  std::set<ConnKey> consumed;  // keys of the connections groups have taken
  std::vector<std::function<void(const std::string&)>> superseded;  // abort hooks of the groups

  // Logs each (address, reason) once, so a retrying stranger cannot flood the log.
  void refuse(const std::string& who, const std::string& why) {
    std::string host = who.substr(0, who.rfind(':'));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!refused.insert(host + "\n" + why).second) return;
    }
    log("refused a connection from " + who + ": " + why + " (repeats from this address are not logged)");
  }
  std::set<std::string> refused;
};

Context::Context(int rank, std::vector<std::vector<Endpoint>> addresses, std::string token, bool verbose)
    : rank_(rank), addresses_(std::move(addresses)), shared_(std::make_shared<Shared>()) {
  shared_->rank = rank;
  shared_->world_size = int(addresses_.size());
  shared_->token = std::move(token);
  shared_->verbose = verbose;
  if (size() > 1) {
    for (const auto& ep : addresses_[rank]) listeners_.push_back(listen_on(ep));
    acceptor_ = std::thread([this] { accept_loop(); });
  }
}

Context::~Context() { close(); }

void Context::close() {
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

void Context::on_superseded(std::function<void(const std::string&)> hook) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->superseded.push_back(std::move(hook));
}

void Context::accept_loop() {
  std::vector<pollfd> fds;
  for (auto& l : listeners_) fds.push_back(pollfd{l.get(), POLLIN, 0});
  fds.push_back(pollfd{stop_.fd(), POLLIN, 0});
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds.back().revents) return;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      int c = ::accept(fds[i].fd, nullptr, nullptr);
      if (c < 0) continue;
      Fd conn(c);
      ::fcntl(c, F_SETFD, FD_CLOEXEC);
      set_nonblocking(c);
      configure_stream(c);
      // One short-lived thread per handshake: a silent stranger cannot delay peers.
      std::thread([shared = shared_, conn = std::move(conn)]() mutable { shared->handshake(std::move(conn)); }).detach();
    }
  }
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
  if (std::memcmp(reply, kMagic, 8) != 0) return false;
  Digest got;
  std::memcpy(got.data(), reply + 40, 32);
  return digest_equal(got, mac(shared_->token, 'A', nonce, reply + 8, nullptr));
}

Fd Context::connect(int peer, size_t addr_index, const ConnKey& key, const Wait& wait) {
  const Endpoint& ep = addresses_[peer][addr_index];
  std::string why = "not listening yet", logged;
  int backoff = 5;
  auto log_once = [&](const std::string& msg) {
    if (msg != logged) log("refusing " + describe(peer) + " at " + ep.str() + ": " + msg);
    logged = msg;
  };
  for (;;) {
    auto attempt_deadline = std::min(wait.deadline, Clock::now() + std::chrono::seconds(1));
    Fd fd = try_connect(ep, attempt_deadline, &why);
    if (fd.valid()) {
      configure_stream(fd.get());
      auto deadline = std::min(wait.deadline, Clock::now() + std::chrono::milliseconds(kHandshakeMs));
      uint8_t hello[8 + 32], reply[8 + 32 + 32], ni[32];
      random_bytes(ni, 32);
      std::memcpy(hello, kMagic, 8);
      std::memcpy(hello + 8, ni, 32);
      std::string err;
      if (!io_exact(fd.get(), hello, sizeof hello, true, deadline, &err) ||
          !io_exact(fd.get(), reply, sizeof reply, false, deadline, &err)) {
        why = "handshake failed: " + err;
      } else if (!greeted_by_peer(reply, ni)) {
        // Not fatal: the real peer may still take over this address; keep trying until the deadline.
        bool ours = std::memcmp(reply, kMagic, 8) == 0;
        why = ours ? "the process listening there failed authentication (its MLX_JUPYTER_TOKEN differs: another job)"
                   : "the process listening there is not an mlx_jupyter rank (bad greeting): check the hostfile and port offset";
        if (ours) {  // finish the exchange so that the other side logs why, too
          ConnHeader h{key.group, key.initiator, key.kind, key.index, uint32_t(size())};
          Digest mi = mac(shared_->token, 'I', ni, reply + 8, &h);
          uint8_t answer[sizeof h + 32];
          std::memcpy(answer, &h, sizeof h);
          std::memcpy(answer + sizeof h, mi.data(), 32);
          io_exact(fd.get(), answer, sizeof answer, true, deadline, &err);
        }
        log_once(why);
      } else {
        ConnHeader h{key.group, key.initiator, key.kind, key.index, uint32_t(size())};
        Digest mi = mac(shared_->token, 'I', ni, reply + 8, &h);
        uint8_t answer[sizeof h + 32];
        std::memcpy(answer, &h, sizeof h);
        std::memcpy(answer + sizeof h, mi.data(), 32);
        uint8_t ok = 0;
        if (io_exact(fd.get(), answer, sizeof answer, true, deadline, &err) &&
            io_exact(fd.get(), &ok, 1, false, deadline, &err) && ok == 1)
          return fd;
        why = ok == 0 && err.empty() ? "refused by the peer (token or world size differ; see its log)" : "handshake failed: " + err;
      }
    }
    wait_slice(wait, backoff, "connecting to " + describe(peer) + " at " + ep.str() + " (" + why + ")");
    backoff = std::min(backoff * 2, 100);
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
