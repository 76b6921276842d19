"""A TCP proxy that counts the bytes each way, put in front of a hub to measure what a client
really moves (HTTP headers, Xet reconstructions, xorb ranges and all, whatever the client).

The proxy is plain TCP: the client's ``Host`` header names the proxy, so a hub that builds its
URLs from the request (the embedded hub's Xet storage and fetch URLs) keeps the client on the
proxy for every later request.

    with CountingProxy("127.0.0.1", hub_port) as proxy:
        ...                                 # talk to proxy.endpoint
        up, down = proxy.snapshot()         # client -> hub, hub -> client
"""

from __future__ import annotations

import socket
import threading

BUFFER = 1 << 20


class CountingProxy:
    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.up = 0                  # client -> hub
        self.down = 0                # hub -> client
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="proxy")

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed = True
        self._listener.close()

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.up, self.down

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._connection, args=(client, server), daemon=True).start()

    def _connection(self, client: socket.socket, server: socket.socket) -> None:
        down = threading.Thread(target=self._pump, args=(server, client, False), daemon=True)
        down.start()
        self._pump(client, server, True)
        down.join()
        client.close()
        server.close()

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                with self._lock:          # counted before delivered: a snapshot taken
                    if upward:            # once the client has its answer includes it
                        self.up += n
                    else:
                        self.down += n
                dst.sendall(view[:n])
        except OSError:
            pass
        finally:
            for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    sock.shutdown(how)
                except OSError:
                    pass
