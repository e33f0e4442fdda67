// A Link through shared memory, for two ranks on the same host (the segment
// itself: shm_segment.h).
//
// Data flows through one single-producer/single-consumer ring per direction.
// The TCP connection stays as the doorbell and the liveness signal: a sleeping
// side waits in poll() on it (so abort, timeouts and Ctrl-C work unchanged) and
// a peer's death shows up there as end-of-file at once. The peer's counters are
// checked on every load: one that runs backwards or past the ring's size fails
// the link with a PeerError instead of reading or writing outside the ring.
//
// The link's layout of the segment's payload: the two directions' shared state,
// then the ring of direction 0 (creator -> opener), then that of direction 1.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mlxj/shm_segment.h"
#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

// Shared state of one direction; each counter on its own cache line.
struct alignas(64) RingState {
  alignas(64) std::atomic<uint64_t> written{0};  // bytes the producer has published
  alignas(64) std::atomic<uint64_t> read{0};     // bytes the consumer has released
  alignas(64) std::atomic<uint32_t> consumer_waiting{0};
  alignas(64) std::atomic<uint32_t> producer_waiting{0};
  // The producer gave up on its group: 0, or the first collective it withdrew from (Link::withdraw).
  // Written once, after reason[]; the consumer looks before it takes a message or sends one.
  alignas(64) std::atomic<uint32_t> withdrawn{0};
  std::atomic<uint32_t> reason_len{0};  // stored after origin, why and reason[]
  int32_t origin;                       // GaveUpError's
  uint32_t why;
  char reason[176];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process atomics must be lock-free");
static_assert(sizeof(RingState) == 448, "tests/core/test_hostile.py scribbles at these offsets");

// Payload bytes of a segment that carries rings of `ring_bytes` each way.
constexpr size_t shm_link_bytes(size_t ring_bytes) { return 2 * sizeof(RingState) + 2 * ring_bytes; }

// `seg` holds shm_link_bytes(ring_bytes) of payload, zeroed by its creator's OS.
std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, size_t ring_bytes, bool creator,
                                    std::string name);

}  // namespace mlxj
