"""The synchronous index: ids, segments, the manifest, the routing directory,
snapshots, the verifier, the store (backend, segment cache, counters), the router
(routing points, candidates) and `SarpIndex` on top, with the write path, `check` and
`dump`. No asyncio, no sockets: the only I/O is the backend and the snapshot
directory."""
