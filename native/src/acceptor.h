// The acceptor's side of a context (context.h): the handshakes in progress, driven from one
// thread without blocking, the mailbox where accepted connections wait, and the groups' hooks.
// Internal to context.cpp (the dialer) and context_acceptor.cpp (the acceptor).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mlxj/context.h"
#include "mlxj/sha256.h"
#include "mlxj/wire.h"

namespace mlxj {

constexpr const char* kMagic = kHandshakeMagic;
constexpr int kHandshakeMs = 5000;  // a silent stranger holds a handshake slot this long at most
constexpr size_t kQueryReplyBytes = 8;

// The HMAC proving one side of a handshake (role 'A': the acceptor, 'I': the initiator, with its header).
Digest handshake_mac(const std::string& token, char role, const uint8_t* ni, const uint8_t* na, const ConnHeader* h);

struct Context::Shared {
  int rank = 0;
  int world_size = 0;
  std::string token;
  bool verbose = false;
  std::mutex mu;
  std::condition_variable cv;
  std::map<ConnKey, Fd> mailbox;

  void log(const std::string& msg) const {
    std::cerr << "[mlx_jupyter rank " << rank << "] " << msg << std::endl;
  }

  // One incoming connection between accept() and the verdict. The acceptor
  // drives all of them from one thread without blocking, so a stranger that
  // stalls costs one slot and one descriptor, never a thread.
  struct Pending {
    Fd fd;
    std::string who;
    Clock::time_point deadline;
    int stage = 0;  // 0 read greeting, 1 write proof, 2 read answer, 3 write verdict
    size_t done = 0;
    uint8_t buf[8 + 32 + 32];
    uint8_t ni[32], na[32];
    ConnHeader h{};
    uint8_t ok = 0;
    std::string why;
    std::vector<std::function<void(const std::string&)>> hooks;
    bool query = false;        // a peer's query (ConnKind::Query): answered in the verdict, then closed
    size_t verdict_bytes = 1;  // kQueryReplyBytes for a query
  };

  std::deque<Pending> pending;  // the acceptor thread's alone
  Clock::time_point resume_accepting{};

  static size_t stage_bytes(int stage) {
    static const size_t n[] = {8 + 32, 8 + 32 + 32, sizeof(ConnHeader) + 32, 1};
    return n[stage];
  }
  static bool stage_writes(int stage) { return stage == 1 || stage == 3; }

  // Moves a handshake as far as its socket allows. Returns false when it is over
  // (accepted into the mailbox, or refused and logged); the caller drops it.
  bool advance(Pending& p);

  // The verdict on the dialer's answer (in p.buf): its proof, its job's size, and
  // whether it is re-forming a group we still hold.
  void decide(Pending& p);

  // A query's verdict: 0x80 | answer, paused, 2 bytes 0, milliseconds since the last pause ended (all ones: never).
  void answer_query(Pending& p);

  std::vector<std::pair<uint64_t, QueryHook>> queries;  // the groups' query hooks, with each group's id
  std::set<ConnKey> consumed;  // keys of the connections groups have taken
  // abort hooks of the groups, with each group's id
  std::vector<std::pair<uint64_t, std::function<void(const std::string&)>>> superseded;

  // Logs each (address, reason) once, so a retrying stranger cannot flood the log.
  void refuse(const std::string& who, const std::string& why);
  std::set<std::string> refused;

  void log_once(const std::string& msg);
};

}  // namespace mlxj
