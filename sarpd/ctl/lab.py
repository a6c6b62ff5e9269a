"""The lab's commands in sarpctl: `sarpctl bench` and `sarpctl cluster local`.

They live in the repository's tools/ (the benchmark with its baselines, the loopback
cluster launcher), which no install of sarp ships: it runs from a source checkout.
sarpctl knows only their names and one line of help each, and imports the module when
that command runs (click's lazy group: `LabGroup.get_command`), never for `--help` of
the group, for `status` or for any other command.

Where the lab is: the checkout that holds the `sarpd` being run (an editable install,
`make setup`), else the working directory when it holds tools/bench/cli.py (a console
script's sys.path does not hold it). Without one, the command says it runs from a
source checkout and how (`python -m tools.bench ...`), and exits 2; an optional
package the lab needs that is missing is named with its extra the same way.

This importlib call is the one door from sarpd.ctl into tools: import-linter sees
static imports only, and its contract "the admin commands do not import the bench"
holds for every other line of sarpd.ctl.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

import sarpd
from sarpd.ctl.common import fail
from sarpd.errors import missing_extra


@dataclass(frozen=True, slots=True)
class LabCommand:
    """A lab command: where its click command lives and what `--help` says of it."""

    module: str  # a module of the repository's tools/
    attr: str  # its click command
    summary: str  # the group's --help line (shown without importing the module)
    run_as: str  # how a checkout runs it without sarpctl


BENCH = LabCommand("tools.bench.cli", "bench",
                   "Run sarp and the baselines on one workload (from a checkout).",
                   "python -m tools.bench")
CLUSTER_LOCAL = LabCommand("tools.cluster.local", "local",
                           "Start a whole cluster on loopback (from a checkout).",
                           "python -m tools.cluster.local")
LAB_MARKER = Path("tools") / "bench" / "cli.py"


def checkout_root() -> Path | None:
    """The source checkout holding the lab, or None (an install outside a checkout)."""
    for root in (Path(sarpd.__file__).resolve().parents[1], Path.cwd()):
        if (root / LAB_MARKER).is_file():
            return root
    return None


def load(name: str, spec: LabCommand) -> click.Command:
    """The lab command `name` (`bench`, `cluster local`), imported now; a stand-in that
    says why not otherwise."""
    root = checkout_root()
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top == "tools":
            return unavailable(name, f"{name} is a lab command: it runs from a source "
                               f"checkout of sarp (there: sarpctl {name}, or {spec.run_as})")
        extra = missing_extra(exc.name)
        if extra is None:
            raise
        return unavailable(name, f"{name} {extra}")
    command = getattr(module, spec.attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{spec.module}.{spec.attr} is not a click command")
    return command


def unavailable(name: str, message: str) -> click.Command:
    """A command that takes any arguments and says `message` (exit 2)."""

    def run(args: tuple[str, ...]) -> None:
        fail(message)

    return click.Command(
        name.split()[-1], callback=run, add_help_option=False, help=message,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


class LabGroup(click.Group):
    """A click group whose lab commands (`lab`: name -> LabCommand) load when used."""

    def __init__(self, *args: Any, lab: dict[str, LabCommand] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lab = dict(lab or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lab])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lab.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        return load(" ".join([*ctx.command_path.split()[1:], cmd_name]), spec)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands as click lists them, a lab command by its summary (not imported)."""
        rows: list[tuple[str, str]] = []
        width = formatter.width or 80
        limit = width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        for name in self.list_commands(ctx):
            spec = self.lab.get(name)
            if spec is not None:
                rows.append((name, spec.summary))
                continue
            cmd = super().get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
