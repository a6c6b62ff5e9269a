"""Run the README's examples as a newcomer pastes them: in order, on one fresh sarpd.

The README holds two kinds of runnable blocks, taken in document order:

- ```pycon blocks: Python sessions (`>>> ` / `... ` prompts, the expected output
  below), run with the standard library's doctest, all blocks in one namespace;
- ```console blocks: `$ command` lines, each followed by the output it prints, run
  with bash in the directory that holds `var/` (where `make run` serves), with the
  venv's bin directory first on PATH (as after `. .venv/bin/activate`).

In expected console output a number written `~12.5` varies from run to run (the
README says so once): it matches any number. A block preceded by the line
`<!-- not run: REASON -->` is skipped (it needs something a fresh daemon does not
have, e.g. a stopped daemon or a data file). Every other console or pycon block runs.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!--\s*not run:.*-->\s*$")
VARYING = re.compile(r"~[-+]?[0-9][0-9.,]*")


@dataclass(frozen=True, slots=True)
class Block:
    kind: str  # "pycon" or "console"
    line: int  # 1-based line of the opening fence
    text: str


@dataclass(frozen=True, slots=True)
class Failure:
    line: int
    command: str
    expected: str
    got: str

    def __str__(self) -> str:
        return (f"README line {self.line}: {self.command}\n--- expected\n{self.expected}\n"
                f"--- got\n{self.got}")


def blocks(readme: str) -> list[Block]:
    """The runnable blocks, in document order."""
    out: list[Block] = []
    lines = readme.splitlines()
    i, skip_next = 0, False
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if SKIP.match(lines[i]):
            skip_next = True
        elif fence and fence.group(1):
            start, body = i, []
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            if fence.group(1) in ("pycon", "console") and not skip_next:
                out.append(Block(fence.group(1), start + 1, "\n".join(body) + "\n"))
            skip_next = False
        elif lines[i].strip():
            skip_next = skip_next and lines[i].lstrip().startswith("<!--")
        i += 1
    return out


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of a console block; a `# comment` after a
    command is part of the shell line (bash ignores it)."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


def matches(expected: list[str], got: list[str]) -> bool:
    if len(expected) != len(got):
        return False
    for want, line in zip(expected, got, strict=True):
        parts = VARYING.split(want)
        pattern = r"[-+]?[0-9][0-9.,]*".join(re.escape(p) for p in parts)
        if not re.fullmatch(pattern, line.rstrip()):
            return False
    return True


def run_console(block: Block, cwd: Path, env: dict[str, str]) -> list[Failure]:
    failures: list[Failure] = []
    for command, expected in commands(block):
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=120)
        got = (proc.stdout + proc.stderr).rstrip("\n").splitlines()
        while expected and not expected[-1].strip():
            expected = expected[:-1]
        if not matches(expected, got) or proc.returncode != 0:
            failures.append(Failure(block.line, command, "\n".join(expected),
                                    "\n".join(got) + f"\n(exit {proc.returncode})"))
    return failures


def run_pycon(block: Block, globs: dict[str, Any]) -> list[Failure]:
    test = doctest.DocTestParser().get_doctest(block.text, globs, "README", "README.md",
                                               block.line)
    failures: list[Failure] = []

    class Runner(doctest.DocTestRunner):
        def report_failure(self, out: Any, test: Any, example: Any, got: str) -> None:
            failures.append(Failure(block.line + example.lineno + 1, example.source.strip(),
                                    example.want.rstrip(), got.rstrip()))

        def report_unexpected_exception(self, out: Any, test: Any, example: Any,
                                        exc_info: Any) -> None:
            failures.append(Failure(block.line + example.lineno + 1, example.source.strip(),
                                    example.want.rstrip(), repr(exc_info[1])))

    Runner(optionflags=doctest.NORMALIZE_WHITESPACE).run(test, clear_globs=False)
    globs.update(test.globs)  # DocTest ran on a copy: the next block sees its names
    return failures


def run_readme(readme: Path, cwd: Path) -> tuple[int, list[Failure]]:
    """Run every runnable block of `readme` in order, Python ones with `cwd` as the
    working directory; (blocks run, failures)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SARPD_SOCKET", None)
    globs: dict[str, Any] = {"__name__": "README"}
    failures: list[Failure] = []
    found = blocks(readme.read_text())
    old = Path.cwd()
    os.chdir(cwd)
    try:
        for block in found:
            if block.kind == "pycon":
                failures += run_pycon(block, globs)
            else:
                failures += run_console(block, cwd, env)
    finally:
        for value in list(globs.values()):
            close = getattr(value, "close", None)
            if callable(close) and type(value).__name__ in ("SyncClient",):
                close()
        os.chdir(old)
    return len(found), failures
