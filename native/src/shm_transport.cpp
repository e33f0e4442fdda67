#include "mlxj/shm_transport.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fcntl.h>
#include <mutex>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlxj/errors.h"
#include "mlxj/reduce.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

namespace mlxj {

namespace {

constexpr uint64_t kMagic = 0x4d4c584a53484d31ull;  // "MLXJSHM1"
constexpr int kSlots = 64;  // named objects: /mlxj.<uid>.<slot>, held only during a handover

// Shared state of one direction; each counter on its own cache line.
struct alignas(64) RingState {
  alignas(64) std::atomic<uint64_t> written{0};  // bytes the producer has published
  alignas(64) std::atomic<uint64_t> read{0};     // bytes the consumer has released
  alignas(64) std::atomic<uint32_t> consumer_waiting{0};
  alignas(64) std::atomic<uint32_t> producer_waiting{0};
};

struct Layout {
  uint64_t magic;
  uint64_t ring_bytes;
  uint64_t nonce;       // also in the locator: the peer maps only the segment it was told about
  int64_t creator_pid;  // a named object whose creator is gone is stale
  RingState dir[2];     // 0: creator -> opener, 1: opener -> creator
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process atomics must be lock-free");

size_t segment_size(size_t ring_bytes) { return sizeof(Layout) + 2 * ring_bytes; }

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

class SharedSegment {
 public:
  SharedSegment(void* base, size_t size, std::string locator, std::string name)
      : base_(base), size_(size), locator_(std::move(locator)), name_(std::move(name)) {}
  ~SharedSegment() {
    ::munmap(base_, size_);
    release_name();
  }
  Layout* layout() const { return static_cast<Layout*>(base_); }
  uint8_t* ring(int d) const {
    return static_cast<uint8_t*>(base_) + sizeof(Layout) + size_t(d) * layout()->ring_bytes;
  }
  const std::string& locator() const { return locator_; }
  // The peer unlinks the name once it has opened it; we do when it did not.
  void release_name(bool peer_unlinked = false) {
    if (!name_.empty() && !peer_unlinked) ::shm_unlink(name_.c_str());
    name_.clear();
  }
  Fd keep;  // Linux memfd: open until the peer has opened it through /proc

 private:
  void* base_;
  size_t size_;
  std::string locator_, name_;
};

namespace {

void* map(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail(ErrorKind::Config, "cannot map shared memory: " + errno_text(errno));
  return p;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// A named object left by a creator that died during the handover: ours (uid),
// initialised, and its creator gone. Removes it and returns true.
bool remove_if_stale(const std::string& name) {
  Fd fd(::shm_open(name.c_str(), O_RDONLY, 0));
  if (!fd.valid()) return errno == ENOENT;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() || size_t(st.st_size) < sizeof(Layout)) return false;
  void* p = ::mmap(nullptr, sizeof(Layout), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return false;
  const auto* l = static_cast<const Layout*>(p);
  bool stale = l->magic == kMagic && l->creator_pid > 0 && ::kill(pid_t(l->creator_pid), 0) != 0 && errno == ESRCH;
  ::munmap(p, sizeof(Layout));
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
    fd = Fd(::memfd_create("mlx_jupyter", MFD_CLOEXEC));
    if (!fd.valid()) fail(ErrorKind::Config, "memfd_create failed: " + errno_text(errno));
    path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd.get());
#endif
  }
  std::shared_ptr<SharedSegment> seg;
  try {
    if (::ftruncate(fd.get(), off_t(size)) != 0)
      fail(ErrorKind::Config, "cannot size shared memory: " + errno_text(errno));
    seg = std::make_shared<SharedSegment>(map(fd.get(), size), size, path + "#" + hex16(nonce), name);
  } catch (...) {
    if (!name.empty()) ::shm_unlink(name.c_str());
    throw;
  }
  new (seg->layout()) Layout{kMagic, ring_bytes, nonce, int64_t(::getpid()), {}};
  if (name.empty()) seg->keep = std::move(fd);
  return seg;
}

std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t ring_bytes) {
  size_t size = segment_size(ring_bytes);
  // The locator comes from an authenticated peer, but accept only our own shapes of it.
  auto hash = locator.rfind('#');
  std::string path = locator.substr(0, hash), nonce_text = hash == std::string::npos ? "" : locator.substr(hash + 1);
  if (nonce_text.size() != 16 || nonce_text.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': no segment nonce");
  uint64_t nonce = std::stoull(nonce_text, nullptr, 16);
  Fd fd;
  std::string dot = "/mlxj." + std::to_string(::geteuid()) + ".";
  if (path.rfind(dot, 0) == 0 && all_digits(path.substr(dot.size())) && path.size() < dot.size() + 4) {
    fd = Fd(::shm_open(path.c_str(), O_RDWR, 0600));
    if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
    // Unlinked at once: from here on no name is left behind, whoever dies next.
    ::shm_unlink(path.c_str());
  } else {
#if defined(__linux__)
    auto rest = path.rfind("/proc/", 0) == 0 ? path.substr(6) : std::string();
    auto slash = rest.find("/fd/");
    if (slash == std::string::npos || !all_digits(rest.substr(0, slash)) || !all_digits(rest.substr(slash + 4)))
      fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not a peer's memfd");
    fd = Fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) fail(ErrorKind::Config, "cannot open the peer's shared memory: " + errno_text(errno));
    if (::fcntl(fd.get(), F_GET_SEALS) < 0)  // only memfds answer: never map an ordinary file
      fail(ErrorKind::Protocol, "refusing shared memory at '" + locator + "': not a memfd");
#else
    fail(ErrorKind::Protocol, "refusing shared memory '" + locator + "': not one of ours");
#endif
  }
  // macOS rounds a shm object's size up to whole pages: at least, not exactly, our size.
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || size_t(st.st_size) < size)
    fail(ErrorKind::Protocol, "the peer's shared memory has an unexpected size");
  if (st.st_uid != ::geteuid()) fail(ErrorKind::Protocol, "the peer's shared memory belongs to another user");
  auto seg = std::make_shared<SharedSegment>(map(fd.get(), size), size, locator, "");
  const Layout* l = seg->layout();
  if (l->magic != kMagic || l->ring_bytes != ring_bytes || l->nonce != nonce)
    fail(ErrorKind::Protocol, "the peer's shared memory is not the mlx_jupyter segment it announced");
  return seg;
}

std::string segment_locator(const SharedSegment& s) { return s.locator(); }

void segment_release_name(SharedSegment& s, bool peer_opened) {
  s.release_name(peer_opened);
  s.keep.reset();
}

namespace {

class ShmLink final : public Link {
 public:
  ShmLink(Fd bell, std::shared_ptr<SharedSegment> seg, bool creator, std::string name)
      : bell_(std::move(bell)), seg_(std::move(seg)), name_(std::move(name)) {
    int out = creator ? 0 : 1;
    cap_ = seg_->layout()->ring_bytes;
    tx_ = &seg_->layout()->dir[out];
    rx_ = &seg_->layout()->dir[1 - out];
    tx_ring_ = seg_->ring(out);
    rx_ring_ = seg_->ring(1 - out);
    tx_written_ = tx_->written.load();
    tx_read_ = tx_->read.load();
    rx_read_ = rx_->read.load();
  }

  const std::string& name() const override { return name_; }

  void begin_send(const MsgHeader& h, const void* data, size_t size) override {
    if (!seg_) fail(ErrorKind::Aborted, "the shared memory to " + name_ + " was released (its group was aborted)");
    send_ = {true, h, 0, const_cast<uint8_t*>(static_cast<const uint8_t*>(data)), size};
  }
  void begin_recv(const MsgHeader& expect, void* data, size_t size, const Fold* fold) override {
    if (!seg_) fail(ErrorKind::Aborted, "the shared memory to " + name_ + " was released (its group was aborted)");
    recv_ = {true, expect, 0, static_cast<uint8_t*>(data), size};
    fold_ = fold ? *fold : Fold{};
  }
  // Reducing straight out of the ring saves a copy and a second pass over the data.
  bool folds() const override { return true; }
  bool sending() const override { return send_.active; }
  bool receiving() const override { return recv_.active; }
  size_t received() const override {
    if (!recv_.active) return recv_.size;
    return recv_.done > sizeof(MsgHeader) ? recv_.done - sizeof(MsgHeader) : 0;
  }
  bool spins() const override { return true; }
  const char* kind() const override { return "shm"; }

  bool progress() override {
    if (slept_) drain_bell();
    bool moved = false;
    if (send_.active) moved |= push();
    if (recv_.active) moved |= pull();
    return moved;
  }

  void wait_set(std::vector<pollfd>& out) const override {
    bool ready = false;
    if (send_.active) {  // ring full: ask for a bell, then look again (no lost wake-up)
      tx_->producer_waiting.store(1, std::memory_order_seq_cst);
      ready |= tx_->written.load(std::memory_order_relaxed) - tx_->read.load(std::memory_order_seq_cst) < cap_;
    }
    if (recv_.active) {
      rx_->consumer_waiting.store(1, std::memory_order_seq_cst);
      ready |= rx_->written.load(std::memory_order_seq_cst) != rx_->read.load(std::memory_order_relaxed);
    }
    slept_ = true;
    // A writable socket makes poll() return at once when there is work after all.
    out.push_back(pollfd{bell_.get(), short(POLLIN | (ready ? POLLOUT : 0)), 0});
  }

  void shutdown() override { ::shutdown(bell_.get(), SHUT_RDWR); }
  void release() override {
    send_.active = recv_.active = false;
    seg_.reset();  // unmapped: nothing of the segment is left in this process
  }

 private:
  struct Transfer {
    bool active = false;
    MsgHeader header;
    size_t done = 0;  // bytes of header + payload moved
    uint8_t* data = nullptr;
    size_t size = 0;
  };

  // Copies message bytes [from, from+n) out of (header, payload) into dst.
  void gather(const Transfer& t, size_t from, uint8_t* dst, size_t n) const {
    const auto* h = reinterpret_cast<const uint8_t*>(&t.header);
    while (n) {
      size_t k;
      if (from < sizeof(MsgHeader)) {
        k = std::min(n, sizeof(MsgHeader) - from);
        std::memcpy(dst, h + from, k);
      } else {
        k = n;
        std::memcpy(dst, t.data + (from - sizeof(MsgHeader)), k);
      }
      dst += k; from += k; n -= k;
    }
  }

  bool push() {
    // Our cached view of `read` only errs on the safe side: reload it when it shows too little room.
    uint64_t w = tx_written_;
    size_t total = sizeof(MsgHeader) + send_.size, want = total - send_.done;
    if (cap_ - (w - tx_read_) < want) tx_read_ = tx_->read.load(std::memory_order_acquire);
    size_t n = std::min<size_t>(want, cap_ - (w - tx_read_));
    if (n == 0) return false;
    size_t at = size_t(w % cap_), first = std::min(n, cap_ - at);
    gather(send_, send_.done, tx_ring_ + at, first);
    if (n > first) gather(send_, send_.done + first, tx_ring_, n - first);
    tx_written_ = w + n;
    tx_->written.store(w + n, std::memory_order_seq_cst);
    send_.done += n;
    if (send_.done == total) send_.active = false;
    // Look before clearing: an atomic exchange on every push would bounce the line between cores.
    if (tx_->consumer_waiting.load(std::memory_order_seq_cst) && tx_->consumer_waiting.exchange(0)) ring_bell();
    return true;
  }

  // Copies n bytes from ring position pos.
  void copy_out(uint64_t pos, uint8_t* dst, size_t n) const {
    size_t at = size_t(pos % cap_), first = std::min(n, cap_ - at);
    std::memcpy(dst, rx_ring_ + at, first);
    if (n > first) std::memcpy(dst + first, rx_ring_, n - first);
  }

  // out[at, at+bytes) = mine op src (or src op mine).
  void fold_span(const uint8_t* src, size_t at, size_t bytes) const {
    const uint8_t* mine = fold_.mine + at;
    reduce_to(fold_.out + at, fold_.mine_first ? mine : src, fold_.mine_first ? src : mine,
              bytes / dtype_size(fold_.t), fold_.t, fold_.op);
  }

  // Folds the whole elements of payload [at, at+n) found at ring position pos; returns the bytes used.
  size_t fold_in(uint64_t pos, size_t at, size_t n) const {
    size_t es = dtype_size(fold_.t);
    n -= n % es;
    size_t o = size_t(pos % cap_), first = std::min(n, cap_ - o), done = first - first % es;
    fold_span(rx_ring_ + o, at, done);
    if (done < first) {  // an element straddles the end of the ring
      uint8_t tmp[16];
      copy_out(pos + done, tmp, es);
      fold_span(tmp, at + done, es);
      done += es;
    }
    if (n > done) fold_span(rx_ring_ + (done - first), at + done, n - done);
    return n;
  }

  bool pull() {
    uint64_t r = rx_read_, w = rx_->written.load(std::memory_order_acquire);
    if (w == r) return false;
    if (recv_.done < sizeof(MsgHeader)) {
      size_t k = std::min<size_t>(sizeof(MsgHeader) - recv_.done, w - r);
      copy_out(r, reinterpret_cast<uint8_t*>(&got_) + recv_.done, k);
      r += k;
      recv_.done += k;
      // Never touch the payload before checking the header: a mismatched size must not overrun the buffer.
      if (recv_.done == sizeof(MsgHeader)) check_header(recv_.header, got_, name_);
    }
    if (recv_.done >= sizeof(MsgHeader)) {
      size_t at = recv_.done - sizeof(MsgHeader), n = std::min<size_t>(recv_.size - at, w - r);
      if (fold_.out) {
        n = fold_in(r, at, n);
      } else if (n) {
        copy_out(r, recv_.data + at, n);
      }
      r += n;
      recv_.done += n;
    }
    if (r == rx_read_) return false;  // only part of an element so far
    rx_read_ = r;
    rx_->read.store(r, std::memory_order_seq_cst);
    if (recv_.done == sizeof(MsgHeader) + recv_.size) recv_.active = false;
    if (rx_->producer_waiting.load(std::memory_order_seq_cst) && rx_->producer_waiting.exchange(0)) ring_bell();
    return true;
  }

  void ring_bell() {
    char c = 1;
    if (::send(bell_.get(), &c, 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      peer_lost(errno, name_);
  }

  // One read, not a loop until empty: a peer that rings without end cannot hold
  // us here, and bytes left over only make the next poll() return at once.
  void drain_bell() {
    slept_ = false;
    char buf[256];
    ssize_t r = ::recv(bell_.get(), buf, sizeof buf, 0);
    if (r > 0) return;
    if (r == 0) peer_closed(name_);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    peer_lost(errno, name_);
  }

  Fd bell_;
  std::shared_ptr<SharedSegment> seg_;
  std::string name_;
  size_t cap_;
  RingState *tx_, *rx_;
  uint8_t *tx_ring_, *rx_ring_;
  Transfer send_, recv_;
  Fold fold_;
  MsgHeader got_;
  uint64_t tx_written_, tx_read_, rx_read_;  // our copies: we write the first and last, the second may lag
  mutable bool slept_ = false;
};

}  // namespace

std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, bool creator, std::string name) {
  return std::make_unique<ShmLink>(std::move(doorbell), std::move(seg), creator, std::move(name));
}

}  // namespace mlxj
