// How a rank waits for its peers: a short spin, then yields, then sleep; and how
// often a long wait looks at abort, Ctrl-C, deadlines and liveness. Shared by the
// ring's progress engine (group.cpp) and the board (group_board.cpp).
#pragma once
#include <chrono>
#include <thread>

namespace mlxj {

// Longest busy wait before sleeping. A sleeping rank is woken by its peer's doorbell, which costs
// it 15-60 µs (the OS waking an idle core); a peer that arrives within the spin costs a fraction of
// a µs. 250 µs covers the short compute between the collectives of a training step (measured by
// benchmarks/small_op_breakdown.py); a longer wait spends at most this much CPU before sleeping.
constexpr auto kSpin = std::chrono::microseconds(250);
// The first part of the spin keeps the core: a peer running on another core answers within
// about a microsecond, and sched_yield() (a system call) would add its own cost to that.
constexpr auto kHotSpin = std::chrono::microseconds(2);
constexpr auto kBusyCheck = std::chrono::milliseconds(50);  // abort/Ctrl-C/liveness checks while waiting

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// The spin before a sleep: on the core for kHotSpin (unless `hot` is off: with more
// ranks than cores that only delays the peer we wait for), then yielding it until kSpin.
class Spin {
 public:
  explicit Spin(bool hot = true) : hot_(hot) {}
  // Starts the spin afresh (something moved, or the caller slept).
  void restart() { start_ = {}; }
  // Spends one moment of the spin; false once it is over and the caller should sleep.
  bool step(std::chrono::steady_clock::time_point now) {
    if (start_ == std::chrono::steady_clock::time_point{}) start_ = now;
    if (hot_ && now - start_ < kHotSpin) {
      cpu_relax();
      return true;
    }
    if (now - start_ < kSpin) {
      std::this_thread::yield();  // when ranks outnumber cores, let the peer we wait for run
      return true;
    }
    return false;
  }

 private:
  bool hot_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace mlxj
