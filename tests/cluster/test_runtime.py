"""Joining Ray: a bad or unreachable `ray.address` is one ConfigError line, raised before any model loads."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from p3o.cluster.runtime import preflight
from p3o.errors import ConfigError


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("no-port-here", "is not 'auto', 'host:port' or 'ray://host:port'"),
        ("127.0.0.1:9", "cannot reach a Ray cluster at 127.0.0.1:9"),
        ("ray://127.0.0.1:9", "cannot reach a Ray cluster at ray://127.0.0.1:9"),
    ],
)
def test_bad_addresses_are_refused_in_one_line(address, message):
    with pytest.raises(ConfigError, match=r"^ray\.address: ") as err:
        preflight(SimpleNamespace(address=address, num_cpus=None))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_listening_address_passes():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        preflight(SimpleNamespace(address=f"127.0.0.1:{srv.getsockname()[1]}", num_cpus=None))
    preflight(SimpleNamespace(address=None, num_cpus=2))  # no address: a local instance, nothing to check
