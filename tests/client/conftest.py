"""The client's tests run on both event loops."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from tests.client.fake_sarpd import LoopFactory


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_factory(request: pytest.FixtureRequest) -> LoopFactory:
    factory: LoopFactory = (
        uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop
    )
    return factory
