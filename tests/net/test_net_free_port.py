"""Nodes of one host process that listen on ``HOST:0`` never get the same port (CI: the kernel handed a
just-probed port to a second starting node, whose server then failed with "Address already in use")."""

from __future__ import annotations

import socket

import pytest

from hushnet.net import node as node_mod
from hushnet.net.errors import NodeError


def test_a_port_picked_and_not_yet_bound_is_not_handed_out_again(monkeypatch) -> None:
    # the kernel answers the same free port twice (as it may: the probe closed it), then another
    answers = iter([40001, 40001, 40003])
    monkeypatch.setattr(node_mod, "_probe_port", lambda host: next(answers))
    first = node_mod._free_port("127.0.0.1")
    second = node_mod._free_port("127.0.0.1")
    try:
        assert (first, second) == (40001, 40003)
    finally:
        node_mod._release_port("127.0.0.1", first)
        node_mod._release_port("127.0.0.1", second)
    # released (its server bound it, or never will): the port may be picked again
    monkeypatch.setattr(node_mod, "_probe_port", lambda host: 40001)
    assert node_mod._free_port("127.0.0.1") == 40001
    node_mod._release_port("127.0.0.1", 40001)


def test_a_kernel_offering_only_held_ports_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(node_mod, "_probe_port", lambda host: 40005)
    held = node_mod._free_port("127.0.0.1")
    try:
        with pytest.raises(NodeError, match="no free port on 127.0.0.1"):
            node_mod._free_port("127.0.0.1")
    finally:
        node_mod._release_port("127.0.0.1", held)


def test_picked_ports_are_real_free_ports() -> None:
    ports = [node_mod._free_port("127.0.0.1") for _ in range(32)]
    try:
        assert len(set(ports)) == 32
        for p in ports[:4]:  # the kernel agrees they are free
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
    finally:
        for p in ports:
            node_mod._release_port("127.0.0.1", p)
