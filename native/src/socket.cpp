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
#include <cstdlib>
#if defined(__APPLE__)
#include <uuid/uuid.h>
#endif

#include "mlxj/errors.h"

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

Endpoint parse_endpoint(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw std::invalid_argument("'" + s + "' is not of the form ip:port");
  std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  for (char c : port)
    if (c < '0' || c > '9') throw std::invalid_argument("'" + s + "' has a non-numeric port");
  int p = port.size() > 5 ? 0 : std::stoi(port);
  if (p < 1 || p > 65535) throw std::invalid_argument("'" + s + "' has a port outside 1..65535");
  return {host, p};
}

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

std::chrono::milliseconds dead_peer_timeout() {
  static const std::chrono::milliseconds value = [] {
    const char* text = std::getenv("MLX_JUPYTER_DEAD_PEER_TIMEOUT");
    char* end = nullptr;
    double s = text && *text ? std::strtod(text, &end) : 0;
    if (!text || !*text || *end || !(s > 0) || s > 86400) s = 10;  // Python validates and explains
    return std::chrono::milliseconds(std::max<long long>(100, (long long)(s * 1000)));
  }();
  return value;
}

void configure_stream(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  // An idle connection (we wait to receive) probes after idle s and gives up after
  // count unanswered probes: idle + count * interval = the dead-peer timeout.
  // No TCP_USER_TIMEOUT: Linux applies it to a zero window too, so it would kill
  // the link to a live peer that is merely late to read (see Liveness instead).
  int total = int(std::max<long long>(2, (dead_peer_timeout().count() + 500) / 1000));  // whole seconds
  int interval = std::max(1, total / 5), count = std::max(1, total / interval - 1), idle = total - count * interval;
#if defined(__linux__)
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
#elif defined(__APPLE__)
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle);
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
#if defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
  (void)idle; (void)interval; (void)count;
}

bool Liveness::silent(int fd, Clock::time_point now) {
#if defined(__linux__) && defined(TCP_INFO)
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  // Unacknowledged data, or an unanswered zero-window probe: we wait on the peer's kernel.
  bool waiting = ti.tcpi_unacked > 0 || ti.tcpi_probes > 0;
  if (!waiting) {
    waiting_since_ = Clock::time_point{};
    return false;
  }
  if (waiting_since_ == Clock::time_point{}) waiting_since_ = now;
  // A probe is unanswered for one round trip even to a live peer: ask for 1 s of it.
  auto grace = std::min<Clock::duration>(dead_peer_timeout(), std::chrono::seconds(1));
  return ti.tcpi_last_ack_recv >= uint32_t(dead_peer_timeout().count()) && now - waiting_since_ >= grace;
#else
  (void)fd; (void)now;
  return false;
#endif
}

namespace {

int new_socket(int family, int type, int protocol) {
#ifdef SOCK_CLOEXEC
  return ::socket(family, type | SOCK_CLOEXEC, protocol);
#else
  int fd = ::socket(family, type, protocol);
  if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
#endif
}

}  // namespace

Fd listen_on(const Endpoint& ep) {
  AddrInfo res;
  resolve(ep, true, res);
  std::string last = "no address";
  for (addrinfo* a = res.ai; a; a = a->ai_next) {
    Fd fd(new_socket(a->ai_family, a->ai_socktype, a->ai_protocol));
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
    Fd fd(new_socket(a->ai_family, a->ai_socktype, a->ai_protocol));
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
#if defined(__linux__)
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2() failed: " + errno_text(errno));
#else
  if (::pipe(fds) != 0) throw std::runtime_error("pipe() failed: " + errno_text(errno));
  for (int fd : fds) {  // macOS has no pipe2: a fork in between may inherit these
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    set_nonblocking(fd);
  }
#endif
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

#ifdef MSG_NOSIGNAL
constexpr int kNoSignal = MSG_NOSIGNAL;
#else
constexpr int kNoSignal = 0;  // macOS: SO_NOSIGPIPE is set on the socket
#endif

bool io_exact(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, std::string* why,
              const std::function<void()>& between) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = write ? ::send(fd, p, n, kNoSignal) : ::recv(fd, p, n, 0);
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

std::string host_identity() {
  if (const char* forced = std::getenv("MLX_JUPYTER_HOST_ID")) return forced;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string id = std::string(name) + "/uid" + std::to_string(::getuid()) + "/";
#if defined(__linux__)
  Fd f(::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC));
  char boot[64] = {};
  if (f.valid() && ::read(f.get(), boot, sizeof boot - 1) > 0) id += boot;
#elif defined(__APPLE__)
  uuid_t uuid;
  timespec wait{0, 0};
  if (::gethostuuid(uuid, &wait) == 0) {
    for (unsigned char c : uuid) id += "0123456789abcdef"[c >> 4], id += "0123456789abcdef"[c & 15];
  }
#endif
  return id;
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
