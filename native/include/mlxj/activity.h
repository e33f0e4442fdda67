// What a group is doing now (Activity: read by any thread without locks, a seqlock of atomics)
// and, while profiling is on, a record of every op it ran (ProfileRing: bounded, no allocation per op).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "mlxj/dtype.h"

namespace mlxj {

enum class OpKind : uint8_t { None, Init, AllSum, AllMax, AllMin, AllGather, SumScatter, Send, Recv, Barrier, Split };
const char* op_kind_name(OpKind k);  // "all_sum", ...; "" for None
enum class OpState : uint8_t { Idle, Running, Waiting };
const char* op_state_name(OpState s);

// Nanoseconds of the steady clock (the one clock of activity and profile times).
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ActivityView {
  OpState state = OpState::Idle;
  OpKind op = OpKind::None;
  Dtype dtype = Dtype::UInt8;
  uint64_t seq = 0, nbytes = 0, moved = 0;
  int64_t start_ns = 0;
  int64_t timeout_us = -1;  // the op's own timeout, or -1 for none
  int32_t waiting_on = -1;  // group rank, or -1
};

// One writer (the thread holding the group's op lock), any number of readers. The writer's
// stores are release and the reader's loads acquire, so a reader that sees a field written after
// the version went odd also sees that odd version when it looks again, and retries.
class Activity {
 public:
  // `timeout_us`: the op's timeout (-1: none), so that a reader can say when a wait ends.
  void begin(OpKind op, uint64_t seq, uint64_t nbytes, Dtype t, int64_t start_ns, int64_t timeout_us = -1) {
    open();
    op_.store(uint8_t(op), std::memory_order_release);
    seq_.store(seq, std::memory_order_release);
    nbytes_.store(nbytes, std::memory_order_release);
    dtype_.store(uint8_t(t), std::memory_order_release);
    start_ns_.store(start_ns, std::memory_order_release);
    timeout_us_.store(timeout_us, std::memory_order_release);
    moved_.store(0, std::memory_order_release);
    waiting_on_.store(-1, std::memory_order_release);
    state_.store(uint8_t(OpState::Running), std::memory_order_release);
    close();
  }
  // peer < 0: running again. `moved`: the op's payload bytes so far.
  void waiting(int peer, uint64_t moved) {
    open();
    waiting_on_.store(peer, std::memory_order_release);
    moved_.store(moved, std::memory_order_release);
    state_.store(uint8_t(peer < 0 ? OpState::Running : OpState::Waiting), std::memory_order_release);
    close();
  }
  void moved(uint64_t moved) { waiting(-1, moved); }
  void end() {
    open();
    waiting_on_.store(-1, std::memory_order_release);
    state_.store(uint8_t(OpState::Idle), std::memory_order_release);
    close();
  }
  // From any thread, without locks: a consistent view of the fields.
  ActivityView read() const;

 private:
  void open() { version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  void close() { version_.store(version_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  std::atomic<uint32_t> version_{0};  // odd while the writer changes the fields
  std::atomic<uint8_t> state_{0}, op_{0}, dtype_{0};
  std::atomic<int32_t> waiting_on_{-1};
  std::atomic<uint64_t> seq_{0}, nbytes_{0}, moved_{0};
  std::atomic<int64_t> start_ns_{0}, timeout_us_{-1};
};

// One op of a profile. wait_ns: how long the op had nothing to move (see Group::run).
struct ProfileRecord {
  int64_t start_ns = 0, end_ns = 0, wait_ns = 0;
  uint64_t seq = 0, nbytes = 0;
  int32_t waited_on = -1;  // the peer it last waited for, or -1
  OpKind op = OpKind::None;
  Dtype dtype = Dtype::UInt8;
  bool ok = true;
};

// Whether this process is paused (a debugger's prompt: its ops do not run), as peers whose waits
// would time out on it ask (Group's timeout agreement): set from Python, read by the acceptor thread.
void set_paused(bool paused);
struct PauseView {
  bool now = false;         // paused at this moment
  int64_t since_end_ns = -1;  // how long ago the last pause ended (-1: never paused)
};
PauseView pause_state();

// Process-wide switch: one relaxed load on the op path when off.
bool profiling();
// Starts a new profile (earlier records are dropped as each group records again) keeping the
// newest `capacity` records per group.
void start_profiling(size_t capacity);
void stop_profiling();

// A group's records of the current profile: a ring of the newest `capacity`, allocated on the
// group's first record of a profile.
class ProfileRing {
 public:
  void add(const ProfileRecord& r);
  // The records of the current profile, oldest first, and how many older ones were overwritten; empties the ring.
  std::vector<ProfileRecord> take(uint64_t* dropped);

 private:
  std::mutex mu_;  // the op thread's add() against take() from another thread
  std::unique_ptr<ProfileRecord[]> buf_;
  size_t cap_ = 0;
  uint64_t written_ = 0;  // since the ring was emptied
  uint32_t gen_ = 0;      // the profile these records belong to
};

}  // namespace mlxj
