"""The verifier benchmark (tools.bench.verifier): both first-mismatch
implementations on tiny inputs."""

from __future__ import annotations

from click.testing import CliRunner


def test_verifier_bench_times_both_implementations() -> None:
    from sarpd.core import verify
    from tools.bench.verifier import main as verifier

    res = CliRunner().invoke(verifier, ["--pairs", "16", "--blocks", "37", "--repeat", "10"])
    assert res.exit_code == 0, res.output
    assert "numpy:" in res.output
    if verify.implementation() == "c":
        assert " c:" in res.output and "faster than numpy" in res.output


def test_pairs_differ_first_at_a_random_block() -> None:
    from sarpd.core.verify import first_mismatch_many
    from tools.bench.verifier import pairs

    cands, queries = pairs(64, 9, seed=3)
    assert len(cands) == len(queries) == 64
    assert all(c.shape == q.shape == (9, 2) for c, q in zip(cands, queries, strict=True))
    cuts = first_mismatch_many(cands, queries)
    for c, q, cut in zip(cands, queries, cuts, strict=True):
        assert (c[:cut] == q[:cut]).all()
        assert cut == 9 or (c[cut] != q[cut]).sum() == 1
    assert len(set(cuts)) > 3  # the cut varies
    again, _ = pairs(64, 9, seed=3)
    assert all((a == b).all() for a, b in zip(cands, again, strict=True))
