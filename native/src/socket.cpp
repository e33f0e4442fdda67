#include "mlxj/socket.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdexcept>
#include <sys/types.h>
#include <sys/random.h>  // getentropy on macOS (and Linux)
#include <unistd.h>
#include <arpa/inet.h>

#include "mlxj/errors.h"
#include "mlxj/platform.h"

namespace mlxj {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}
Fd::~Fd() { reset(); }
void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int err) { return std::strerror(err); }

namespace {

struct AddrInfo {
  addrinfo* ai = nullptr;
  ~AddrInfo() { if (ai) freeaddrinfo(ai); }
};

void resolve(const Endpoint& ep, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  int rc = getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &out.ai);
  if (rc != 0 || !out.ai)
    fail(ErrorKind::Config, "cannot resolve '" + ep.host + "': " + gai_strerror(rc));
}

}  // namespace

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void configure_stream(int fd, std::chrono::milliseconds dead_peer) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  // An idle connection (we wait to receive) probes after idle s and gives up after
  // count unanswered probes: idle + count * interval = the dead-peer timeout.
  // No TCP_USER_TIMEOUT: Linux applies it to a zero window too, so it would kill
  // the link to a live peer that is merely late to read (see Liveness instead).
  int total = int(std::max<long long>(2, (dead_peer.count() + 500) / 1000));  // whole seconds
  int interval = std::max(1, total / 5), count = std::max(1, total / interval - 1), idle = total - count * interval;
  platform::tune_keepalive(fd, idle, interval, count);
}

bool Liveness::silent(int fd, Clock::time_point now) {
  int64_t since_ack = platform::unacknowledged_ms(fd);
  if (since_ack < 0) {
    waiting_since_ = Clock::time_point{};
    return false;
  }
  if (waiting_since_ == Clock::time_point{}) waiting_since_ = now;
  // A probe is unanswered for one round trip even to a live peer: ask for 1 s of it.
  auto grace = std::min<Clock::duration>(dead_peer_, std::chrono::seconds(1));
  return since_ack >= dead_peer_.count() && now - waiting_since_ >= grace;
}

Fd listen_on(const Endpoint& ep) {
  AddrInfo res;
  resolve(ep, true, res);
  std::string last = "no address";
  for (addrinfo* a = res.ai; a; a = a->ai_next) {
    Fd fd(platform::stream_socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (!fd.valid()) { last = errno_text(errno); continue; }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      last = errno_text(errno);
      continue;
    }
    set_nonblocking(fd.get());
    return fd;
  }
  fail(ErrorKind::Config, "cannot listen on " + ep.str() + ": " + last +
                              " (is another job using this port? choose another starting port)");
}

Fd try_connect(const Endpoint& ep, Clock::time_point deadline, std::string* why) {
  AddrInfo res;
  resolve(ep, false, res);
  for (addrinfo* a = res.ai; a; a = a->ai_next) {
    Fd fd(platform::stream_socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (!fd.valid()) { *why = errno_text(errno); continue; }
    set_nonblocking(fd.get());
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) { *why = errno_text(errno); continue; }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd.get(), POLLOUT, 0};
    int rc = ::poll(&p, 1, int(std::max<long long>(0, std::min<long long>(left, 1000))));
    if (rc <= 0) { *why = "connection attempt timed out"; continue; }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) return fd;
    *why = errno_text(err);
  }
  return Fd();
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "unknown";
  return Endpoint{host, std::atoi(serv)}.str();  // an IPv6 peer in brackets
}

Waker::Waker() {
  int fds[2];
  if (!platform::nonblocking_pipe(fds)) throw std::runtime_error("pipe() failed: " + errno_text(errno));
  read_ = Fd(fds[0]);
  write_ = Fd(fds[1]);
}

void Waker::wake() const {
  char c = 1;
  [[maybe_unused]] auto n = ::write(write_.get(), &c, 1);  // full pipe = already awake
}

void Waker::drain() const {
  char buf[64];
  while (::read(read_.get(), buf, sizeof buf) > 0) {
  }
}

bool io_exact(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, std::string* why,
              const std::function<void()>& between) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = write ? platform::send_nosignal(fd, p, n) : ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r == 0) { *why = "connection closed during the handshake"; return false; }
    if (!try_again(errno)) { *why = errno_text(errno); return false; }
    if (between) between();
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) { *why = "no answer before the deadline"; return false; }
    pollfd pfd{fd, short(write ? POLLOUT : POLLIN), 0};
    ::poll(&pfd, 1, int(std::min<long long>(left, 100)));
  }
  return true;
}

std::string host_identity(const std::string& forced) {
  if (!forced.empty()) return forced;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return std::string(name) + "/uid" + std::to_string(::getuid()) + "/" + platform::machine_id();
}

// getentropy needs no file descriptor (a rank out of descriptors can still
// handshake) and serves at most 256 bytes per call.
void random_bytes(void* out, size_t size) {
  auto* p = static_cast<uint8_t*>(out);
  while (size > 0) {
    size_t n = std::min<size_t>(size, 256);
    if (::getentropy(p, n) != 0) throw std::runtime_error("getentropy failed: " + errno_text(errno));
    p += n;
    size -= n;
  }
}

}  // namespace mlxj
