"""Local clusters for tests, benchmarks and trying sarp out: real processes on loopback
(`nats_local`: a JetStream cluster of nats-server nodes)."""
