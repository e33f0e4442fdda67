// The platform seam on macOS (platform.h): no accept4, pipe2 or MSG_NOSIGNAL (flags set
// after the call, SO_NOSIGPIPE on every socket instead), TCP_KEEPALIVE for the idle time,
// no cross-process futex (the sleeper naps and looks again), no memfd (named POSIX objects,
// shm_segment.cpp), and the host UUID as the machine's id.
#include "mlxj/platform.h"

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "mlxj/errors.h"
#include "mlxj/socket.h"

namespace mlxj::platform {

namespace {

// What Linux sets atomically with the call: close-on-exec, and no SIGPIPE on a send to a gone peer.
int prepared(int fd) {
  if (fd < 0) return fd;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
  return fd;
}

}  // namespace

bool macos() { return true; }

int stream_socket(int family, int type, int protocol) { return prepared(::socket(family, type, protocol)); }

int accept_nonblocking(int listener) {
  int c = prepared(::accept(listener, nullptr, nullptr));
  if (c >= 0) set_nonblocking(c);
  return c;
}

bool nonblocking_pipe(int fds[2]) {
  if (::pipe(fds) != 0) return false;
  for (int i = 0; i < 2; ++i) {  // a fork in between may inherit these: there is no pipe2
    ::fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    set_nonblocking(fds[i]);
  }
  return true;
}

ssize_t send_nosignal(int fd, const void* data, size_t n) { return ::send(fd, data, n, 0); }

ssize_t sendmsg_nosignal(int fd, const msghdr* msg) { return ::sendmsg(fd, msg, 0); }

ssize_t send_urgent(int fd, uint8_t byte) { return ::send(fd, &byte, 1, MSG_OOB | MSG_DONTWAIT); }

void tune_keepalive(int fd, int idle_s, int interval_s, int count) {
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

int64_t unacknowledged_ms(int) { return -1; }  // keepalive alone notices a vanished host

void wait_word(std::atomic<uint32_t>* word, uint32_t seen, int64_t micros) {
  if (word->load() == seen) ::usleep(useconds_t(std::min<int64_t>(micros, 200)));
}

void wake_word(std::atomic<uint32_t>*) {}

void* map_shared_populated(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  // No MAP_POPULATE: a read of each page maps it (its contents are the creator's, left as they are).
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto* bytes = static_cast<const volatile uint8_t*>(p);
  for (size_t at = 0; at < size; at += size_t(page > 0 ? page : 4096)) (void)bytes[at];
  return p;
}

bool has_anonymous_segments() { return false; }

Fd create_anonymous_segment(size_t, std::string*) {
  fail(ErrorKind::Config, "macOS has no anonymous shared memory (memfd): use a named segment");
}

Fd open_anonymous_segment(const std::string&, const std::string& locator) {
  fail(ErrorKind::Protocol, "refusing shared memory '" + locator + "': not one of ours");
}

std::string machine_id() {
  uuid_t uuid;
  timespec wait{0, 0};
  if (::gethostuuid(uuid, &wait) != 0) return "";
  std::string id;
  for (unsigned char c : uuid) id += "0123456789abcdef"[c >> 4], id += "0123456789abcdef"[c & 15];
  return id;
}

}  // namespace mlxj::platform
