// A Link over one or more TCP connections; payload is striped across them.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

// `dead_peer`: how long a peer's host may acknowledge nothing we wait on (CoreOptions).
std::unique_ptr<Link> make_tcp_link(std::vector<Fd> conns, std::string name, std::chrono::milliseconds dead_peer);

}  // namespace mlxj
