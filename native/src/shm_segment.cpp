#include "mlxj/shm_segment.h"

#include <cerrno>
#include <fcntl.h>
#include <mutex>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/platform.h"
#include "mlxj/socket.h"
#include "mlxj/wire.h"

namespace mlxj {

namespace {

constexpr uint64_t kMagic = 0x4d4c584a53484d31ull;  // "MLXJSHM1"
constexpr int kSlots = 64;  // named objects: /mlxj.<uid>.<slot>, held only during a handover

size_t segment_size(size_t payload_bytes) { return sizeof(SegmentHeader) + payload_bytes; }

std::string hex16(uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = "0123456789abcdef"[v & 15];
  return s;
}

std::string slot_name(int slot) { return "/mlxj." + std::to_string(::geteuid()) + "." + std::to_string(slot); }

}  // namespace

SharedSegment::SharedSegment(void* base, size_t size, std::string locator, std::string name, Fd keep)
    : base_(base), size_(size), locator_(std::move(locator)), name_(std::move(name)), keep_(std::move(keep)) {}

SharedSegment::~SharedSegment() {
  ::munmap(base_, size_);
  release_name();
}

void SharedSegment::release_name(bool peer_unlinked) {
  if (!name_.empty() && !peer_unlinked) ::shm_unlink(name_.c_str());
  name_.clear();
  keep_.reset();
}

namespace {

void* map(int fd, size_t size) {
  void* p = platform::map_shared_populated(fd, size);
  if (!p) fail(ErrorKind::Config, "cannot map shared memory: " + errno_text(errno));
  return p;
}

// A named object left by a creator that died during the handover: ours (uid),
// initialised, and its creator gone. Removes it and returns true.
bool remove_if_stale(const std::string& name) {
  Fd fd(::shm_open(name.c_str(), O_RDONLY, 0));
  if (!fd.valid()) return errno == ENOENT;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() || size_t(st.st_size) < sizeof(SegmentHeader)) return false;
  void* p = ::mmap(nullptr, sizeof(SegmentHeader), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return false;
  const auto* h = static_cast<const SegmentHeader*>(p);
  bool stale = h->magic == kMagic && h->creator_pid > 0 && ::kill(pid_t(h->creator_pid), 0) != 0 && errno == ESRCH;
  ::munmap(p, sizeof(SegmentHeader));
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

// Anonymous where the OS has such segments (Linux memfd, opened by the peer through
// /proc/<pid>/fd/N while we keep N open until its answer); named objects otherwise
// (create_named). Either way the OS hands out zeroed pages.
std::shared_ptr<SharedSegment> create_segment(size_t payload_bytes, bool named) {
  size_t size = segment_size(payload_bytes);
  uint64_t nonce;
  random_bytes(&nonce, sizeof nonce);
  std::string name, path;
  Fd fd;
  if (named || !platform::has_anonymous_segments()) {
    fd = create_named(&name);
    path = name;
    if (::ftruncate(fd.get(), off_t(size)) != 0) {
      int err = errno;
      ::shm_unlink(name.c_str());
      fail(ErrorKind::Config, "cannot size shared memory: " + errno_text(err));
    }
  } else {
    fd = platform::create_anonymous_segment(size, &path);
  }
  std::shared_ptr<SharedSegment> seg;
  try {
    void* base = map(fd.get(), size);
    Fd keep = name.empty() ? std::move(fd) : Fd();  // the memfd stays open until the peer has opened it
    seg = std::make_shared<SharedSegment>(base, size, path + "#" + hex16(nonce), name, std::move(keep));
  } catch (...) {
    if (!name.empty()) ::shm_unlink(name.c_str());
    throw;
  }
  new (seg->header()) SegmentHeader{kMagic, payload_bytes, nonce, int64_t(::getpid())};
  return seg;
}

std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t payload_bytes, bool last_opener) {
  size_t size = segment_size(payload_bytes);
  // The locator comes from an authenticated peer, but accept only our own shapes of it.
  std::string why;
  auto parsed = parse_locator(locator, unsigned(::geteuid()), &why);
  if (!parsed) fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': " + why);
  const std::string& path = parsed->path;
  Fd fd;
  if (parsed->named) {
    fd = Fd(::shm_open(path.c_str(), O_RDWR, 0600));
    if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
    // Unlinked at once: from here on no name is left behind, whoever dies next.
    if (last_opener) ::shm_unlink(path.c_str());
  } else {
    fd = platform::open_anonymous_segment(path, locator);
  }
  // macOS rounds a shm object's size up to whole pages: at least, not exactly, our size.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || size_t(st.st_size) < size)
    fail(ErrorKind::Protocol, "the peer's shared memory has an unexpected size");
  if (st.st_uid != ::geteuid()) fail(ErrorKind::Protocol, "the peer's shared memory belongs to another user");
  auto seg = std::make_shared<SharedSegment>(map(fd.get(), size), size, locator, "");
  const SegmentHeader* h = seg->header();
  if (h->magic != kMagic || h->payload_bytes != payload_bytes || h->nonce != parsed->nonce)
    fail(ErrorKind::Protocol, "the peer's shared memory is not the mlx_jupyter segment it announced");
  return seg;
}

}  // namespace mlxj
