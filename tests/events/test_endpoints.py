"""sarpd/events/endpoints.py: an engine endpoint is checked before anything connects;
a bad one names the option, the value and the expected form."""

from __future__ import annotations

import pytest

from sarpd.errors import BadRequest, ConfigError
from sarpd.events.endpoints import check_endpoint


@pytest.mark.parametrize(
    "endpoint", ["tcp://gpu3:5557", "tcp://10.0.0.5:1", "tcp://[::1]:65535", "ipc:///run/kv"]
)
def test_good_endpoints_pass(endpoint: str) -> None:
    assert check_endpoint(endpoint, "--endpoint") == endpoint


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("foo", "expected tcp://HOST:PORT"),
        ("tcp://nohost:x", "port 'x' is not 1..65535"),
        ("tcp://h:0", "port '0' is not 1..65535"),
        ("tcp://h:99999", "port '99999' is not 1..65535"),
        ("tcp://*:5557", "* is a bind address"),
        ("tcp://:5557", "no host"),
        ("tcp://gpu3", "no host"),
        ("udp://gpu3:5557", "expected tcp://HOST:PORT"),
        ("ipc://", "no path"),
    ],
)
def test_bad_endpoints_name_option_value_and_rule(endpoint: str, why: str) -> None:
    with pytest.raises(ConfigError) as exc:
        check_endpoint(endpoint, "--replay")
    assert str(exc.value).startswith(f"--replay {endpoint!r}: ") and why in str(exc.value)


def test_a_request_s_endpoint_is_a_bad_request() -> None:
    """The indexer API's /register: the client's error, not the operator's."""
    with pytest.raises(BadRequest, match="endpoint 'tcp://\\*:1': \\* is a bind address"):
        check_endpoint("tcp://*:1", "endpoint", BadRequest)

