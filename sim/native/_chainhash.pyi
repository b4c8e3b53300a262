"""Types of the compiled build's C extension ``sim.native._chainhash`` (source: ``_chainhash.c``)."""

def chain_bytes(hashes: list[int], parent: int, contents: list[bytes], /) -> None: ...
def chain_stream(hashes: list[int], parent: int, head: bytes, start: int, count: int, block_size: int, /) -> None: ...
def chain_trace(
    hashes: list[int],
    parent: int,
    prefix: bytes,
    ids: tuple[int, ...],
    block: int,
    length: int,
    start: int,
    count: int,
    block_size: int,
    /,
) -> None: ...
def digest(data: bytes, /) -> int: ...
