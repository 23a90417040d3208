"""Who owns the listening socket of a store gputui serves (gputui.train.rdzv.serve_store): torch,
once it is handed over. gputui used to keep the socket too and close it at a run's end; torch's
own close, when the store went, then closed whatever file the process had opened under that
number since (a DDP run's stop thread saw "Bad file descriptor" reading /proc)."""

from __future__ import annotations

import gc
import os
import socket
import tempfile
from datetime import timedelta

import pytest

from gputui.train import rdzv
from tests.proc_support import wait_until


def open_numbers() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_torch_closes_the_listening_socket_it_is_handed_when_the_store_goes() -> None:
    """The contract that makes one owner right: TCPStoreOptions.masterListenFd is taken over."""
    import torch.distributed as tdist

    sock = rdzv.listen_socket("127.0.0.1", 0)
    made = os.fstat(sock.fileno())
    fd = sock.detach()
    store = tdist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False, master_listen_fd=fd,
                           timeout=timedelta(seconds=30))
    assert os.fstat(fd).st_ino == made.st_ino
    del store
    gc.collect()
    try:
        now = os.fstat(fd)
    except OSError:
        return  # closed by torch
    assert now.st_ino != made.st_ino, "torch left the socket it was handed open"  # the number is another file's


def test_a_served_store_is_its_sockets_one_owner() -> None:
    store = rdzv.serve_store("127.0.0.1", 0, timeout_s=30)
    port = store.port
    store.set("k", "v")
    assert store.get("k") == b"v"
    with tempfile.TemporaryFile() as later:  # a file opened while the store serves
        del store
        gc.collect()
        os.fstat(later.fileno())  # still this file's: nothing closed its number
        later.write(b"intact")
        later.seek(0)
        assert later.read() == b"intact"
    wait_until(lambda: refused(port), 30, "the port to stop listening once the store is gone")


def test_a_store_that_fails_to_start_leaves_no_socket_open() -> None:
    before = open_numbers()
    with pytest.raises(ValueError):
        rdzv.serve_store("127.0.0.1", 0, timeout_s=30, world_size=0)  # torch refuses a world of 0
    gc.collect()
    assert len(open_numbers()) == len(before)  # (each listing counts its own descriptor once)
