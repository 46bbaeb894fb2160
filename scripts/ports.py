"""Loopback ports for the scripts that start goodput and its peers (imported by them)."""
import socket
import time


def free_ports(n):
    """`n` distinct free ports on 127.0.0.1: every socket stays bound until all are picked,
    so the kernel cannot hand the same port out twice."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, proc=None, timeout=20):
    """Waits until 127.0.0.1:`port` accepts a connection; fails fast if `proc` (the
    process that should listen there) exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{' '.join(proc.args[:2])} exited with {proc.returncode} at start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")
