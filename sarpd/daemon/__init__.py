"""The asyncio daemon: the `sarpd` entry point (`cli`), the socket server, the batch
service, access control, metrics, client reports and systemd notification."""
