"""``PagePool``: KV page ids with reference counts (pure Python; the runner holds the page contents).

A page holds ``page_size`` consecutive positions of one token path. Holders are running requests (their page
tables) and prefix-cache nodes; each holder counts once. A page returns to the free list when its count reaches
zero. Pages are never written while shared: a request writes only positions at or after its resume point, and
the page containing the resume point is a private copy (``LaneSetup.copy_page``).
"""

from __future__ import annotations

__all__ = ["PagePool", "PoolExhausted"]


class PoolExhausted(RuntimeError):
    """More pages were asked for than are free (a scheduler bug: admission checks first)."""


class PagePool:
    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages: must be positive, got {num_pages}")
        self.num_pages = num_pages
        self._ref = [0] * num_pages
        # popped from the end: low ids are handed out first, which keeps runs reproducible
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def refcount(self, page: int) -> int:
        return self._ref[page]

    def alloc(self, n: int) -> list[int]:
        """``n`` fresh pages, each with one reference."""
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} KV pages with {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self._ref[p] = 1
        return out

    def incref(self, pages: list[int]) -> None:
        for p in pages:
            if self._ref[p] <= 0:
                raise AssertionError(f"incref of free page {p}")
            self._ref[p] += 1

    def decref(self, pages: list[int]) -> int:
        """Drop one reference from each page; returns how many pages became free."""
        freed = 0
        for p in pages:
            r = self._ref[p] - 1
            if r < 0:
                raise AssertionError(f"decref of free page {p}")
            self._ref[p] = r
            if r == 0:
                self._free.append(p)
                freed += 1
        return freed
