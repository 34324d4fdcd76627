"""``python -m leanrl.service.healthcheck``: exit 0 when the local service answers ``/health``.

Docker's ``HEALTHCHECK`` runs it inside the container. It asks the unix socket in
``LEANRL_SERVICE_UDS`` if set, else ``127.0.0.1:$LEANRL_SERVICE_PORT`` (default 8000). Only the
standard library is used, so it is quick to start.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys

__all__ = ["main"]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def main() -> int:
    """0 if the service says ``ok``, 1 otherwise (the reason goes to stderr)."""
    uds = os.environ.get("LEANRL_SERVICE_UDS")
    port = int(os.environ.get("LEANRL_SERVICE_PORT", "8000"))
    conn: http.client.HTTPConnection = (
        _UnixConnection(uds, 4.0)
        if uds
        else http.client.HTTPConnection("127.0.0.1", port, timeout=4.0)
    )
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        status = json.loads(resp.read() or b"{}").get("status")
    except (OSError, ValueError) as e:
        print(f"service unreachable: {e}", file=sys.stderr)
        return 1
    if resp.status != 200 or status != "ok":
        print(f"service not ready: HTTP {resp.status}, status {status!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
