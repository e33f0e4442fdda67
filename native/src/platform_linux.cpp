// The platform seam on Linux (platform.h): accept4, pipe2, MSG_NOSIGNAL, TCP_INFO, the
// shared futex, sealed memfds and the boot id.
#include "mlxj/platform.h"

#include <cerrno>
#include <climits>
#include <ctime>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/socket.h"

namespace mlxj::platform {

bool macos() { return false; }

int stream_socket(int family, int type, int protocol) { return ::socket(family, type | SOCK_CLOEXEC, protocol); }

int accept_nonblocking(int listener) { return ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK); }

bool nonblocking_pipe(int fds[2]) { return ::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0; }

ssize_t send_nosignal(int fd, const void* data, size_t n) { return ::send(fd, data, n, MSG_NOSIGNAL); }

ssize_t sendmsg_nosignal(int fd, const msghdr* msg) { return ::sendmsg(fd, msg, MSG_NOSIGNAL); }

ssize_t send_urgent(int fd, uint8_t byte) { return ::send(fd, &byte, 1, MSG_OOB | MSG_NOSIGNAL | MSG_DONTWAIT); }

void tune_keepalive(int fd, int idle_s, int interval_s, int count) {
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

int64_t unacknowledged_ms(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -1;
  // Unacknowledged data, or an unanswered zero-window probe: we wait on the peer's kernel.
  if (ti.tcpi_unacked == 0 && ti.tcpi_probes == 0) return -1;
  return int64_t(ti.tcpi_last_ack_recv);
}

void wait_word(std::atomic<uint32_t>* word, uint32_t seen, int64_t micros) {
  timespec ts{time_t(micros / 1000000), long(micros % 1000000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void wake_word(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void* map_shared_populated(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

bool has_anonymous_segments() { return true; }

Fd create_anonymous_segment(size_t size, std::string* path) {
  Fd fd(::memfd_create("mlx_jupyter", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) fail(ErrorKind::Config, "memfd_create failed: " + errno_text(errno));
  if (::ftruncate(fd.get(), off_t(size)) != 0) fail(ErrorKind::Config, "cannot size shared memory: " + errno_text(errno));
  // Sealed at its size: a shrink under the peer's mapping would be SIGBUS there.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    fail(ErrorKind::Config, "cannot seal shared memory: " + errno_text(errno));
  *path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd.get());
  return fd;
}

Fd open_anonymous_segment(const std::string& path, const std::string& locator) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
  // Only memfds answer: never map an ordinary file. Unsealed, it could shrink under our mapping.
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not a memfd");
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not sealed against resizing");
  return fd;
}

std::string machine_id() {
  Fd f(::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC));
  char boot[64] = {};
  if (f.valid() && ::read(f.get(), boot, sizeof boot - 1) > 0) return boot;
  return "";
}

}  // namespace mlxj::platform
