"""Engines' KV-cache events, sans-I/O: vLLM's schema decoded (`schema`) and mapped to
sarp's requests (`mapping`). Below both consumers: the bridge (`sarpctl bridge`, a
process beside an engine) and the daemon's own listeners (the indexer API)."""
