"""Where the harness listens: this host's loopback, unless the user names another address.

A one-host run (``pipesim run``, ``linkbench``, ``profile``, ``validate``) serves its rendezvous
store on 127.0.0.1 and gives its ranks' gloo (and NCCL bootstrap) transport the loopback
interface, whatever the environment or the host name say: nothing of it can be reached from
another host, and none of it is authenticated. A run across hosts (the worker under torchrun)
names its address (MASTER_ADDR) and its interface (GLOO_SOCKET_IFNAME) itself.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path

LOOPBACK_ADDRESS = "127.0.0.1"
IFF_LOOPBACK = 0x8  # Linux's flag of a loopback interface (/sys/class/net/NAME/flags)


def loopback_interface() -> str:
    """The name of this host's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    for flags in sorted(Path("/sys/class/net").glob("*/flags")):
        try:
            if int(flags.read_text().strip(), 16) & IFF_LOOPBACK:
                return flags.parent.name
        except (OSError, ValueError):
            continue
    return "lo0" if sys.platform == "darwin" else "lo"


def is_loopback(address: str) -> bool:
    """Whether every address ``address`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    try:
        found = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(entry[4][0]).split("%")[0]).is_loopback for entry in found)


def one_host_environment() -> dict[str, str]:
    """What a rank of a one-host run is started with, so that it listens on loopback only: the
    store's address, and the interface of gloo's and NCCL's sockets (an inherited
    GLOO_SOCKET_IFNAME, or a host name that resolves to a LAN address, would expose them)."""
    interface = loopback_interface()
    return {"MASTER_ADDR": LOOPBACK_ADDRESS, "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
