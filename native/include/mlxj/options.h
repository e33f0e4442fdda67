// What the core is told when a world (or a split of it) is made: the job's secret and the
// settings a rank reads from its environment. Python fills it from its RankEnv
// (mlx_jupyter.vocab.rank_env); the core never reads the environment itself.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>

namespace mlxj {

struct CoreOptions {
  std::string token;         // peers prove they hold it (HMAC); "" authenticates with the empty key
  bool verbose = false;      // log accepted and refused connections
  bool shm = true;           // links between ranks of one host may go through shared memory
  bool named_shm = false;    // named POSIX objects even where memfd exists (macOS's mechanism, for tests)
  bool board = true;         // small ops of a one-host group of 3+ ranks go through the board
  double dead_peer_timeout = 10;  // seconds a peer's host may stay silent before it counts as dead
  std::string host_id;       // this machine's identity; "" = the real one (tests fake several hosts)
  // All-reduces up to this many bytes gather and reduce in rank order; larger ones
  // run the pipelined ring. Measured on 3 and 4 local ranks: gathering wins up to
  // ~16 KiB, the ring from 32 KiB. Every rank of a group must use the same value.
  size_t small_limit = size_t(16) << 10;

  std::chrono::milliseconds dead_peer() const {
    return std::chrono::milliseconds(std::max<long long>(100, (long long)(dead_peer_timeout * 1000)));
  }
};

}  // namespace mlxj
