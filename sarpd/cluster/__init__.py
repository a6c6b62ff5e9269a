"""The cluster room (issue 15): the shard log on NATS JetStream (`log`, asyncio) and the
bytes of one log entry (`entry`, sans-I/O)."""
