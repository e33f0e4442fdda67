#include "mlxj/shm_segment.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fcntl.h>
#include <mutex>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/wire.h"


namespace mlxj {

namespace {

constexpr uint64_t kMagic = 0x4d4c584a53484d31ull;  // "MLXJSHM1"
constexpr int kSlots = 64;  // named objects: /mlxj.<uid>.<slot>, held only during a handover

size_t segment_size(size_t ring_bytes) { return sizeof(SegmentLayout) + 2 * ring_bytes; }

std::string hex16(uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = "0123456789abcdef"[v & 15];
  return s;
}

std::string slot_name(int slot) { return "/mlxj." + std::to_string(::geteuid()) + "." + std::to_string(slot); }

// Named POSIX objects: always on macOS (no memfd there); on Linux only when
// MLX_JUPYTER_SHM=named, so that the tests cover the macOS mechanism too.
bool use_named() {
#if defined(__linux__)
  const char* v = std::getenv("MLX_JUPYTER_SHM");
  return v && std::strcmp(v, "named") == 0;
#else
  return true;
#endif
}

}  // namespace

SharedSegment::SharedSegment(void* base, size_t size, size_t ring_bytes, std::string locator, std::string name)
    : base_(base), size_(size), ring_bytes_(ring_bytes), locator_(std::move(locator)), name_(std::move(name)) {}

SharedSegment::~SharedSegment() {
  ::munmap(base_, size_);
  release_name();
}

void SharedSegment::release_name(bool peer_unlinked) {
  if (!name_.empty() && !peer_unlinked) ::shm_unlink(name_.c_str());
  name_.clear();
}

namespace {

void* map(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail(ErrorKind::Config, "cannot map shared memory: " + errno_text(errno));
  return p;
}

// A named object left by a creator that died during the handover: ours (uid),
// initialised, and its creator gone. Removes it and returns true.
bool remove_if_stale(const std::string& name) {
  Fd fd(::shm_open(name.c_str(), O_RDONLY, 0));
  if (!fd.valid()) return errno == ENOENT;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() || size_t(st.st_size) < sizeof(SegmentLayout)) return false;
  void* p = ::mmap(nullptr, sizeof(SegmentLayout), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return false;
  const auto* l = static_cast<const SegmentLayout*>(p);
  bool stale = l->magic == kMagic && l->creator_pid > 0 && ::kill(pid_t(l->creator_pid), 0) != 0 && errno == ESRCH;
  ::munmap(p, sizeof(SegmentLayout));
  if (stale) ::shm_unlink(name.c_str());
  return stale;
}

// A fresh named object of ours (O_EXCL, mode 0600); removes stale ones once per process.
Fd create_named(std::string* name) {
  static std::once_flag swept;
  std::call_once(swept, [] {
    for (int slot = 0; slot < kSlots; ++slot) remove_if_stale(slot_name(slot));
  });
  for (int slot = 0; slot < kSlots; ++slot) {
    *name = slot_name(slot);
    for (int attempt = 0; attempt < 2; ++attempt) {
      Fd fd(::shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
      if (fd.valid()) return fd;
      if (errno != EEXIST) fail(ErrorKind::Config, "shm_open(" + *name + ") failed: " + errno_text(errno));
      if (!remove_if_stale(*name)) break;  // in use by a live handover (or not ours): next slot
    }
  }
  fail(ErrorKind::Config, "all " + std::to_string(kSlots) + " shared-memory names /mlxj." +
                              std::to_string(::geteuid()) + ".* are in use");
}

}  // namespace

// Linux: an anonymous memfd, opened by the peer through /proc/<pid>/fd/N while
// we keep N open (until the peer's answer). Named objects (macOS): see create_named.
std::shared_ptr<SharedSegment> create_segment(size_t ring_bytes) {
  size_t size = segment_size(ring_bytes);
  uint64_t nonce;
  random_bytes(&nonce, sizeof nonce);
  std::string name, path;
  Fd fd;
  if (use_named()) {
    fd = create_named(&name);
    path = name;
  } else {
#if defined(__linux__)
    fd = Fd(::memfd_create("mlx_jupyter", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) fail(ErrorKind::Config, "memfd_create failed: " + errno_text(errno));
    path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd.get());
#endif
  }
  std::shared_ptr<SharedSegment> seg;
  try {
    if (::ftruncate(fd.get(), off_t(size)) != 0)
      fail(ErrorKind::Config, "cannot size shared memory: " + errno_text(errno));
#if defined(__linux__)
    // Sealed at its size: a shrink under the peer's mapping would be SIGBUS there.
    if (name.empty() && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      fail(ErrorKind::Config, "cannot seal shared memory: " + errno_text(errno));
#endif
    seg = std::make_shared<SharedSegment>(map(fd.get(), size), size, ring_bytes, path + "#" + hex16(nonce), name);
  } catch (...) {
    if (!name.empty()) ::shm_unlink(name.c_str());
    throw;
  }
  new (seg->layout()) SegmentLayout{kMagic, ring_bytes, nonce, int64_t(::getpid()), {}};
  if (name.empty()) seg->keep = std::move(fd);
  return seg;
}

std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t ring_bytes, bool last_opener) {
  size_t size = segment_size(ring_bytes);
  // The locator comes from an authenticated peer, but accept only our own shapes of it.
  std::string why;
  auto parsed = parse_locator(locator, unsigned(::geteuid()), &why);
  if (!parsed) fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': " + why);
  const std::string& path = parsed->path;
  uint64_t nonce = parsed->nonce;
  Fd fd;
  if (parsed->named) {
    fd = Fd(::shm_open(path.c_str(), O_RDWR, 0600));
    if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
    // Unlinked at once: from here on no name is left behind, whoever dies next.
    if (last_opener) ::shm_unlink(path.c_str());
  } else {
#if defined(__linux__)
    fd = Fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
    // Only memfds answer: never map an ordinary file. Unsealed, it could shrink under our mapping.
    int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0) fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not a memfd");
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
      fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not sealed against resizing");
#else
    fail(ErrorKind::Protocol, "refusing shared memory '" + locator + "': not one of ours");
#endif
  }
  // macOS rounds a shm object's size up to whole pages: at least, not exactly, our size.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || size_t(st.st_size) < size)
    fail(ErrorKind::Protocol, "the peer's shared memory has an unexpected size");
  if (st.st_uid != ::geteuid()) fail(ErrorKind::Protocol, "the peer's shared memory belongs to another user");
  auto seg = std::make_shared<SharedSegment>(map(fd.get(), size), size, ring_bytes, locator, "");
  const SegmentLayout* l = seg->layout();
  if (l->magic != kMagic || l->ring_bytes != ring_bytes || l->nonce != nonce)
    fail(ErrorKind::Protocol, "the peer's shared memory is not the mlx_jupyter segment it announced");
  return seg;
}

std::string segment_locator(const SharedSegment& s) { return s.locator(); }

void segment_release_name(SharedSegment& s, bool peer_opened) {
  s.release_name(peer_opened);
  s.keep.reset();
}

}  // namespace mlxj
