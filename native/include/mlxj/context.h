// The world context of one process: its listening sockets, the acceptor that
// authenticates incoming connections, and the mailbox where they wait until a
// group claims them. Groups (the world and its splits) share one context.
#pragma once
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "mlxj/options.h"
#include "mlxj/socket.h"

namespace mlxj {

enum class ConnKind : uint32_t { Ring = 1, P2P = 2, Query = 3 };

// A query (ConnKind::Query in the low 8 bits of a key's kind; QueryWhat << 8; kQueryRefuse): a
// rank whose op reached its deadline asks a peer's acceptor whether that peer has entered the
// same op (index: the collective's number, or the count of send/recv between the two), and
// whether it is paused (a debugger). With kQueryRefuse, a peer that has not entered it refuses
// to (its next op fails: the op can then complete on no rank). Answered without the peer's op thread.
enum class QueryWhat : uint32_t { Collective = 0, YourSends = 1, YourRecvs = 2 };
constexpr uint32_t kQueryRefuse = 1u << 12;
enum class QueryAnswer : uint8_t { Unknown = 0, Entered = 1, NotEntered = 2, Refused = 3 };
struct QueryReply {
  QueryAnswer answer = QueryAnswer::Unknown;  // Unknown: unreachable, or no such group there
  bool paused = false;
  int64_t since_pause_end_ms = -1;  // -1: never paused
};
using QueryHook = std::function<QueryReply(uint32_t initiator, uint32_t kind, uint32_t index)>;

// Identifies one connection: which group, who initiated it, why, and which of
// the parallel connections it is.
struct ConnKey {
  uint64_t group = 0;
  uint32_t initiator = 0;
  uint32_t kind = 0;
  uint32_t index = 0;
  bool operator<(const ConnKey& o) const {
    return std::tie(group, initiator, kind, index) < std::tie(o.group, o.initiator, o.kind, o.index);
  }
};

// Checked while blocked: returns true when the caller must stop (Ctrl-C).
using InterruptCheck = std::function<bool()>;

// What bounds one blocking call.
struct Wait {
  mutable Clock::time_point deadline = Clock::time_point::max();
  InterruptCheck interrupted;
  const Waker* abort = nullptr;  // woken when the group is aborted
  std::function<void()> check_abort;  // throws if the group was aborted
  // (mutable: a group extends it while a peer is paused, or lifts it once every rank has entered the op)
  std::string what;  // "all_sum", "init", ... for timeout messages
  double seconds = -1;  // the call's timeout, for its message
  // "all_sum timed out after 2 s"
  std::string timed_out() const;
};

class Context {
 public:
  // `options`: the world's; its token, verbose and dead-peer timeout govern every connection.
  Context(int rank, std::vector<std::vector<Endpoint>> addresses, CoreOptions options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(addresses_.size()); }
  const std::vector<Endpoint>& addresses(int rank) const { return addresses_[rank]; }
  std::string describe(int rank) const;
  const CoreOptions& options() const { return options_; }

  // Connects to `peer`'s address `addr_index`, retrying until it listens, and
  // authenticates. Throws CommError on timeout, interrupt or a bad peer.
  Fd connect(int peer, size_t addr_index, const ConnKey& key, const Wait& wait);
  // Waits for the connection `key` that a peer opens to us.
  Fd accept(const ConnKey& key, int peer, const Wait& wait);
  // Asks `peer`'s acceptor (one attempt, until `deadline`; abort and Ctrl-C end it): the answer
  // of its group `key.group`'s query hook, or Unknown when it cannot be reached.
  QueryReply query(int peer, const ConnKey& key, Clock::time_point deadline, const Wait& wait);
  // Called (from the acceptor thread) for each query about group `group`.
  void on_query(uint64_t group, QueryHook hook);

  void log(const std::string& msg) const;
  // Called (from the acceptor thread) when a peer reconnects to form a new group with the id
  // `group` (it left ours of that id). Only that group: the peer's other groups (splits it is
  // still in, or never was) are not its to end.
  void on_superseded(uint64_t group, std::function<void(const std::string&)> hook);
  // Stops accepting and frees the listening ports, so a new group can bind them.
  void close();

 private:
  struct Shared;
  void accept_loop();
  bool accept_round();  // one poll() of listeners and handshakes; false once stopped
  // The acceptor's reply proves it is an mlx_jupyter rank holding our token.
  bool greeted_by_peer(const uint8_t* reply, const uint8_t* nonce) const;

  int rank_;
  std::vector<std::vector<Endpoint>> addresses_;
  CoreOptions options_;
  std::shared_ptr<Shared> shared_;
  std::vector<Fd> listeners_;
  Waker stop_;
  std::mutex close_mu_;
  std::thread acceptor_;
};

// Throws if the wait's group was aborted, Ctrl-C is pending or its deadline passed.
void check_wait(const Wait& wait, const std::string& waiting_for);
// Sleeps for up to `ms` on the wait's abort waker; checks abort, interrupt, deadline.
void wait_slice(const Wait& wait, int ms, const std::string& waiting_for);

}  // namespace mlxj
