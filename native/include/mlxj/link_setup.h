// Turns the connections to one peer into a Link: shared memory when the peer
// runs on this host (and both allow it: CoreOptions::shm), TCP otherwise.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mlxj/context.h"
#include "mlxj/options.h"
#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

// `initiator`: we opened these connections (we propose; the peer decides).
// Waits for the peer until the wait's deadline; throws on abort or Ctrl-C.
std::unique_ptr<Link> establish_link(std::vector<Fd> conns, bool initiator, std::string name, const Wait& wait,
                                     const CoreOptions& opts);

}  // namespace mlxj
