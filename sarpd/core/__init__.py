"""The synchronous index: ids, segments, the routing directory, snapshots, the
verifier, the store, the router and `SarpIndex` on top. No asyncio, no sockets: the
only I/O is the backend and the snapshot directory."""
