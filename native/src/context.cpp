#include "mlxj/context.h"

#include <algorithm>
#include <deque>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <set>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/platform.h"
#include "mlxj/sha256.h"
#include "mlxj/wire.h"

namespace mlxj {

namespace {

constexpr const char* kMagic = kHandshakeMagic;
constexpr int kHandshakeMs = 5000;  // a silent stranger holds a handshake slot this long at most
constexpr int kMaxPending = 64;     // handshakes in progress at once; a flood evicts the oldest
constexpr int kFullBackoffMs = 50;  // pause accepting when out of descriptors (poll would spin)
constexpr size_t kQueryReplyBytes = 8;

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

  // One incoming connection between accept() and the verdict. The acceptor
  // drives all of them from one thread without blocking, so a stranger that
  // stalls costs one slot and one descriptor, never a thread.
  struct Pending {
    Fd fd;
    std::string who;
    Clock::time_point deadline;
    int stage = 0;  // 0 read greeting, 1 write proof, 2 read answer, 3 write verdict
    size_t done = 0;
    uint8_t buf[8 + 32 + 32];
    uint8_t ni[32], na[32];
    ConnHeader h{};
    uint8_t ok = 0;
    std::string why;
    std::vector<std::function<void(const std::string&)>> hooks;
    bool query = false;        // a peer's query (ConnKind::Query): answered in the verdict, then closed
    size_t verdict_bytes = 1;  // kQueryReplyBytes for a query
  };

  std::deque<Pending> pending;  // the acceptor thread's alone
  Clock::time_point resume_accepting{};

  static size_t stage_bytes(int stage) {
    static const size_t n[] = {8 + 32, 8 + 32 + 32, sizeof(ConnHeader) + 32, 1};
    return n[stage];
  }
  static bool stage_writes(int stage) { return stage == 1 || stage == 3; }

  // Moves a handshake as far as its socket allows. Returns false when it is over
  // (accepted into the mailbox, or refused and logged); the caller drops it.
  bool advance(Pending& p) {
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
          Digest ma = mac(token, 'A', p.ni, p.na, nullptr);
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

  // The verdict on the dialer's answer (in p.buf): its proof, its job's size, and
  // whether it is re-forming a group we still hold.
  void decide(Pending& p) {
    Answer answer = *parse_answer(p.buf, kAnswerBytes);  // any bytes of this size parse
    p.h = answer.header;
    if (!digest_equal(answer.mac, mac(token, 'I', p.ni, p.na, &p.h))) {
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

  // A query's verdict: 0x80 | answer, paused, 2 bytes 0, milliseconds since the last pause ended (all ones: never).
  void answer_query(Pending& p) {
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

  std::vector<std::pair<uint64_t, QueryHook>> queries;  // the groups' query hooks, with each group's id
  std::set<ConnKey> consumed;  // keys of the connections groups have taken
  // abort hooks of the groups, with each group's id
  std::vector<std::pair<uint64_t, std::function<void(const std::string&)>>> superseded;

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

  void log_once(const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!refused.insert("\n" + msg).second) return;
    }
    log(msg);
  }
};

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
  Digest mi = mac(shared_->token, 'I', ni, reply + 8, &h);
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
  return g && digest_equal(g->mac, mac(shared_->token, 'A', nonce, g->nonce, nullptr));
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
        Digest mi = mac(shared_->token, 'I', ni, reply + 8, &h);
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
