#include "mlxj/board.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "mlxj/errors.h"
#include "mlxj/platform.h"

namespace mlxj {

namespace {

constexpr size_t kReasonBytes = 240;
// how long a rank that found an op given up waits for the giver's words (Board::gave_up)
constexpr std::chrono::milliseconds kReasonWait{200};
// A gate: the op (high 32 bits), whether it was given up (bit 31), 1 + the rank that flagged it
// (bits 16-30: its error names that rank even before the rank's reason is written), how many
// posts are counted in (bits 0-15).
constexpr uint64_t kGivenUp = uint64_t(1) << 31;
constexpr int kFlaggerShift = 16;
constexpr uint64_t kCount = (uint64_t(1) << kFlaggerShift) - 1;
constexpr uint64_t kFlagger = (kGivenUp - 1) & ~kCount;
uint64_t flagged_by(int rank) { return kGivenUp | (uint64_t(rank + 1) << kFlaggerShift); }
uint32_t gate_op(uint64_t g) { return uint32_t(g >> 32); }
uint64_t gate_of(uint64_t k) { return uint64_t(uint32_t(k)) << 32; }

}  // namespace

struct Board::Header {
  alignas(64) std::atomic<uint32_t> posts;  // bumped after every post and abort: what sleepers wait on
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<int32_t> aborted_by;  // 0, or 1 + the rank that aborted first
  std::atomic<uint32_t> reason_len;             // stored once origin, why and reason[] are written
  int32_t origin;
  uint32_t why;
  char reason[kReasonBytes];
  alignas(64) std::atomic<uint64_t> gate[2];  // of the slot sets: op k's is gate[k % 2]
};

struct Board::Slot {
  alignas(64) std::atomic<uint64_t> seq;  // the op whose data the slot holds (0: none yet)
  MsgHeader h;
  alignas(64) uint8_t data[kSlotBytes];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "cross-process atomics must be lock-free");

size_t Board::bytes_for(int n) {
  static_assert(sizeof(Header) == 384, "tests/core/test_hostile.py scribbles at these offsets");
  return sizeof(Header) + 2 * size_t(n) * sizeof(Slot);
}

Board::Board(std::shared_ptr<SharedSegment> seg, int me, std::vector<std::string> names, std::vector<int> world)
    : seg_(std::move(seg)), base_(seg_->payload()), n_(int(names.size())), me_(me), names_(std::move(names)),
      world_(std::move(world)) {
  if (seg_->payload_bytes() < bytes_for(n_)) fail(ErrorKind::Config, "shared memory too small for the board");
}

Board::Header& Board::header() const { return *reinterpret_cast<Header*>(base_); }

Board::Slot& Board::slot(int r, uint64_t k) const {
  auto* slots = reinterpret_cast<Slot*>(base_ + sizeof(Header));
  return slots[size_t(k & 1) * size_t(n_) + size_t(r)];
}

void Board::post(uint64_t k, const MsgHeader& h, const void* data, size_t nbytes) {
  Slot& s = slot(me_, k);
  if (nbytes) std::memcpy(s.data, data, nbytes);
  s.h = h;
  s.seq.store(k, std::memory_order_release);
  std::atomic<uint64_t>& gate = header().gate[k & 1];
  uint64_t g = gate.load(std::memory_order_acquire), next;
  do {
    if (gate_op(g) == uint32_t(k)) {
      next = g + 1;
    } else if (gate_op(g) + 2 == uint32_t(k) || (g == 0 && k <= 2)) {  // the set's previous op (complete)
      next = gate_of(k) | 1;
    } else {
      corrupt_gate(k, g);
    }
    if (g & kGivenUp) gave_up(g);  // (the previous op's flag is corruption as well: nobody got past it)
  } while (!gate.compare_exchange_weak(g, next, std::memory_order_acq_rel, std::memory_order_acquire));
  last_posted_.store(k, std::memory_order_relaxed);
  header().posts.fetch_add(1, std::memory_order_seq_cst);
  if (header().sleepers.load(std::memory_order_seq_cst)) platform::wake_word(&header().posts);
}

bool Board::posted(int r, uint64_t k, const MsgHeader& expect) const {
  const Slot& s = slot(r, k);
  uint64_t v = s.seq.load(std::memory_order_acquire);
  if (v == k) {
    MsgHeader got;
    std::memcpy(&got, &s.h, sizeof got);
    check_header(expect, got, name(r));  // before anyone reads the data: its size is the one checked
    return true;
  }
  if (v == 0 ? k <= 2 : v + 2 == k) return false;  // still the op before last, or nothing yet
  fail(ErrorKind::Peer, "the shared memory board of this group is corrupt (" + name(r) + "'s slot holds op " +
                            std::to_string(v) + " where op " + std::to_string(k) + " or " +
                            std::to_string(k - 2) + " was due): a rank crashed mid-write or another "
                            "process of this user wrote into it");
}

const uint8_t* Board::data(int r, uint64_t k) const { return slot(r, k).data; }

bool Board::complete(uint64_t k) const {
  uint64_t g = header().gate[k & 1].load(std::memory_order_acquire);
  if (gate_op(g) != uint32_t(k)) {
    if (gate_op(g) + 2 == uint32_t(k) || (g == 0 && k <= 2)) return false;  // nobody else has posted op k yet
    corrupt_gate(k, g);
  }
  if (g & kGivenUp) gave_up(g);
  if (int(g & kCount) > n_) corrupt_gate(k, g);
  return int(g & kCount) == n_;
}

bool Board::cancel(uint64_t k) {
  std::atomic<uint64_t>& gate = header().gate[k & 1];
  uint64_t g = gate.load(std::memory_order_acquire);
  for (;;) {
    if (gate_op(g) != uint32_t(k) || (g & kGivenUp)) return true;  // (given up already)
    if (int(g & kCount) == n_) return false;
    if (gate.compare_exchange_weak(g, g | flagged_by(me_), std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  }
}

void Board::gave_up(uint64_t gate) const {
  const Header& hd = header();
  // A rank giving up an op flags the gate first (cancel) and writes who and why just after
  // (mark_aborted, which bumps `posts`): a rank that saw the flag in between waits a moment for
  // those words, so that its error names the rank and the cause.
  auto until = std::chrono::steady_clock::now() + kReasonWait;
  for (;;) {
    uint32_t seen = hd.posts.load(std::memory_order_seq_cst);
    if (hd.reason_len.load(std::memory_order_acquire) != 0) break;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    platform::wait_word(const_cast<std::atomic<uint32_t>*>(&hd.posts), seen, left);
  }
  int a = aborted_by();
  bool told = hd.reason_len.load(std::memory_order_acquire) != 0;
  int origin = told && hd.origin >= -1 && hd.origin < 1 << 24 ? hd.origin : -1;
  if (!told) {  // not written yet (the giver is slow to): the gate names who flagged it, at its deadline (cancel)
    int f = int((gate & kFlagger) >> kFlaggerShift) - 1;
    if (f >= 0 && f < n_)
      peer_gave_up(name(f), size_t(f) < world_.size() ? world_[size_t(f)] : -1, GiveUp::TimedOut,
                   "it gave up the op at its deadline");
  }
  peer_gave_up(a > 0 ? name(a - 1) : std::string("a rank"), origin, GiveUp(told ? hd.why & 3 : 0), abort_reason());
}

void Board::corrupt_gate(uint64_t k, uint64_t g) const {
  fail(ErrorKind::Peer, "the shared memory board of this group is corrupt (its gate holds op " +
                            std::to_string(gate_op(g)) + " where op " + std::to_string(k) + " or " +
                            std::to_string(k - 2) + " was due): a rank crashed mid-write or another "
                            "process of this user wrote into it");
}

void Board::mark_aborted(const std::string& reason, int origin, int why) {
  Header& hd = header();
  int32_t none = 0;
  if (hd.aborted_by.compare_exchange_strong(none, me_ + 1)) {
    size_t len = std::max<size_t>(1, std::min(reason.size(), kReasonBytes));  // (non-zero: says "told")
    hd.origin = origin;
    hd.why = uint32_t(why);
    std::memcpy(hd.reason, reason.data(), std::min(reason.size(), kReasonBytes));
    if (reason.empty()) hd.reason[0] = '?';
    std::memcpy(hd.reason, reason.data(), len);
    hd.reason_len.store(uint32_t(len), std::memory_order_release);
  }
  // Give up the first op not complete: ours if we posted it, else the next (a gate still on the
  // set's previous op, or on this op with some posts counted in).
  uint64_t m = std::max<uint64_t>(1, last_posted_.load(std::memory_order_relaxed));
  for (int guard = 0; guard < 8; ++guard) {
    std::atomic<uint64_t>& gate = hd.gate[m & 1];
    uint64_t g = gate.load(std::memory_order_acquire), next;
    if (gate_op(g) == uint32_t(m)) {
      if (g & kGivenUp) break;
      if (int(g & kCount) == n_) {  // complete: the next op is the first one not
        ++m;
        continue;
      }
      next = g | flagged_by(me_);
    } else if (gate_op(g) + 2 == uint32_t(m) || g == 0) {
      next = gate_of(m) | flagged_by(me_);
    } else {
      ++m;  // (the gate is past m: m completed)
      continue;
    }
    if (gate.compare_exchange_strong(g, next, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  hd.posts.fetch_add(1, std::memory_order_seq_cst);
  platform::wake_word(&hd.posts);
}

int Board::aborted_by() const {
  int32_t a = header().aborted_by.load(std::memory_order_acquire);
  return a >= 1 && a <= n_ ? a : (a == 0 ? 0 : -1);
}

std::string Board::abort_reason() const {
  const Header& hd = header();
  size_t len = std::min<size_t>(hd.reason_len.load(std::memory_order_acquire), kReasonBytes);
  std::string s(hd.reason, len);
  // Written by another process: keep it printable ASCII, so it makes a valid error message.
  for (char& c : s)
    if (c < 0x20 || c > 0x7e) c = '?';
  return s;
}

uint32_t Board::posts() const { return header().posts.load(std::memory_order_seq_cst); }

void Board::sleep(uint32_t seen, int64_t micros) {
  Header& hd = header();
  hd.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (hd.posts.load(std::memory_order_seq_cst) == seen && micros > 0) platform::wait_word(&hd.posts, seen, micros);
  hd.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace mlxj
