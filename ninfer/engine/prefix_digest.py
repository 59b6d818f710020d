"""Block hashes of the prefixes an engine retains: what a replica tells the router (docs/replicas.md).

A prompt is cut into blocks of ``block`` tokens; block ``k``'s hash chains the hash of block ``k-1`` with the
block's tokens, so equal hashes mean equal prefixes (up to a 64-bit collision, which costs a routing miss, never a
wrong answer: the engine matches tokens itself). The hash is CPython's tuple-of-ints hash, which is not salted per
process (``PYTHONHASHSEED`` only salts str and bytes), so the API process and every replica compute the same values.

``PrefixDigest`` walks the prefix cache's radix tree and hashes every full block on a retained path. Every leaf
of the tree holds a GDN checkpoint (prefix_cache.py's invariant), so every block on it lies under a usable resume
point. Per node it keeps the hashes it computed, valid while the node's span and its parent's chain state are the
ones it saw, so a walk over an unchanged tree hashes nothing again.
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
    """The block hashes of a ``PrefixCache`` tree, recomputed only where the tree changed. Call ``update`` under
    the lock that guards the cache."""

    def __init__(self, block: int) -> None:
        if block < 1:
            raise ValueError(f"block: must be positive, got {block}")
        self.block = block
        self.version = 0  # bumped whenever the set of hashes may have changed
        self._memo: dict[int, tuple[_Carry, int, int, list[int], _Carry]] = {}
        self._hashes: tuple[int, ...] = ()

    def update(self, root: Any) -> tuple[int, tuple[int, ...]]:
        """(version, hashes) of the tree under ``root`` (a prefix_cache ``Node``)."""
        memo: dict[int, tuple[_Carry, int, int, list[int], _Carry]] = {}
        changed = False
        stack: list[tuple[Any, _Carry]] = [(c, _ROOT) for c in root.children.values()]
        while stack:
            node, carry = stack.pop()
            got = self._memo.get(node.id)
            if got is not None and got[0] is carry and got[1] == node.start and got[2] == len(node.tokens):
                entry = got
            else:
                hashes, out = _extend(carry, node.tokens, self.block)
                entry = (carry, node.start, len(node.tokens), hashes, out)
                changed = True
            memo[node.id] = entry
            stack.extend((c, entry[4]) for c in node.children.values())
        if changed or len(memo) != len(self._memo):
            self.version += 1
            self._hashes = tuple(h for e in memo.values() for h in e[3])
        self._memo = memo
        return self.version, self._hashes
