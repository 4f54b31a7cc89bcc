"""A multi-threaded Python service that allocates and frees per request, for the service tests.

Usage: python py_service.py [CACHE_SLOTS]. A ThreadingTCPServer on 127.0.0.1 (kernel-chosen
port, printed as "ready port=N"); one thread per connection. Protocol, one line each way:

    work SEED COUNT  ->  ok HEX   (HEX = sha256 over COUNT buffers generated from SEED)
    ping             ->  pong REQUESTS

Each ``work`` request generates COUNT buffers of 2 .. 34 KiB from SEED (bytes objects this big
are malloced by glibc, not by pymalloc), stores each into a random slot of a shared cache of
CACHE_SLOTS entries (freeing the one it replaces) and answers their digest. The cache has a
constant number of slots, so the heap's free memory is steady while its free lists churn;
a client checks the digest by generating the same buffers itself (``expected_digest``).
"""

from __future__ import annotations

import hashlib
import random
import socketserver
import sys
import threading

_MIN_BYTES = 2048
_SPREAD_BYTES = 32768


def buffers(seed: int, count: int) -> list[bytes]:
    """The COUNT buffers a ``work SEED COUNT`` request generates (clients recompute them)."""
    rng = random.Random(seed)
    return [rng.randbytes(_MIN_BYTES + rng.randrange(_SPREAD_BYTES)) for _ in range(count)]


def expected_digest(seed: int, count: int) -> str:
    digest = hashlib.sha256()
    for buffer in buffers(seed, count):
        digest.update(buffer)
    return digest.hexdigest()


class _State:
    def __init__(self, slots: int) -> None:
        self.lock = threading.Lock()
        self.cache: list[bytes | None] = [None] * slots
        self.requests = 0


class _Handler(socketserver.StreamRequestHandler):
    state: _State

    def handle(self) -> None:
        for raw in self.rfile:
            words = raw.decode("ascii", "replace").split()
            if words[:1] == ["ping"]:
                reply = f"pong {self.state.requests}"
            elif len(words) == 3 and words[0] == "work":
                seed, count = int(words[1]), min(int(words[2]), 512)
                made = buffers(seed, count)
                digest = hashlib.sha256()
                rng = random.Random(seed ^ 0x5EED)
                with self.state.lock:
                    for buffer in made:
                        digest.update(buffer)
                        # Replacing a slot frees the buffer it held: memory of mixed ages.
                        self.state.cache[rng.randrange(len(self.state.cache))] = buffer
                    self.state.requests += 1
                reply = f"ok {digest.hexdigest()}"
            else:
                reply = "error unknown request"
            self.wfile.write(reply.encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    slots = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    state = _State(slots)
    # Fill the cache once, then drop every other entry: the heap starts fragmented.
    state.cache = list(buffers(0, slots))
    for index in range(0, slots, 2):
        state.cache[index] = None
    handler = type("Handler", (_Handler,), {"state": state})
    with _Server(("127.0.0.1", 0), handler) as server:
        print(f"ready port={server.server_address[1]}", flush=True)
        server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()
