// The platform seam: every operating-system call that differs between Linux and
// macOS, behind one small interface. native/src/platform_linux.cpp and
// platform_darwin.cpp implement it; CMake builds the one for the target OS, and
// .ci/platforms compiles the other too, so that neither rots unseen. No other
// file of the core tests __linux__ or __APPLE__.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include <sys/socket.h>
#include <sys/types.h>

#include "mlxj/fd.h"

namespace mlxj::platform {

// Whether this is macOS (for messages and the backend probes).
bool macos();

// --- Sockets. Every descriptor is close-on-exec (a rank's child processes inherit none of
// them), and a send to a peer that is gone fails with EPIPE instead of raising SIGPIPE.
int stream_socket(int family, int type, int protocol);
// accept() of a non-blocking connection; -1 with errno as accept().
int accept_nonblocking(int listener);
// A pipe whose both ends are non-blocking; false with errno on failure.
bool nonblocking_pipe(int fds[2]);
ssize_t send_nosignal(int fd, const void* data, size_t n);
ssize_t sendmsg_nosignal(int fd, const msghdr* msg);
// Sends one byte of TCP urgent data (out of band: not part of the stream) without blocking.
ssize_t send_urgent(int fd, uint8_t byte);
// TCP keepalive of a connection: the first probe after `idle_s` silent seconds, then every
// `interval_s`, the connection given up after `count` unanswered probes.
void tune_keepalive(int fd, int idle_s, int interval_s, int count);
// While data or a zero-window probe waits for the peer's acknowledgement: milliseconds since
// its last one. -1 when nothing waits on the peer, or where the OS does not say (macOS).
int64_t unacknowledged_ms(int fd);

// --- Waiting on a word of shared memory, across processes. wait_word sleeps while *word ==
// seen, for at most `micros`, or until wake_word; it may return early (callers look again).
void wait_word(std::atomic<uint32_t>* word, uint32_t seen, int64_t micros);
void wake_word(std::atomic<uint32_t>* word);

// --- Anonymous shared segments (Linux memfd): in no filesystem, sealed at their size, opened
// by the peer through /proc/<pid>/fd/N. Where there are none (macOS) callers use named POSIX
// objects (shm_segment.cpp), and these two refuse with CommError.
bool has_anonymous_segments();
// A sized and sealed segment; `path` is where a process of this user opens it. Throws CommError.
Fd create_anonymous_segment(size_t size, std::string* path);
// The peer's segment at `path`, only if it is a memfd sealed against resizing. Throws CommError
// naming `locator` (Protocol for anything else).
Fd open_anonymous_segment(const std::string& path, const std::string& locator);

// --- Maps `size` bytes of the shared segment `fd`, read-write, with every page present: a
// page first touched during an op costs that op a fault or two (several µs at 4 KiB, issue 23).
// Linux: MAP_POPULATE; elsewhere each page is read once. nullptr with errno on failure.
void* map_shared_populated(int fd, size_t size);

// --- This machine: an id that differs between machines (Linux: this boot; macOS: the host UUID),
// or "" when the OS does not say.
std::string machine_id();

}  // namespace mlxj::platform
