"""The indexer API's sans-I/O parts (Dynamo's standalone KV indexer, docs/HTTP.md): the
block keys (`hashing`), the registry of indexers and workers (`workers`), an engine's
events keyed for it (`ingest`) and the requests and answers (`api`). The daemon serves
them (sarpd.daemon.indexer_api)."""
