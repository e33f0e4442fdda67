// POSIX socket helpers: addresses, listening and connecting, TCP options, a waker,
// exact reads and writes. What differs between Linux and macOS is in platform.h.
#pragma once
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <sys/socket.h>

#include "mlxj/fd.h"

namespace mlxj {

using Clock = std::chrono::steady_clock;

// An address as Python parsed it (mlx_jupyter.vocab.hosts.split_addr): an IP or a host name, a port.
struct Endpoint {
  std::string host;
  int port = 0;
  std::string str() const {
    return (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + std::to_string(port);
  }
};

// Listens on the endpoint (SO_REUSEADDR, non-blocking); throws CommError(Config).
Fd listen_on(const Endpoint& ep);
// One non-blocking connect attempt, waited on until the deadline; returns an
// invalid Fd when the peer is not there yet (refused/unreachable), so the
// caller can retry. Throws CommError(Config) for an unresolvable host.
Fd try_connect(const Endpoint& ep, Clock::time_point deadline, std::string* why);

// TCP_NODELAY, and keepalive that notices a dead host within `dead_peer` (CoreOptions:
// how long a peer's host may stay silent, no TCP acknowledgement and no keepalive answer,
// before it counts as dead; a live peer's kernel acknowledges even when its process is
// busy elsewhere, so this bounds the detection of vanished hosts only).
void configure_stream(int fd, std::chrono::milliseconds dead_peer);

// Notices, while data or a window probe waits for an acknowledgement, that the
// peer's host stopped answering (where the OS tells: platform::unacknowledged_ms).
class Liveness {
 public:
  explicit Liveness(std::chrono::milliseconds dead_peer = std::chrono::seconds(10)) : dead_peer_(dead_peer) {}
  // True once the peer's kernel has acknowledged nothing for the dead-peer timeout
  // although we have been waiting on it. Call periodically while blocked.
  bool silent(int fd, Clock::time_point now);

 private:
  std::chrono::milliseconds dead_peer_;
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

// Identifies this machine (and user), so peers on the same host can share memory;
// `forced` (CoreOptions::host_id), when not empty, instead (tests fake several hosts on one).
std::string host_identity(const std::string& forced = "");

void random_bytes(void* out, size_t size);
std::string errno_text(int err);
// A non-blocking call that found nothing to do now, or was interrupted: try again later.
inline bool try_again(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace mlxj
