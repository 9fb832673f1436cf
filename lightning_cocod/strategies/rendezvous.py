"""The workers' rendezvous: bounded in time on every rank, and kept on loopback for one node.

torch's store client waits for an answer without a deadline when something else listens on the
port (a foreign listener accepts the connection and never speaks the store's protocol), retries
a connection to nobody past its own timeout, and a rank that meets nobody waits once in the store
and once more in the process group's own connection set-up. Here the whole meeting (store, then
process group) runs under one deadline, the strategy's ``timeout``: past it every rank gives up
with ``RendezvousError``.

For a run whose MASTER_ADDR is a loopback address (all workers on this machine) the store gets a
socket bound to 127.0.0.1 and gloo is pointed at ``lo``, so nothing of the run is reachable from
the network (torch's store server otherwise binds every interface). A multi-node store must be
reachable from the other nodes: keep it on a private network. Under torchrun the agent hosts the
store and torch's own env:// set-up is used, except after a restart (see ``init_default_group``);
with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun leaves the store to rank 0, as here.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from lightning_cocod.strategies.reliability import RendezvousError, first_line

_ARRIVED = "lightning_cocod/ranks_arrived"
# What ``init_default_group`` may set in os.environ; a strategy puts them back at teardown, so a
# notebook or a test harness finds its environment as it was.
RUN_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _listen_on_loopback(port: int, world_size: int) -> int:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("127.0.0.1", port))
    except OSError as err:
        server.close()
        raise RendezvousError(
            f"rank 0 cannot listen on 127.0.0.1:{port} for the workers' rendezvous ({err.strerror}): "
            "another run may be using MASTER_PORT; pick a free one"
        ) from None
    server.listen(world_size)
    return server.detach()  # the store owns the socket from here


def _await_listener(host: str, port: int, deadline: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing listened at {host}:{port}")
        try:
            socket.create_connection((host, port), timeout=min(1.0, remaining)).close()
            return
        except OSError:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _destroy_default_group() -> None:
    # NCCL warns about (and may hang on) a process group still alive at interpreter exit.
    if dist.is_initialized():
        dist.destroy_process_group()


def init_default_group(
    address: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout: timedelta,
    device: torch.device,
) -> bool:
    """Initialise the default process group within ``timeout``; False where torch's own env://
    set-up applies instead (torchrun's agent store, or a group that already exists)."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = address == "localhost"
    if loopback:
        # At every stage, not only the first: the groups a later stage creates read them too.
        # Under torchrun's agent store as well: gloo otherwise listens on the interface the
        # hostname resolves to, a network one on most machines, though every rank is on this one.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if dist.is_initialized():
        return False
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if restart != "0":
            # The agent's store keeps the previous attempt's keys: a restarted rank can read a dead
            # peer's address and wait on it for the whole timeout (torch issue #135712).
            raise RendezvousError(
                f"rank {rank}: torchrun restarted the workers (restart {restart}) over the rendezvous store "
                "of the previous attempt, where they can meet the dead workers' addresses and hang; "
                "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun to restart safely"
            )
        return False
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    listen_fd = _listen_on_loopback(port, world_size) if loopback and rank == 0 else None
    host = "127.0.0.1" if loopback else address
    kwargs = {"device_id": device} if device.type != "cpu" else {}
    failure: list[BaseException] = []
    deadline = time.monotonic() + timeout.total_seconds()
    slack = min(1.0, 0.1 * timeout.total_seconds())

    def meet() -> None:
        try:
            if rank != 0:
                # Wait for rank 0's store ourselves: torch's client retries past its timeout.
                _await_listener(host, port, deadline - slack)
            # The store gives up a little before the deadline, so its thread has ended by then
            # (a thread still inside it when the process exits would abort the process).
            remaining = timedelta(seconds=max(0.1, deadline - time.monotonic() - slack))
            # The server does not wait for the clients in its constructor (a constructor that
            # times out there leaves a thread behind that aborts the process at exit): the
            # ranks count themselves in below, under the deadline: each adds itself, then waits for all.
            store = dist.TCPStore(
                host,
                port,
                world_size,
                is_master=rank == 0,
                timeout=remaining,
                master_listen_fd=listen_fd,
                wait_for_workers=False,
            )
            arrived = store.add(_ARRIVED, 1)
            while arrived < world_size:
                if time.monotonic() > deadline - slack:
                    raise TimeoutError(f"{arrived} of {world_size} ranks arrived")
                time.sleep(0.05)
                arrived = store.add(_ARRIVED, 0)
            store.set_timeout(timeout)
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs
            )
        except BaseException as err:  # noqa: BLE001 - reported on the calling thread
            failure.append(err)

    # A thread, because the store's client has no deadline of its own against a listener that
    # accepts the connection and never answers (another program on the port).
    meeting = threading.Thread(target=meet, name="cocod-rendezvous", daemon=True)
    meeting.start()
    meeting.join(max(0.0, deadline - time.monotonic()))
    if meeting.is_alive() or failure:
        why = "nobody answered in time" if meeting.is_alive() else first_line(failure[0])
        raise RendezvousError(
            f"rank {rank} of {world_size} could not meet the others at {host}:{port} within {timeout}, the "
            f"strategy's `timeout` ({why}): check that every rank runs with the same MASTER_ADDR/MASTER_PORT, "
            "that the address is reachable from this node and that nothing else listens on the port"
        )
    if backend == "nccl":  # Lightning's own set-up registers this when it creates the group; here it did not
        atexit.register(_destroy_default_group)
    return True
