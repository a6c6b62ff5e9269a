"""The shard rule's alternatives (tools/bench/shard_model.py): block 0 puts a shared
prompt's requests on one shard; the heads rule and its variants spread them, writing
the heads once more per extra shard."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tools.bench.shard_model import VARIANTS, main, model


def test_heads_spread_what_block_0_cannot() -> None:
    before = model("codeact", 2, 4, "block0")
    assert before["max_share"] == 1.0 and before["splits"] == 0
    assert before["write_amplification"] == 1.0
    for name in VARIANTS[1:]:
        after = model("codeact", 2, 4, name)
        assert after["requests"] == before["requests"]
        assert after["splits"] >= 1 and after["max_share"] < 1.0, name
        assert abs(sum(after["shares"]) - 1.0) < 1e-9
        assert 1.0 < after["write_amplification"] < 3.0, name


def test_a_wrong_variant_is_named() -> None:
    got = CliRunner().invoke(main, ["codeact", "--variants", "nope", "--scale", "1"])
    assert got.exit_code != 0 and "variant 'nope'" in got.output
    with pytest.raises(ValueError, match="nope"):
        model("codeact", 1, 2, "nope")
