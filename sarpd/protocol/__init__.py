"""The sans-I/O wire protocol (PROTOCOL.md): framing and encoding (`wire`), then the one
typed decode of every request (`requests`). Bytes in, typed requests out; no asyncio."""
