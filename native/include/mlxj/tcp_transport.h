// A Link over one or more TCP connections; payload is striped across them.
#pragma once
#include <memory>
#include <vector>

#include "mlxj/socket.h"
#include "mlxj/transport.h"

namespace mlxj {

std::unique_ptr<Link> make_tcp_link(std::vector<Fd> conns, std::string name);

}  // namespace mlxj
