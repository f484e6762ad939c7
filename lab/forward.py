"""TCP forwarder: listens on 127.0.0.1 in the root namespace, connects inside the lab namespace.

Run: python3 -m lab.forward PORT=ADDR:PORT [...]   (one process for all guests)
The listening sockets are bound first, then the process setns()es into the lab namespace, so every
outgoing connection is made there (a socket keeps the namespace it was created in).
"""

from __future__ import annotations

import socket
import sys
import threading

from lab import net


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> None:
    pairs = []
    for spec in argv:
        port, target = spec.split("=", 1)
        addr, tport = target.rsplit(":", 1)
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", int(port)))
        ls.listen(64)
        pairs.append((ls, (addr, int(tport))))
    net.setns()  # before any thread exists: threads inherit the namespace of their creator
    threads = [threading.Thread(target=_serve, args=p, daemon=True) for p in pairs]
    for t in threads:
        t.start()
    print(f"forwarding {' '.join(argv)}", flush=True)
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(sys.argv[1:])
