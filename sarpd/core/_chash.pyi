"""sarpd/core/_chash.c: the block-id chain (reference: sarpd.core.ids)."""

from typing import Any

import numpy.typing as npt

XXHASH_VERSION: int
MAX_BLOCK_TOKENS: int

BufferLike = bytes | bytearray | memoryview | npt.NDArray[Any]

def chain_ids(parent: BufferLike, tokens: BufferLike, block_tokens: int, /) -> bytearray: ...
def chain_ids_flat(
    parents: BufferLike, tokens: BufferLike, offsets: BufferLike, block_tokens: int, /
) -> tuple[bytearray, bytearray]: ...
def block_hashes(tokens: BufferLike, block_tokens: int, seed: int, /) -> bytearray: ...
def msgpack_u32(raw: BufferLike | bytes, /) -> bytes | None: ...
