// How a rank waits for its peers: a short spin, then yields, then sleep; and how
// often a long wait looks at abort, Ctrl-C, deadlines and liveness. Shared by the
// ring's progress engine (group.cpp) and the board (group_board.cpp).
#pragma once
#include <chrono>

namespace mlxj {

constexpr auto kSpin = std::chrono::microseconds(50);  // longest busy wait before sleeping
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

}  // namespace mlxj
