"""sarpd: a persistent, SSD-resident prefix index for the KV cache of LLM serving."""

__version__ = "0.1.0"
SERVER_NAME = "sarpd"
PROTOCOL_VERSION = 2  # the newest protocol sarpd speaks (hello negotiates it)
