"""The shard-rule model (tools/bench/shard_model.py): block 0 puts a shared prompt's
requests on one shard; the heads rule splits the prompt and spreads them, writing
the head once more per extra shard."""

from __future__ import annotations

from click.testing import CliRunner

from tools.bench.shard_model import main, model


def test_heads_spread_what_block_0_cannot() -> None:
    before = model("codeact", 2, 4, "block0")
    after = model("codeact", 2, 4, "heads")
    assert before["max_share"] == 1.0 and before["splits"] == 0
    assert before["write_amplification"] == 1.0
    assert after["requests"] == before["requests"]
    assert after["splits"] >= 1 and after["max_share"] < 0.75
    assert abs(sum(after["shares"]) - 1.0) < 1e-9
    assert 1.0 < after["write_amplification"] < 1.3


def test_the_cli_names_a_wrong_variant() -> None:
    got = CliRunner().invoke(main, ["codeact", "--variants", "nope", "--scale", "1"])
    assert got.exit_code != 0 and "variant 'nope'" in got.output
