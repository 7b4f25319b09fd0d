"""Joining the process group with a rendezvous store bound to the address named, never to every interface.

torch's env:// rendezvous makes rank 0's TCPStore listen on every interface (``*:PORT``, IPv4
and IPv6), whatever MASTER_ADDR says, and gloo picks the address the host name resolves to. Here
rank 0 binds the store's socket to MASTER_ADDR itself and hands it to the store, the other ranks
connect to it, and gloo's interface is loopback for a loopback MASTER_ADDR; an address of another
host needs GLOO_SOCKET_IFNAME, named by the user. Under torchrun's agent store the store is
torchrun's own (bound where its options say).
"""

from __future__ import annotations

import errno
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from pipesim.errors import ConfigError
from pipesim.harness.loopback import is_loopback, loopback_interface


def join_process_group(backend: str, rank: int, world_size: int, timeout: timedelta) -> None:
    """Join the process group of MASTER_ADDR:MASTER_PORT (as torchrun and pipesim's launcher set them).

    Raises:
        ConfigError: MASTER_ADDR is another host's and no GLOO_SOCKET_IFNAME names the interface.
        OSError: rank 0 cannot listen on the port (EADDRINUSE named in the message).
    """
    address, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        if not is_loopback(address):
            raise ConfigError("MASTER_ADDR", address, "is not this host's loopback: a run across hosts must name the "
                              "network interface its ranks listen on (unauthenticated, open to that network) with "
                              "GLOO_SOCKET_IFNAME")
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):  # torchrun serves the store
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        return
    listener = _listen(address, port) if rank == 0 else None
    store = dist.TCPStore(address, port, world_size, rank == 0, timeout,  # type: ignore[attr-defined]
                          master_listen_fd=listener)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _listen(address: str, port: int) -> int:
    """A socket listening on ``address:port`` only; its descriptor, handed over to the store."""
    family, kind, protocol, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, protocol)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does: TIME_WAIT is free
    try:
        listener.bind(where)
        listener.listen(socket.SOMAXCONN)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"EADDRINUSE: the rendezvous port {port} on {address} is already in use") from None
        raise
    return listener.detach()
