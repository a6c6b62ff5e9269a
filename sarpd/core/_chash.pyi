from typing_extensions import Buffer

XXHASH_VERSION: int
MAX_BLOCK_TOKENS: int

def chain_ids(parent: Buffer, tokens: Buffer, block_tokens: int, /) -> bytearray: ...
def chain_ids_flat(
    parents: Buffer, tokens: Buffer, offsets: Buffer, block_tokens: int, /
) -> tuple[bytearray, bytearray]: ...
