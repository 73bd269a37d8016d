"""The chunk schedule of a stream, from the orchestrator's rendered parameters."""

from __future__ import annotations

from dataclasses import dataclass

UPSTREAM_FIRST_HOP = 15  # upstream's token_hop_len
LOOKAHEAD_TOKENS = 3  # the flow's pre_lookahead_len
TOKEN_RATE = 25  # speech tokens per second
STRATEGIES = ("exponential", "equal", "time_based")


@dataclass(frozen=True)
class Chunking:
    """``first``: tokens of the first chunk (``token_hop_len``, i.e. ``firstChunkTokens``);
    ``strategy``: ``exponential`` (later hops 25 x 2^k, upstream's), ``equal`` (every hop
    ``first``) or ``time_based`` (upstream sizes hops from measured synthesis speed; here the
    exponential schedule, never smaller than ``first``)."""

    first: int = UPSTREAM_FIRST_HOP
    strategy: str = "exponential"

    def __post_init__(self) -> None:
        if self.first < 1:
            raise ValueError(f"token_hop_len must be at least 1, not {self.first}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"dynamic_chunk_strategy {self.strategy!r} not in {STRATEGIES}")

    def hop_after(self, index: int) -> int:
        """The hop that follows chunk ``index`` (0 is the first chunk)."""
        if self.strategy == "equal":
            return self.first
        growth: int = TOKEN_RATE * (1 << index)
        return max(self.first, growth)

    def cut(self, available: int, offset: int, index: int, hop: int) -> bool:
        """Whether ``available`` tokens allow the chunk of ``hop`` tokens from ``offset``."""
        return available - offset >= hop + LOOKAHEAD_TOKENS

    def schedule(self, total: int) -> list[tuple[int, int]]:
        """(offset, end) of every chunk of a stream of ``total`` tokens, the last finalized;
        ``end`` excludes the look-ahead the chunk is sent with."""
        chunks, offset, hop, index = [], 0, self.first, 0
        while self.cut(total, offset, index, hop):
            chunks.append((offset, offset + hop))
            offset += hop
            hop = self.hop_after(index)
            index += 1
        chunks.append((offset, total))
        return chunks
