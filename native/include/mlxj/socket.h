// POSIX socket helpers: an owning fd, addresses, and the platform seam for
// TCP options (Linux and macOS differ in keepalive/user-timeout/SIGPIPE).
#pragma once
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <sys/socket.h>

namespace mlxj {

using Clock = std::chrono::steady_clock;

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

struct Endpoint {
  std::string host;
  int port = 0;
  // "host:port", an IPv6 address in brackets ("[::1]:5000"), as parse_endpoint reads it.
  std::string str() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

// Splits "ip:port" (IPv6 as "[::1]:5000"); throws std::invalid_argument.
Endpoint parse_endpoint(const std::string& s);

// Listens on the endpoint (SO_REUSEADDR, non-blocking); throws CommError(Config).
Fd listen_on(const Endpoint& ep);
// One non-blocking connect attempt, waited on until the deadline; returns an
// invalid Fd when the peer is not there yet (refused/unreachable), so the
// caller can retry. Throws CommError(Config) for an unresolvable host.
Fd try_connect(const Endpoint& ep, Clock::time_point deadline, std::string* why);

// TCP_NODELAY, keepalive that notices a dead host within dead_peer_timeout(), no SIGPIPE.
void configure_stream(int fd);
// How long a peer's host may stay silent (no TCP acknowledgement, no keepalive
// answer) before it counts as dead: MLX_JUPYTER_DEAD_PEER_TIMEOUT seconds, default 10.
// A live peer's kernel acknowledges even when its process is busy elsewhere, so
// this bounds the detection of vanished hosts only, never how late a peer may be.
std::chrono::milliseconds dead_peer_timeout();

// Notices, while data or a window probe waits for an acknowledgement, that the
// peer's host stopped answering (Linux TCP_INFO; elsewhere keepalive alone).
class Liveness {
 public:
  // True once the peer's kernel has acknowledged nothing for dead_peer_timeout()
  // although we have been waiting on it. Call periodically while blocked.
  bool silent(int fd, Clock::time_point now);

 private:
  Clock::time_point waiting_since_{};
};
void set_nonblocking(int fd);
std::string peer_name(int fd);

// A self-pipe to wake a poll() from another thread.
class Waker {
 public:
  Waker();
  void wake() const;
  void drain() const;
  int fd() const { return read_.get(); }

 private:
  Fd read_, write_;
};

// Reads or writes exactly n bytes of a non-blocking socket before the deadline;
// false (with the reason) on EOF, error or timeout. `between` runs before each
// wait (it may throw, e.g. for an abort or Ctrl-C).
bool io_exact(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, std::string* why,
              const std::function<void()>& between = {});

// Identifies this machine (and user), so peers on the same host can share memory.
// MLX_JUPYTER_HOST_ID overrides it (tests use that to fake several hosts on one).
std::string host_identity();

void random_bytes(void* out, size_t size);
std::string errno_text(int err);
// A non-blocking call that found nothing to do now, or was interrupted: try again later.
inline bool try_again(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace mlxj
