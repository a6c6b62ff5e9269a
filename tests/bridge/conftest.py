"""The bridge tests' publisher: a stand-in for vLLM's ZmqEventPublisher."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.bench.vllm_publisher import Publisher


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher()
    yield pub
    pub.close()
