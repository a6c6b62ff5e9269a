"""`python -m sarpd.daemon`: the same entry point as the `sarpd` command."""

from sarpd.daemon.cli import main

main()
