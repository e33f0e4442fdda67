// Error types of the core: each names the peer (rank and address) and the cause.
#pragma once
#include <stdexcept>
#include <string>

namespace mlxj {

enum class ErrorKind { Peer, Timeout, Aborted, Interrupted, Protocol, Config };

class CommError : public std::runtime_error {
 public:
  CommError(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& msg) { throw CommError(kind, msg); }

// A peer gave up on the group (a PeerError): `origin` is the world rank where the give-up
// started (-1: unknown), `why` a GiveUp (transport.h). A rank that fails on it gives up in turn
// with the same origin and why, so every rank's error names the first one.
class GaveUpError : public CommError {
 public:
  GaveUpError(const std::string& msg, int origin, int why) : CommError(ErrorKind::Peer, msg), origin(origin), why(why) {}
  int origin, why;
};

// Thrown when the interrupt hook reports a pending signal (the hook has already
// recorded the Python exception; the bindings re-raise it).
class Interrupted : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

}  // namespace mlxj
