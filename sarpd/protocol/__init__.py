"""The sans-I/O wire protocol (PROTOCOL.md): msgpack framing and encoding (`wire`) and
request validation (`requests`). Bytes in, typed requests out; no asyncio."""
