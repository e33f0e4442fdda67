"""Cable check agent: one TCP transfer each way between two hosts, and a few round trips.

Standard library only: `mlx-jupyter config --measure` runs this file's source on the
hosts with `python3 -c` (nothing to install there); `python3 -m mlx_jupyter.configurator.measure_agent`
runs it too. `serve` listens on one end's cable address, `send` connects from the other's:

    send -> serve: "MJCC1" + token, pings ("P" echoed), "U"   (each end reads the token from the
                   first line of its stdin: never on a command line, where other users could read it)
    send -> serve: frames (8-byte length + bytes) for --seconds or --max-bytes, a 0 frame
    serve -> send: bytes and nanoseconds it timed (2 x 8 bytes)
    serve -> send: frames the same way; send -> serve: "K"

`send` prints one JSON line (bytes and ns each way as timed by the receiving end, round
trips in microseconds); `serve` prints one too. Both give up after --timeout seconds, and
with --exit-on-eof as soon as their stdin closes (the checker closed the ssh session).
Exit codes: 0 done, 1 failed, 3 (serve) the port is taken.
"""

import argparse
import errno
import json
import socket
import os
import struct
import sys
import threading
import time

MAGIC = b"MJCC1"
CHUNK = 256 * 1024
FRAME = struct.Struct("!Q")
RESULT = struct.Struct("!QQ")


class Failed(Exception):
    """A message for stderr; the process exits 1."""


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self):
        return self.end - time.monotonic()

    def arm(self, sock):
        """Bound the socket's next operation by what is left; fail once nothing is."""
        left = self.left()
        if left <= 0:
            raise Failed(f"ran out of time (--timeout {self.seconds:g} s)")
        sock.settimeout(left)


def _family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def recv_exact(sock, view, deadline):
    """Fill `view` from the socket."""
    got = 0
    while got < len(view):
        deadline.arm(sock)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise Failed("the other end closed the connection early")
        got += n


def send_frames(sock, seconds, max_bytes, deadline, max_mbit=0.0):
    """Send frames until `seconds` pass or `max_bytes` are sent, then the end frame; at most `max_mbit` if set."""
    payload = memoryview(bytes(CHUNK))
    start = time.monotonic()
    stop = start + seconds
    sent = 0
    while sent < max_bytes and time.monotonic() < stop:
        n = min(CHUNK, max_bytes - sent)
        deadline.arm(sock)
        sock.sendall(FRAME.pack(n))
        sock.sendall(payload[:n])
        sent += n
        if max_mbit > 0:  # pacing: wait until this much data is due
            due = start + sent * 8 / (max_mbit * 1e6)
            time.sleep(max(0.0, min(due, stop) - time.monotonic()))
    deadline.arm(sock)
    sock.sendall(FRAME.pack(0))


def receive_frames(sock, deadline):
    """Receive frames up to the end frame; (bytes, ns from the first frame's arrival to the end)."""
    head = bytearray(FRAME.size)
    hview = memoryview(head)
    buf = memoryview(bytearray(CHUNK))
    total, start = 0, None
    while True:
        recv_exact(sock, hview, deadline)
        if start is None:
            start = time.perf_counter_ns()
        (n,) = FRAME.unpack(head)
        if n == 0:
            return total, time.perf_counter_ns() - start
        if n > CHUNK:
            raise Failed(f"bad frame length {n}")
        recv_exact(sock, buf[:n], deadline)
        total += n


def _accept(listener, token, deadline):
    """The first connection that presents the token (others are dropped)."""
    want = MAGIC + token.encode()
    while True:
        deadline.arm(listener)
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            raise Failed(f"no sender connected within {deadline.seconds:g} s") from None
        try:
            got = bytearray(len(want))
            recv_exact(conn, memoryview(got), deadline)
        except (Failed, OSError):
            conn.close()
            continue
        if bytes(got) == want:
            return conn
        conn.close()


def serve(args):
    deadline = Deadline(args.timeout)
    listener = socket.socket(_family(args.bind), socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((args.bind, args.port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(f"port {args.port} on {args.bind} is in use", file=sys.stderr)
            sys.exit(3)
        raise Failed(f"cannot listen on {args.bind} port {args.port}: {exc.strerror or exc} "
                     "(is that address on this host? apply the setup first)") from None
    listener.listen(4)
    conn = _accept(listener, args.token, deadline)
    listener.close()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one = bytearray(1)
        pings = 0
        while True:
            recv_exact(conn, memoryview(one), deadline)
            if one == b"U":
                break
            if one != b"P":
                raise Failed(f"unexpected byte {bytes(one)!r} from the sender")
            conn.sendall(b"P")
            pings += 1
        up_bytes, up_ns = receive_frames(conn, deadline)
        deadline.arm(conn)
        conn.sendall(RESULT.pack(up_bytes, up_ns))
        send_frames(conn, args.seconds, args.max_bytes, deadline)
        recv_exact(conn, memoryview(one), deadline)
    print(json.dumps({"role": "serve", "pings": pings, "up_bytes": up_bytes, "up_ns": up_ns}), flush=True)


def _connect(args, deadline):
    """Connect from --bind to --to, retrying while the server is not listening yet."""
    last = None
    while deadline.left() > 0:
        sock = socket.socket(_family(args.to), socket.SOCK_STREAM)
        try:
            sock.bind((args.bind, 0))
            deadline.arm(sock)
            sock.connect((args.to, args.port))
            return sock
        except (ConnectionRefusedError, socket.timeout) as exc:
            last = exc
            sock.close()
            time.sleep(0.02)  # the server is still starting
        except OSError as exc:
            sock.close()
            raise Failed(f"cannot connect from {args.bind} to {args.to} port {args.port}: "
                         f"{exc.strerror or exc}") from None
    raise Failed(f"could not connect from {args.bind} to {args.to} port {args.port} "
                 f"within {deadline.seconds:g} s ({last or 'timed out'})")


def send(args):
    deadline = Deadline(args.timeout)
    conn = _connect(args, deadline)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline.arm(conn)
        conn.sendall(MAGIC + args.token.encode())
        one = bytearray(1)
        rtt = []
        for _ in range(args.pings):
            t0 = time.perf_counter_ns()
            deadline.arm(conn)
            conn.sendall(b"P")
            recv_exact(conn, memoryview(one), deadline)
            rtt.append((time.perf_counter_ns() - t0) / 1000)
        conn.sendall(b"U")
        send_frames(conn, args.seconds, args.max_bytes, deadline, args.max_mbit)
        res = bytearray(RESULT.size)
        recv_exact(conn, memoryview(res), deadline)
        up_bytes, up_ns = RESULT.unpack(res)
        down_bytes, down_ns = receive_frames(conn, deadline)
        deadline.arm(conn)
        conn.sendall(b"K")
    print(json.dumps({"role": "send", "up_bytes": up_bytes, "up_ns": up_ns, "down_bytes": down_bytes,
                      "down_ns": down_ns, "rtt_us": [round(x, 1) for x in rtt]}), flush=True)


def read_token(fd=0):
    """The job's token: the first line of stdin, read unbuffered (the rest of stdin is the EOF watch)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
        if len(data) > 256:
            raise Failed("the first line of stdin is not a token (longer than 256 bytes)")
    token = data.strip().decode("ascii", errors="replace")
    if not token:
        raise Failed("no token: give it as the first line of stdin")
    return token


def exit_on_eof():
    """Exit as soon as stdin closes: the checker gave up on this cable (its ssh session is gone)."""
    def watch():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        print("cablecheck: stdin closed (the checker stopped this cable)", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def parser():
    p = argparse.ArgumentParser(prog="measure_agent", description=(__doc__ or "cable check agent").splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("serve", "send"):
        s = sub.add_parser(role)
        s.add_argument("--bind", required=True, help="this end's cable address")
        if role == "send":
            s.add_argument("--to", required=True, help="the other end's cable address")
            s.add_argument("--pings", type=int, default=20)
            s.add_argument("--max-mbit", type=float, default=0.0,
                           help="cap this end's sending rate (Mbit/s; tests of a slow link where tc is missing)")
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--seconds", type=float, default=1.0, help="how long each direction sends")
        s.add_argument("--max-bytes", type=int, default=1 << 30, help="and at most this much")
        s.add_argument("--timeout", type=float, default=20.0, help="give up after this long in all")
        s.add_argument("--exit-on-eof", action="store_true", help="exit when stdin closes (run over ssh)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        args.token = read_token()
        if args.exit_on_eof:
            exit_on_eof()
        (serve if args.role == "serve" else send)(args)
    except Failed as exc:
        print(f"cablecheck {args.role}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cablecheck {args.role}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
