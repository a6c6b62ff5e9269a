"""Synthetic workloads shaped like the brief's four datasets, and the workload registry.

Every workload is a stream of `Turn`s: sessions advance round-robin (turn 1 of every
active session, then turn 2, ...); at most `active` sessions run at once and a new
session takes a finished one's place at the next round. A session's turn t matches
its accumulated history plus the new input (`prompt`), then inserts `sequence`
(`prompt` plus the turn's output where the workload indexes outputs; else `prompt`).
Only whole 16-token blocks are ids: the partial tail of a prompt is not a block.

Shapes at scale 1 (sessions grow linearly with `scale`; `active` does not):

| name          | sessions | active | turns | tokens per turn (in + out)     | indexes       |
|---------------|----------|--------|-------|--------------------------------|---------------|
| codeact       | 12       | 4      | 10-30 | tool 200-2,000 + action 50-400 | prompt+output |
| agent         | 6        | 3      | 8-20  | tool 500-3,000 + reply 100-600 | prompt only   |
| sharegpt-long | 16       | 16     | 10-40 | user 50-400 + assistant 50-400 | prompt+output |
| ultrachat     | 2,000    | 64     | 2-6   | user 20-150 + assistant 30-250 | prompt+output |

| name          | shared prefixes                                         | branching             |
|---------------|---------------------------------------------------------|-----------------------|
| codeact       | 4 system prompts of 2-4k tokens, the first 1,024 common | 30% of sessions, once |
| agent         | 3 system prompts of 6-9k tokens, the first 2,048 common | none                  |
| sharegpt-long | 3 short generic system prompts (20-60 tokens)           | 10% of sessions, once |
| ultrachat     | 5 short system prompts (30-120 tokens)                  | none                  |

- codeact: a task (100-400 tokens) follows the system prompt; every later turn
  appends the previous action and a tool's output. A branching session, at one turn
  from its third on, regenerates it (same prompt, new output) or edits its input (a
  new input after the previous turn's sequence): the abandoned turn is replayed, then
  its replacement (one extra turn), and the session continues from the branch.
- agent (LMCache-Agent style): a task of 2-5k tokens gives a first prompt of about
  10-14k tokens; each turn appends the agent's reply and a tool output, until the
  prompt would pass 40k tokens. Few sessions are active, so a session's next turn
  comes a few requests later (seconds in a real agent). Outputs are not indexed (the
  cache stores the prefill, as LMCache does); the next prompt recomputes them.
- sharegpt-long (EABF): long conversations, no big shared system prompt.
- ultrachat: many short chats (the brief used 487,000: scale 244 gives 488,000).

Block ids: tokens are uniform over a 32,000-token vocabulary (numpy), so sequences
share content only where the generator shares it; their whole 16-token blocks get
prefix-chained ids from tools/bench/chains.py (`token_ids`).

Generation is vectorised per chunk of 64 sessions (one random stream for the lengths,
one for the tokens, one hashing pass), and only the sessions a round-robin admits
are built, one chunk at a time. A session depends only on (seed, its index), so the
sessions of scale k are also the first sessions of every larger scale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tools.bench.api import BLOCK_TOKENS, Ids, Turn, Workload
from tools.bench.branchy import factories as branchy_factories
from tools.bench.chains import block_content, chain_segments, root_state
from tools.bench.traces import TraceWorkload

VOCAB = 32_000

# ---------------------------------------------------------------------------------
# Synthetic sessions
# ---------------------------------------------------------------------------------

Range = tuple[int, int]  # inclusive


@dataclass(frozen=True, slots=True)
class Shape:
    """The knobs of a synthetic workload (token counts are inclusive ranges)."""

    tag: int  # salts every random stream and the chain root
    sessions: int  # per unit of scale
    active: int  # sessions running at once
    turns: Range
    first_input: Range  # the first turn's input (the task / first user message)
    inputs: Range  # each later turn's new input (tool output / user message)
    outputs: Range  # each turn's output (action / reply)
    systems: int  # system prompt variants
    system_tokens: Range
    system_common: int  # leading tokens every variant shares
    index_output: bool
    branch_share: float  # share of sessions that branch once
    max_prompt: int  # a session ends before a prompt would pass this


SHAPES: dict[str, Shape] = {
    "codeact": Shape(
        tag=1, sessions=12, active=4, turns=(10, 30), first_input=(100, 400),
        inputs=(200, 2_000), outputs=(50, 400), systems=4, system_tokens=(2_048, 4_096),
        system_common=1_024, index_output=True, branch_share=0.3, max_prompt=1 << 30),
    "agent": Shape(
        tag=2, sessions=6, active=3, turns=(8, 20), first_input=(2_000, 5_000),
        inputs=(500, 3_000), outputs=(100, 600), systems=3, system_tokens=(6_000, 9_000),
        system_common=2_048, index_output=False, branch_share=0.0, max_prompt=40_000),
    "sharegpt-long": Shape(
        tag=3, sessions=16, active=16, turns=(10, 40), first_input=(50, 400),
        inputs=(50, 400), outputs=(50, 400), systems=3, system_tokens=(20, 60),
        system_common=0, index_output=True, branch_share=0.1, max_prompt=1 << 30),
    "ultrachat": Shape(
        tag=4, sessions=2_000, active=64, turns=(2, 6), first_input=(20, 150),
        inputs=(20, 150), outputs=(30, 250), systems=5, system_tokens=(30, 120),
        system_common=0, index_output=True, branch_share=0.0, max_prompt=1 << 30),
}


CHUNK = 64  # sessions drawn together: session i is row i % CHUNK of chunk i // CHUNK
I64s = npt.NDArray[np.int64]
Tokens = npt.NDArray[np.uint64]


def _draw(rng: np.random.Generator, r: Range, size: int | tuple[int, int]) -> I64s:
    return rng.integers(r[0], r[1] + 1, size=size)


def _tokens(rng: np.random.Generator, n: int) -> Tokens:
    return rng.integers(1, VOCAB, size=n, dtype=np.uint64)


def system_prompts(shape: Shape, seed: int) -> list[Tokens]:
    """The workload's system prompt variants (tokens); they share `system_common`."""
    common = _tokens(np.random.default_rng([seed, shape.tag, 0]), shape.system_common)
    out = []
    for v in range(shape.systems):
        rng = np.random.default_rng([seed, shape.tag, 1, v])
        n = max(int(_draw(rng, shape.system_tokens, 1)[0]), shape.system_common)
        out.append(np.concatenate([common, _tokens(rng, n - shape.system_common)]))
    return out


@dataclass(frozen=True, slots=True)
class Plans:
    """The random draws of one chunk of sessions (row i: session chunk * CHUNK + i)."""

    variant: I64s  # system prompt
    inputs: I64s  # (CHUNK, max turns): new input tokens of each turn
    outputs: I64s  # (CHUNK, max turns): output tokens of each turn
    turns: I64s  # turns played (the drawn count, cut by max_prompt)
    branch: I64s  # the turn (from 0) that branches, or -1
    regen: npt.NDArray[np.bool_]  # the branch regenerates the output (else edits the input)
    new_in: I64s  # the branch's input tokens (if it edits)
    new_out: I64s  # the branch's output tokens


def draw_plans(shape: Shape, seed: int, chunk: int, sys_lens: I64s) -> Plans:
    """Every random length of a chunk, vectorised, from the chunk's own stream."""
    rng = np.random.default_rng([seed, shape.tag, 2, chunk])
    size = (CHUNK, shape.turns[1])
    variant = rng.integers(shape.systems, size=CHUNK)
    turns = _draw(rng, shape.turns, CHUNK)
    inputs = _draw(rng, shape.inputs, size)
    inputs[:, 0] = _draw(rng, shape.first_input, CHUNK)
    outputs = _draw(rng, shape.outputs, size)
    step = inputs + outputs
    prompt = sys_lens[variant][:, None] + np.cumsum(step, axis=1) - outputs
    fits = prompt <= shape.max_prompt
    fits[:, 0] = True
    turns = np.minimum(turns, np.logical_and.accumulate(fits, axis=1).sum(axis=1))
    pick, where = rng.random(CHUNK), rng.random(CHUNK)
    branching = (pick < shape.branch_share) & (turns >= 3)
    branch = np.where(branching, 2 + (where * (turns - 2)).astype(np.int64), -1)
    return Plans(variant, inputs, outputs, turns, branch, rng.random(CHUNK) < 0.5,
                 _draw(rng, shape.inputs, CHUNK), _draw(rng, shape.outputs, CHUNK))


@dataclass(frozen=True, slots=True)
class _Step:
    """One turn on a token stream: its prompt and sequence lengths in tokens."""

    stream: int
    prompt: int
    seq: int


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a session's turns lie. The last stream is the path followed: the system
    prompt and `length` - len(system) fresh tokens. A branching session has a stream 0
    too: the path's first `cut` tokens, then `extra` fresh ones (the abandoned turn)."""

    steps: list[_Step]  # in replay order
    length: int
    cut: int  # -1: no branch
    extra: int


def _steps(shape: Shape, start: int, plan: list[tuple[int, int]],
           stream: int) -> tuple[list[_Step], int]:
    """Steps of `plan` on one stream starting at token `start`; returns the end.
    Outputs are always part of the history; `seq` covers them if they are indexed."""
    steps, length = [], start
    for inp, out in plan:
        prompt = length + inp
        length = prompt + out
        steps.append(_Step(stream, prompt, length if shape.index_output else prompt))
    return steps, length


def _layout(shape: Shape, plans: Plans, i: int, sys_len: int) -> _Layout:
    """Session row i's layout. A branching session forks at turn b: it regenerates b
    (same prompt, new output) or edits b's input (new input after turn b-1); the
    abandoned turn b (stream 0) is replayed just before its replacement (stream 1),
    which every later turn follows."""
    n, b = int(plans.turns[i]), int(plans.branch[i])
    plan = list(zip(plans.inputs[i, :n].tolist(), plans.outputs[i, :n].tolist(), strict=True))
    if b < 0:
        steps, end = _steps(shape, sys_len, plan, 0)
        return _Layout(steps, end, -1, 0)
    regen = bool(plans.regen[i])
    new = (plan[b][0] if regen else int(plans.new_in[i]), int(plans.new_out[i]))
    steps, end = _steps(shape, sys_len, [*plan[:b], new, *plan[b + 1:]], 1)
    start_b = sys_len + sum(x + y for x, y in plan[:b])
    cut = start_b + plan[b][0] if regen else start_b
    abandoned, stop = _steps(shape, start_b, [plan[b]], 0)
    return _Layout([*steps[:b], abandoned[0], *steps[b:]], end, cut, stop - cut)


def build_chunk(shape: Shape, seed: int, chunk: int, count: int,
                systems: list[Tokens]) -> list[list[tuple[Ids, Ids]]]:
    """(prompt ids, sequence ids) of every turn, in order, of the chunk's first `count`
    sessions. Tokens come from one pool drawn in session order, and every stream of
    the chunk is hashed in one vectorised pass (`chain_segments`)."""
    sys_lens = np.array([len(t) for t in systems], dtype=np.int64)
    plans = draw_plans(shape, seed, chunk, sys_lens)
    variants = plans.variant[:count].tolist()
    layouts = [_layout(shape, plans, i, int(sys_lens[v])) for i, v in enumerate(variants)]
    fresh = [lay.length - int(sys_lens[v]) for lay, v in zip(layouts, variants, strict=True)]
    pool = _tokens(np.random.default_rng([seed, shape.tag, 3, chunk]),
                   sum(fresh) + sum(lay.extra for lay in layouts))
    streams: list[Tokens] = []
    at = 0
    for lay, v, n in zip(layouts, variants, fresh, strict=True):
        path = np.concatenate([systems[v], pool[at: at + n]])
        at += n
        if lay.cut >= 0:
            streams.append(np.concatenate([path[: lay.cut], pool[at: at + lay.extra]]))
            at += lay.extra
        streams.append(path)
    blocks = np.array([len(t) // BLOCK_TOKENS for t in streams], dtype=np.int64)
    whole = np.concatenate([t[: k * BLOCK_TOKENS] for t, k in zip(streams, blocks, strict=True)])
    ids = chain_segments(block_content(whole), blocks, root_state(seed, shape.tag))
    ids.setflags(write=False)
    per_stream = np.split(ids, np.cumsum(blocks)[:-1])
    out, first = [], 0
    for lay in layouts:
        mine = per_stream[first: first + (2 if lay.cut >= 0 else 1)]
        first += len(mine)
        out.append([(mine[s.stream][: s.prompt // BLOCK_TOKENS],
                     mine[s.stream][: s.seq // BLOCK_TOKENS]) for s in lay.steps])
    return out


def round_robin(sessions: int, active: int,
                build: Callable[[int], list[tuple[Ids, Ids]]]) -> Iterator[tuple[int, Ids, Ids]]:
    """(session, prompt, sequence) in round-robin order over at most `active` sessions.

    Each round gives every active session its next turn, in admission order; sessions
    that finished leave after the round and pending ones are admitted (and built)
    in their place, to start at the next round."""
    pending = iter(range(sessions))
    running: list[tuple[int, list[tuple[Ids, Ids]], list[int]]] = []

    def admit() -> None:
        while len(running) < active:
            s = next(pending, None)
            if s is None:
                return
            turns = build(s)
            if turns:
                running.append((s, turns, [0]))

    admit()
    while running:
        for s, turns, pos in running:
            prompt, seq = turns[pos[0]]
            pos[0] += 1
            yield s, prompt, seq
        running[:] = [r for r in running if r[2][0] < len(r[1])]
        admit()


def _fmt(r: Range) -> str:
    return f"{r[0]:,}-{r[1]:,}"


@dataclass(slots=True)  # not frozen: api.Workload declares `name` as a plain attribute
class SyntheticWorkload:
    """A synthetic workload: `SHAPES[name]` with `scale` times its sessions."""

    name: str
    scale: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in SHAPES:
            raise ValueError(f"unknown synthetic workload {self.name!r}; known: "
                             f"{', '.join(SHAPES)}")
        if self.scale < 1:
            raise ValueError(f"workload {self.name}: scale must be >= 1, got {self.scale}")
        if self.seed < 0:
            raise ValueError(f"workload {self.name}: seed must be >= 0, got {self.seed}")

    @property
    def shape(self) -> Shape:
        return SHAPES[self.name]

    def describe(self) -> str:
        s = self.shape
        branch = f", {s.branch_share:.0%} of sessions branch once" if s.branch_share else ""
        cap = f" (prompt <= {s.max_prompt:,})" if s.max_prompt < 1 << 30 else ""
        return (f"{self.name}: {s.sessions * self.scale:,} sessions ({s.active} active), "
                f"{_fmt(s.turns)} turns{cap}, first input {_fmt(s.first_input)} then "
                f"{_fmt(s.inputs)} input + {_fmt(s.outputs)} output tokens per turn, "
                f"{s.systems} system prompts of {_fmt(s.system_tokens)} tokens "
                f"({s.system_common:,} common){branch}; indexes "
                f"{'prompt+output' if s.index_output else 'prompt only'}; "
                f"scale {self.scale}, seed {self.seed}")

    def turns(self) -> Iterator[Turn]:
        shape, seed, total = self.shape, self.seed, self.shape.sessions * self.scale
        systems = system_prompts(shape, seed)
        cache: dict[int, list[list[tuple[Ids, Ids]]]] = {}

        def build(i: int) -> list[tuple[Ids, Ids]]:
            chunk = i // CHUNK
            if chunk not in cache:  # sessions are admitted in order: keep one chunk
                cache.clear()
                cache[chunk] = build_chunk(shape, seed, chunk,
                                           min(CHUNK, total - chunk * CHUNK), systems)
            return cache[chunk][i % CHUNK]

        for s, prompt, seq in round_robin(total, shape.active, build):
            yield Turn(session=s, ns=self.name, prompt=prompt, sequence=seq)


def _factory(name: str) -> Callable[[int, int], Workload]:
    def make(scale: int = 1, seed: int = 0) -> Workload:
        return SyntheticWorkload(name, scale, seed)
    return make


WORKLOADS: dict[str, Callable[[int, int], Workload]] = {
    **{n: _factory(n) for n in SHAPES},
    **branchy_factories(),  # branches from inside sessions (tools/bench/branchy.py)
}


def parse_trace_spec(spec: str) -> tuple[Path, int]:
    """`trace:PATH` or `trace:PATH@BLOCKSIZE` -> (path, block tokens; default 16)."""
    body = spec.removeprefix("trace:")
    if not body:
        raise ValueError(f"workload {spec!r}: trace:PATH[@BLOCKSIZE] needs a path")
    path, at, size = body.rpartition("@")
    if at and size.isdigit():
        return Path(path), int(size)
    if at and not path:
        raise ValueError(f"workload {spec!r}: trace:PATH[@BLOCKSIZE] needs a path")
    return Path(body), BLOCK_TOKENS


def get_workload(spec: str, scale: int = 1, seed: int = 0) -> Workload:
    """A registered synthetic workload by name, or `trace:PATH[@BLOCKSIZE]`."""
    if spec.startswith("trace:"):
        path, block = parse_trace_spec(spec)
        return TraceWorkload(path, block, scale, seed)
    factory = WORKLOADS.get(spec)
    if factory is None:
        raise ValueError(f"unknown workload {spec!r}; known: {', '.join(WORKLOADS)}, "
                         "trace:PATH[@BLOCKSIZE]")
    return factory(scale, seed)
