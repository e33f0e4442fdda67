// A Link through shared memory, for two ranks on the same host.
//
// Why this mechanism: an anonymous shared segment (memfd on Linux) has no name
// in any filesystem, so nothing is left behind after any exit, SIGKILL
// included. Cross-memory attach (process_vm_readv) would need ptrace rights
// that hardened hosts deny and does not exist on macOS.
//
// Who can reach the memory. The boundary is the user id: other users and other
// hosts cannot, a process of the same uid can. On Linux the peer opens the
// segment as /proc/<pid>/fd/N, which any process of the same uid may open too
// (as it may read /proc/<pid>/environ, which holds the job token); the creator
// closes N as soon as the peer has mapped the segment, after which only the two
// ranks' mappings remain (readable by the same uid where ptrace is allowed). On
// macOS the segment is a POSIX shm object of mode 0600 whose name exists only
// during the handover. The token authenticates the handover: the locator travels
// only over a connection that proved it, and the peer maps only a segment of
// ours carrying the random nonce the locator names.
//
// macOS names: /mlxj.<uid>.<slot>, taken with O_EXCL. The peer unlinks the name
// as soon as it has opened it; the creator does if the peer did not open it (or
// on any failure). A creator killed between creating and the peer's open leaves
// the name behind; the segment records the creator's pid, and every process
// removes such stale names (creator gone) before it creates its first segment.
// If another process wins a race for a slot, the nonce no longer matches and
// that link falls back to TCP.
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
// MLX_JUPYTER_SHM=named uses the macOS mechanism on Linux too (for tests).
std::shared_ptr<SharedSegment> create_segment(size_t ring_bytes);
// Opens the peer's segment; throws CommError(Config) if the locator is not a segment of ours.
std::shared_ptr<SharedSegment> open_segment(const std::string& locator, size_t ring_bytes);
std::string segment_locator(const SharedSegment& s);
// Called by the creator once the peer has answered: closes the memfd and
// removes the name, unless the peer opened the segment (it has removed the name).
void segment_release_name(SharedSegment& s, bool peer_opened);

std::unique_ptr<Link> make_shm_link(Fd doorbell, std::shared_ptr<SharedSegment> seg, bool creator, std::string name);

}  // namespace mlxj
