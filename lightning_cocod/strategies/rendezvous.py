"""A single-node run keeps its rendezvous on loopback.

torch's TCPStore server binds every interface whatever MASTER_ADDR says, and gloo listens on the
address the host name resolves to. For a run whose MASTER_ADDR is a loopback address (all
workers on this machine) we hand the store a socket bound to 127.0.0.1 and point gloo at ``lo``,
so nothing of the run is reachable from the network. Multi-node runs are left to Lightning (the
store must be reachable from the other nodes there: keep it on a private network).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def init_loopback_group(
    address: str, port: int, rank: int, world_size: int, backend: str, timeout: timedelta, device: torch.device
) -> bool:
    """Initialise the default process group with a 127.0.0.1-only store; False if not applicable."""
    if dist.is_initialized() or not is_loopback(address):
        return False
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    listen_fd = None
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("127.0.0.1", port))
        except OSError as err:
            server.close()
            raise RuntimeError(
                f"cannot listen on 127.0.0.1:{port} for the workers' rendezvous ({err.strerror}): "
                "another run may be using MASTER_PORT; pick a free one"
            ) from None
        server.listen(world_size)
        listen_fd = server.detach()  # the store owns the socket from here
    store = dist.TCPStore(
        "127.0.0.1", port, world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=listen_fd
    )
    kwargs = {"device_id": device} if device.type != "cpu" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    return True
