// A Link through shared memory, for two ranks on the same host.
//
// Why this mechanism: an anonymous shared segment (memfd on Linux) has no name
// in any filesystem, so nothing is left behind after any exit, SIGKILL
// included, and only processes handed the descriptor (ours, over the
// authenticated TCP connection, by /proc/<pid>/fd) can map it. Cross-memory
// attach (process_vm_readv) would need ptrace rights that hardened hosts deny
// and does not exist on macOS. On macOS the segment is a POSIX shm object with
// a random name, unlinked as soon as the peer has mapped it.
//
// Data flows through one single-producer/single-consumer ring per direction.
// The TCP connection stays as the doorbell and the liveness signal: a sleeping
// side waits in poll() on it (so abort, timeouts and Ctrl-C work unchanged) and
// a peer's death shows up there as end-of-file at once.
#pragma once
#include <memory>
#include <string>

#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

class SharedSegment;

// Creates a segment of `ring_bytes` per direction; `locator()` tells the peer how to open it.
std::shared_ptr<SharedSegment> create_segment(size_t ring_bytes);
// Opens the peer's segment; throws CommError(Config) if the locator is not a segment of ours.
std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t ring_bytes);
std::string segment_locator(const SharedSegment& s);
// Called by the creator once the peer has mapped the segment (removes any name).
void segment_release_name(SharedSegment& s);

std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, bool creator, std::string name);

}  // namespace mlxj
