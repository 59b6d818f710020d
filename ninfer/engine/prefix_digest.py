"""Block hashes of the prefixes an engine retains: what a replica tells the router (docs/replicas.md).

A prompt is cut into blocks of ``block`` tokens; block ``k``'s hash chains the hash of block ``k-1`` with the
block's tokens, so equal hashes mean equal prefixes (up to a 64-bit collision, which costs a routing miss, never a
wrong answer: the engine matches tokens itself). The hash is CPython's tuple-of-ints hash, which is not salted per
process (``PYTHONHASHSEED`` only salts str and bytes), so the API process and every replica compute the same values.

``PrefixDigest`` walks the prefix cache's radix tree and reports, for every GDN checkpoint (a point a request can
resume from), the chain hash of the last full block at or before it. A prompt whose block ``k`` has one of those
hashes shares its first ``k`` blocks with a retained path that has a resume point at or after them, so the router
estimates the reusable prefix by the deepest such block. The estimate can be high by less than a block (the prompt
may leave the path between the block's end and the checkpoint); the engine finds the exact resume point itself.
Per node the walk keeps the chain state it computed, valid while the node's span and its parent's chain state
are the ones it saw, so a walk over an unchanged tree hashes nothing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["chain_hashes", "PrefixDigest"]

_Carry = tuple[int, tuple[int, ...]]  # chain hash at the last full block boundary, tokens after it
_ROOT: _Carry = (0, ())


def chain_hashes(tokens: Sequence[int], block: int, h: int = 0) -> list[int]:
    """The chained hashes of every full ``block``-token block of ``tokens`` (starting from chain state ``h``)."""
    out = []
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, *tokens[i : i + block]))
        out.append(h)
    return out


def _extend(carry: _Carry, tokens: Sequence[int], block: int) -> tuple[list[int], _Carry]:
    h, rest = carry
    seq = (*rest, *tokens)
    full = len(seq) - len(seq) % block
    hashes = chain_hashes(seq[:full], block, h)
    return hashes, (hashes[-1] if hashes else h, tuple(seq[full:]))


class PrefixDigest:
    """The checkpoint-anchored block hashes of a ``PrefixCache`` tree, recomputed only where the tree changed.
    Call ``update`` under the lock that guards the cache."""

    def __init__(self, block: int) -> None:
        if block < 1:
            raise ValueError(f"block: must be positive, got {block}")
        self.block = block
        self.version = 0  # bumped whenever the set of hashes changed
        self._memo: dict[int, tuple[_Carry, int, int, _Carry]] = {}
        self._hashes: frozenset[int] = frozenset()

    def update(self, root: Any) -> tuple[int, tuple[int, ...]]:
        """(version, hashes) of the tree under ``root`` (a prefix_cache ``Node``)."""
        memo: dict[int, tuple[_Carry, int, int, _Carry]] = {}
        anchors: set[int] = set()
        stack: list[tuple[Any, _Carry]] = [(c, _ROOT) for c in root.children.values()]
        while stack:
            node, carry = stack.pop()
            got = self._memo.get(node.id)
            if got is not None and got[0] is carry and got[1] == node.start and got[2] == len(node.tokens):
                entry = got
            else:
                entry = (carry, node.start, len(node.tokens), _extend(carry, node.tokens, self.block)[1])
            memo[node.id] = entry
            out = entry[3]
            if node.ckpt is not None and node.end >= self.block:
                anchors.add(out[0])
            stack.extend((c, out) for c in node.children.values())
        self._memo = memo
        if anchors != self._hashes:
            self.version += 1
            self._hashes = frozenset(anchors)
        return self.version, tuple(self._hashes)
