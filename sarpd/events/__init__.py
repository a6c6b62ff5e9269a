"""Engines' KV-cache events, sans-I/O: vLLM's schema (and SGLang's, where it differs)
decoded by one decoder (`schema`) and mapped to sarp's requests (`mapping`). Below
both consumers: the bridge (`sarpctl bridge`, a process beside an engine) and the
daemon's own listeners (the indexer API)."""
