"""The apiserver forwarder: the hollow kubelets' only way out of their network namespace
(`python -m gpu_install_lab.kube _forward NETNS_PATH LISTEN_PORT TARGET_PORT`, process
"apiserver-forwarder")."""

from __future__ import annotations

import os
import signal
import socket


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until src ends, then half-close both ways (one direction of a proxied connection)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def forward(netns_path: str, listen_port: int, target_port: int) -> None:
    """Accept on 127.0.0.1:listen_port inside netns_path; connect to 127.0.0.1:target_port on the
    host's loopback. Network namespaces are per thread: the listening socket is created after
    setns() into the nodes' namespace, every other socket after setns() back."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    host = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    if libc.setns(target, clone_newnet) != 0:
        raise OSError(ctypes.get_errno(), f"setns({netns_path})")
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", listen_port))
    lsock.listen(128)
    if libc.setns(host, clone_newnet) != 0:
        raise OSError(ctypes.get_errno(), "setns(host)")
    os.close(target)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    def handle(conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", target_port), timeout=10)
            up.settimeout(None)
        except OSError:
            conn.close()
            return
        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join()
        conn.close()
        up.close()

    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()

