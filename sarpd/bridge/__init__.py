"""Bridges that feed sarpd from serving engines' KV-event streams (vLLM, SGLang)."""
