"""The apiserver's egress proxy for real kubelet nodes (`python -m gpu_install_lab.kube _egress SOCKET IP:PORT...`).

The apiserver sends its "cluster" traffic (kubectl logs/exec/port-forward to a node's kubelet, its pod and
service proxies) through the EgressSelectorConfiguration's HTTP-CONNECT proxy on a Unix socket (controlplane.py).
With hollow nodes nobody listens there, so such requests fail at once. With real nodes (`lab up --kubelet real`)
this proxy listens there and connects ONLY to the given lab node addresses on the lab bridge: IP:PORT, or IP:* for
any port of that node (the kubelet on 10250, and host-network pods such as the STAND-IN dcgm-exporter that
`validate`'s metrics layer reads through the apiserver's pod proxy); every other CONNECT gets 403, so the apiserver
still never opens a connection outside the lab's nodes.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

from gpu_install_lab.kube.forward import pump


def _handle(conn: socket.socket, allowed: set[str]) -> None:
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk or len(head) > 16384:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode(errors="replace").split()
        target = line[1] if len(line) >= 2 else ""
        if len(line) < 2 or line[0] != "CONNECT" or (target not in allowed
                                                    and f"{target.rpartition(':')[0]}:*" not in allowed):
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        host, port = line[1].rsplit(":", 1)
        try:
            up = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        up.settimeout(None)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            up.sendall(rest)
        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join()
        up.close()
    finally:
        conn.close()


def serve(path: str, allowed: list[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    os.chmod(path, 0o600)
    lsock.listen(64)

    def stop(*_: object) -> None:
        try:
            os.unlink(path)
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    allow = set(allowed)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=_handle, args=(conn, allow), daemon=True).start()
