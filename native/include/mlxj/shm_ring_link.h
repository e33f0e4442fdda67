// A Link through shared memory, for two ranks on the same host (the segment
// itself: shm_segment.h).
//
// Data flows through one single-producer/single-consumer ring per direction.
// The TCP connection stays as the doorbell and the liveness signal: a sleeping
// side waits in poll() on it (so abort, timeouts and Ctrl-C work unchanged) and
// a peer's death shows up there as end-of-file at once. The peer's counters are
// checked on every load: one that runs backwards or past the ring's size fails
// the link with a PeerError instead of reading or writing outside the ring.
#pragma once
#include <memory>
#include <string>

#include "mlxj/shm_segment.h"
#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, bool creator, std::string name);

}  // namespace mlxj
