"""``PrefixCache``: token radix tree over retained sequences, with KV pages, GDN checkpoints, LRU and reservations.

Pure Python with integer ids; the runner holds page contents and checkpoint snapshots.

Invariants
- A node covers positions ``[start, end)`` of its root path and holds the pages with page index
  ``start//P .. (end-1)//P``. A node starting inside a page holds its own copy of that boundary page (a running
  request never writes a shared page), which agrees with the parent's page on positions before ``start``.
- A checkpoint always sits at the end of a node: ``node.ckpt`` is the GDN state after ``node.end`` tokens.
- Every leaf has a checkpoint: KV beyond the deepest checkpoint of a path is useless (GDN state cannot be
  recomputed from the middle), so checkpoint-less leaves are pruned.
- ``protect`` counts the reservations in a node's subtree; a node is evicted only with ``protect == 0``, so a
  reserved checkpoint keeps its whole KV path. Reserved checkpoints are dropped only after the oldest reservation
  is released, which happens when the reservation count or the checkpoint budget forces it (``release_oldest``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np

from .kv_pool import PagePool

__all__ = ["PrefixCache", "Match", "Node"]


class Node:
    __slots__ = (
        "id",
        "parent",
        "start",
        "tokens",
        "children",
        "pages",
        "ckpt",
        "last_used",
        "reserved",
        "protect",
        "hpages",
        "hckpt",
        "ckpt_used",
    )

    def __init__(
        self, nid: int, parent: Node | None, start: int, tokens: list[int], pages: list[int]
    ) -> None:
        self.id, self.parent, self.start, self.tokens, self.pages = nid, parent, start, tokens, pages
        self.children: dict[int, Node] = {}
        self.ckpt: int | None = None
        self.last_used = 0
        self.reserved = 0  # reservations on this node's checkpoint
        self.protect = 0  # reservations in this subtree, this node included
        # host tier (tiering.py): a node whose KV was spilled holds host page ids here and no device pages, and its
        # checkpoint (if any) in the host pages ``hckpt`` (``ckpt`` None)
        self.hpages: list[int] = []
        self.hckpt: list[int] | None = None
        self.ckpt_used = (
            0  # tick its checkpoint was last published or resumed from (not raised by descendants)
        )

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def on_host(self) -> bool:
        return bool(self.hpages)

    @property
    def has_ckpt(self) -> bool:
        return self.ckpt is not None or self.hckpt is not None


@dataclass(frozen=True, slots=True)
class Match:
    node: Node  # deepest usable checkpoint node on the prompt's path
    length: int  # tokens covered (node.end): the resume point
    ckpt: int  # checkpoint id at ``length`` (-1 while ``host``)
    pages: list[
        int
    ]  # page table of positions 0..length-1 (the last page may be partly used; empty while ``host``)
    host: bool = False  # part of the path is in the host tier: restore it first (``TieredCache.restore``)


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    diff = np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64)
    return int(np.argmax(diff))


class PrefixCache:
    def __init__(
        self, pool: PagePool, page_size: int, checkpoint_bytes: int, budget_bytes: int, max_reserved: int
    ) -> None:
        self.pool, self.P = pool, page_size
        self.checkpoint_bytes, self.budget_bytes, self.max_reserved = (
            checkpoint_bytes,
            budget_bytes,
            max_reserved,
        )
        self.root = Node(0, None, 0, [], [])
        self._nodes: dict[int, Node] = {}
        self._next_node = 1
        self._next_ckpt = 1
        self._tick = 0
        self._reservations: OrderedDict[int, list[Node]] = OrderedDict()
        self._next_rid = 1
        self.ckpt_used = 0  # bytes of live checkpoint ids (published or being taken)
        self.freed_checkpoints: list[int] = []  # ids the runner must release (drained by the scheduler)
        self.evicted_nodes = 0
        self.evicted_checkpoints = 0

    # ---- lookup -----------------------------------------------------------------------------------------
    def _path(self, tokens: list[int], limit: int) -> list[Node]:
        """The nodes on ``tokens``' path that lie wholly within ``tokens[:limit]``, root excluded."""
        node, i, path = self.root, 0, []
        while i < limit:
            child = node.children.get(tokens[i])
            if (
                child is None
                or child.end > limit
                or _common(child.tokens, tokens[i : child.end]) < len(child.tokens)
            ):
                break
            node, i = child, child.end
            path.append(node)
        return path

    def lookup(self, tokens: list[int], limit: int) -> Match | None:
        """Deepest checkpoint on ``tokens``' path at a position <= ``limit``; None if there is none."""
        path = self._path(tokens, limit)
        best = max((k for k, n in enumerate(path) if n.has_ckpt), default=-1)
        if best < 0:
            return None
        path = path[: best + 1]
        if path[-1].on_host:  # the host part is a suffix of the path (a host node's subtree is on the host)
            return Match(path[-1], path[-1].end, -1, [], host=True)
        pages: list[int] = []
        for n in path:  # a child's first page supersedes its parent's boundary page
            if n.start % self.P and pages:
                pages.pop()
            pages.extend(n.pages)
        end = path[-1]
        assert end.ckpt is not None and len(pages) == -(-end.end // self.P)
        return Match(end, end.end, end.ckpt, pages)

    def node_at(self, tokens: list[int], pos: int) -> Node | None:
        """The node holding a checkpoint exactly at ``pos`` on ``tokens``' path, if any."""
        path = self._path(tokens, pos)
        node = path[-1] if path else None
        return node if node is not None and node.end == pos and node.ckpt is not None else None

    def pin(self, node: Node, d: int = 1) -> None:
        """Protect ``node``'s root path from eviction (``d=-1`` undoes it), e.g. while it is being restored."""
        self._add_protect(node, d)

    def hold(self, node: Node, d: int = 1) -> None:
        """Keep ``node``'s checkpoint and root path as a reservation would (``d=-1`` undoes it): a request placed
        on it whose lane is set up later (after a restore from the host tier) finds them there."""
        node.reserved += d
        self._add_protect(node, d)

    def touch(self, node: Node) -> None:
        self._tick += 1
        node.ckpt_used = self._tick
        n: Node | None = node
        while n is not None:
            n.last_used = self._tick
            n = n.parent

    # ---- insertion --------------------------------------------------------------------------------------
    def publish(self, tokens: list[int], pos: int, lane_pages: list[int], ckpt: int) -> Node:
        """Insert ``tokens[:pos]`` (KV in ``lane_pages``) with checkpoint ``ckpt`` at ``pos``; returns its node.

        Pages the tree already holds for the matched part are kept and the lane's duplicates are not taken; a
        checkpoint that already exists at the same path and position wins and ``ckpt`` is released.
        """
        node, i = self.root, 0
        while i < pos:
            child = self._publish_child(node, tokens[i])
            if child is None:
                break
            n = _common(child.tokens, tokens[i:pos])
            if n < len(child.tokens):
                child = self._split(child, child.start + n)
            node, i = child, child.end
        if i < pos:
            pages = lane_pages[i // self.P : (pos - 1) // self.P + 1]
            self.pool.incref(pages)
            new = self._new_node(node, i, list(tokens[i:pos]), pages)
            node = new
        if node.ckpt is None:
            node.ckpt = ckpt
        else:
            self._free_ckpt(ckpt)
        self.touch(node)
        return node

    def _publish_child(self, node: Node, token: int) -> Node | None:
        """The child of ``node`` that a publish walks into (the tiered cache drops a host child there)."""
        return node.children.get(token)

    def _new_node(self, parent: Node, start: int, tokens: list[int], pages: list[int]) -> Node:
        node = Node(self._next_node, parent, start, tokens, pages)
        self._next_node += 1
        parent.children[tokens[0]] = node
        self._nodes[node.id] = node
        return node

    def _split(self, node: Node, p: int) -> Node:
        """Cut ``node`` at position p (start < p < end); returns the new upper node ``[start, p)``."""
        P, first = self.P, node.start // self.P
        parent = node.parent
        assert parent is not None and node.start < p < node.end
        upper_pages = node.pages[: (p - 1) // P - first + 1]
        lower_pages = node.pages[p // P - first :]
        if p % P:
            self.pool.incref([lower_pages[0]])  # the boundary page is now held by both halves
        # the upper half takes node's place under parent
        upper = self._new_node(parent, node.start, node.tokens[: p - node.start], upper_pages)
        upper.protect, upper.last_used = node.protect, node.last_used
        node.tokens, node.start, node.pages, node.parent = (
            node.tokens[p - node.start :],
            p,
            lower_pages,
            upper,
        )
        upper.children[node.tokens[0]] = node
        return upper

    # ---- checkpoints ------------------------------------------------------------------------------------
    def new_checkpoint(self, important: bool) -> int | None:
        """Account one checkpoint and return its id, evicting LRU checkpoints to stay in budget.

        Stride checkpoints (``important=False``) are skipped when only reserved ones could make room; end-of-prompt
        and end-of-generation checkpoints release the oldest reservations instead.
        """
        need = self.checkpoint_bytes
        while self.ckpt_used + need > self.budget_bytes:
            victim = self._lru(lambda n: n.ckpt is not None and n.reserved == 0)
            if victim is not None:
                self._drop_checkpoint(victim)
            elif important and self._reservations:
                self.release_oldest()
            else:
                return None
        self.ckpt_used += need
        cid = self._next_ckpt
        self._next_ckpt += 1
        return cid

    def _free_ckpt(self, cid: int) -> None:
        self.ckpt_used -= self.checkpoint_bytes
        self.freed_checkpoints.append(cid)

    def discard_checkpoint(self, cid: int) -> None:
        """Release a checkpoint id that was never published."""
        self._free_ckpt(cid)

    def _drop_checkpoint(self, node: Node) -> None:
        assert node.ckpt is not None and node.reserved == 0
        self._free_ckpt(node.ckpt)
        node.ckpt = None
        self.evicted_checkpoints += 1
        if not node.children:
            self._remove(node)

    # ---- eviction ---------------------------------------------------------------------------------------
    def _lru(self, pred) -> Node | None:  # noqa: ANN001 - a Node predicate
        best: Node | None = None
        for n in self._nodes.values():
            if pred(n) and (best is None or n.last_used < best.last_used):
                best = n
        return best

    def _remove(self, node: Node) -> None:
        """Remove a leaf and then every ancestor that became a checkpoint-less leaf."""
        while node is not self.root and not node.children:
            assert node.protect == 0 and node.parent is not None
            self._release(node)
            del node.parent.children[node.tokens[0]]
            del self._nodes[node.id]
            self.evicted_nodes += 1
            parent = node.parent
            if parent.has_ckpt:
                break
            node = parent

    def _release(self, node: Node) -> None:
        """Give back what a node being removed holds on the device (the tiered cache adds the host tier)."""
        if node.ckpt is not None:
            self._free_ckpt(node.ckpt)
            node.ckpt = None
            self.evicted_checkpoints += 1
        self.pool.decref(node.pages)

    def freeable_pages(self) -> int:
        """Pages that evicting every unreserved node would return to the pool."""
        holds = Counter(p for n in self._nodes.values() if n.protect == 0 for p in n.pages)
        return sum(1 for p, c in holds.items() if self.pool.refcount(p) == c)

    def evict_pages(self, n: int) -> bool:
        """Evict unreserved LRU leaves until ``n`` pages are free; False (nothing evicted) if it cannot work."""
        if self.pool.free >= n:
            return True
        if self.pool.free + self.freeable_pages() < n:
            return False
        while self.pool.free < n:
            self._evict_lru()
        return True

    def _evict_lru(self) -> None:
        """Evict the least recently used unreserved leaf (the tiered cache spills it to the host instead)."""
        leaf = self._lru(lambda x: not x.children and x.protect == 0)
        assert leaf is not None, "freeable pages were counted but no leaf is evictable"
        self._remove(leaf)

    # ---- reservations -----------------------------------------------------------------------------------
    def reserve(self, nodes: list[Node]) -> int:
        """Reserve the checkpoints at ``nodes`` (one sequence's latest turn); returns the reservation id."""
        rid = self._next_rid
        self._next_rid += 1
        self._reservations[rid] = list(nodes)
        for node in nodes:
            node.reserved += 1
            self._add_protect(node, 1)
        while len(self._reservations) > self.max_reserved:
            self.release_oldest()
        return rid

    def extend_reservation(self, rid: int | None, node: Node) -> int:
        """Add ``node`` to reservation ``rid`` (made anew, as the newest, if it was released meanwhile)."""
        if rid is None or rid not in self._reservations:
            return self.reserve([node])
        self._reservations[rid].append(node)
        self._reservations.move_to_end(rid)
        node.reserved += 1
        self._add_protect(node, 1)
        return rid

    def release(self, rid: int | None) -> None:
        nodes = self._reservations.pop(rid, None) if rid is not None else None
        for node in nodes or ():
            node.reserved -= 1
            self._add_protect(node, -1)

    def release_oldest(self) -> None:
        if self._reservations:
            self.release(next(iter(self._reservations)))

    def has_reservation(self, rid: int | None) -> bool:
        return rid in self._reservations

    def reservation_of(self, node: Node) -> int | None:
        """The newest reservation holding a checkpoint on ``node``'s root path: the sequence it continues."""
        path: set[int] = set()
        n: Node | None = node
        while n is not None:
            if n.reserved:
                path.add(n.id)
            n = n.parent
        for rid in reversed(self._reservations):
            if any(x.id in path for x in self._reservations[rid]):
                return rid
        return None

    def _add_protect(self, node: Node, d: int) -> None:
        n: Node | None = node
        while n is not None:
            n.protect += d
            n = n.parent

    # ---- statistics -------------------------------------------------------------------------------------
    @property
    def num_reservations(self) -> int:
        return len(self._reservations)

    @property
    def num_checkpoints(self) -> int:
        return sum(1 for n in self._nodes.values() if n.ckpt is not None)

    def held_pages(self) -> set[int]:
        return {p for n in self._nodes.values() for p in n.pages}

    def check(self) -> None:
        """Verify the invariants (tests)."""
        for n in self._nodes.values():
            assert n.parent is not None and n.parent.children.get(n.tokens[0]) is n
            held = n.hpages if n.on_host else n.pages
            assert len(held) == (n.end - 1) // self.P - n.start // self.P + 1
            assert not (n.on_host and (n.pages or n.ckpt is not None)), f"node {n.id} in both tiers"
            assert n.hckpt is None or n.on_host, f"node {n.id}: a host checkpoint on a device node"
            assert n.children or n.has_ckpt, f"leaf {n.id} without checkpoint"
            assert not n.on_host or all(c.on_host for c in n.children.values()), (
                f"host node {n.id}: device child"
            )
            assert n.protect == n.reserved + sum(c.protect for c in n.children.values())
            for c in n.children.values():
                assert c.start == n.end
