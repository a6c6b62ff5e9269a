"""`sarpctl`, the admin CLI of sarpd: the group and the basic commands (main.py), what
they share (common.py), `top`/`dump` (ops.py), `bridge vllm` (bridge.py), `import`
(importer.py), `cluster status` (cluster.py), and the door to the lab's commands
(lab.py: `bench`, `cluster local`, which run from a source checkout).

Every module only parses options, calls sarpd (mostly `sarpd.client.SyncClient`) and
formats what comes back. Nothing here imports the repository's `tools/` (an
import-linter contract checks it).
"""
