"""``TieredCache``: the prefix cache with a host tier (docs/tiering.md).

Pure Python with integer ids, like ``PrefixCache``: the runner holds the host copies (``ModelRunner.host_pages``
pages of one KV page's bytes; a GDN checkpoint takes ``ceil(snapshot_bytes / page_bytes)`` of them, so KV and
checkpoints share one budget) and carries out the ``TierCopy`` moves planned here.

- **Spill.** Where the device cache would drop its least recently used unreserved node (to free KV pages or
  checkpoint budget), that node moves to the host tier instead: its pages and its checkpoint are copied into host
  ids and the device ids are released at once. Only a node whose children are all on the host moves, so the
  device part of the tree stays closed upwards: a host node's subtree is entirely on the host. A node larger
  than the whole host tier is dropped as before.
- **Host eviction.** Host space is made by dropping host checkpoints, the one least recently published or resumed
  from first (``Node.ckpt_used``, which a descendant's use does not raise, unlike ``last_used``): a leaf goes with
  its KV (and ancestors left without a checkpoint or child go too), an inner node keeps its KV for its subtree.
  So the checkpoints of earlier turns of a session go before the latest turn of any recently active session. A
  host node is never reserved: reservations rule device residency only.
- **Restore.** A lookup whose deepest checkpoint lies on the host (``Match.host``) is restored before it is
  used: the host nodes of the path get fresh device pages and checkpoint ids and one ``TierCopy`` each, under one
  ticket. The host ids stay held until the runner reports the ticket done (``restored``), so a spill planned
  meanwhile never overwrites what the copy still reads.
- A publish that would walk through a host node (a request recomputed a path the host tier holds, or parts
  from it inside the node) drops that host subtree and inserts the lane's own pages.
"""

from __future__ import annotations

from .core import TierCopy
from .kv_pool import PagePool
from .prefix_cache import Match, Node, PrefixCache

__all__ = ["TieredCache", "Restore"]


class Restore:
    """A planned restore: its ticket, the prompt tokens it brings back, the bytes it copies."""

    __slots__ = ("ticket", "tokens", "bytes")

    def __init__(self, ticket: int, tokens: int, nbytes: int) -> None:
        self.ticket, self.tokens, self.bytes = ticket, tokens, nbytes


class TieredCache(PrefixCache):
    def __init__(
        self,
        pool: PagePool,
        page_size: int,
        checkpoint_bytes: int,
        budget_bytes: int,
        max_reserved: int,
        *,
        host_pages: int,
        page_bytes: int,
    ) -> None:
        super().__init__(pool, page_size, checkpoint_bytes, budget_bytes, max_reserved)
        self.host_pool = PagePool(host_pages)
        self.page_bytes = page_bytes
        self.ckpt_pages = -(-checkpoint_bytes // page_bytes)  # host pages one checkpoint takes
        self.copies: list[TierCopy] = []  # spills and restores planned since the scheduler last drained them
        self._held: dict[int, list[int]] = {}  # restore ticket -> the host pages it reads
        self._next_ticket = 1
        self.num_spills = self.spill_bytes = self.host_evictions = 0
        self.num_restores = self.restore_bytes = 0

    # ---- spill --------------------------------------------------------------------------------------------
    def _spillable(self, n: Node) -> bool:
        return not n.on_host and n.protect == 0 and all(c.on_host for c in n.children.values())

    def _evict_lru(self) -> None:
        victim = self._lru(self._spillable)
        assert victim is not None, "freeable pages were counted but no node can leave the device"
        self._spill(victim)

    def _drop_checkpoint(self, node: Node) -> None:
        if self._spillable(node):
            self._spill(node)  # the checkpoint goes to the host with its node
        else:
            super()._drop_checkpoint(node)

    def _spill(self, node: Node) -> None:
        """Move ``node`` (device, no device children, unreserved) to the host tier, or drop it with its host
        subtree when the host tier cannot hold it."""
        n_pages, n_ckpt = len(node.pages), int(node.ckpt is not None)
        if not self._host_room(n_pages + n_ckpt * self.ckpt_pages):
            if node.id in self._nodes:
                self._drop_subtree(node)
            return
        if node.id not in self._nodes:  # making host room dropped its last host child, and with it the node
            return
        hp = self.host_pool.alloc(n_pages)
        hc = self.host_pool.alloc(self.ckpt_pages) if n_ckpt else None
        self.copies.append(TierCopy(0, list(node.pages), hp, node.ckpt, hc or []))
        self.pool.decref(node.pages)
        if node.ckpt is not None:
            self._free_ckpt(node.ckpt)  # released by the runner after the step's spills read it
        node.pages, node.ckpt, node.hpages, node.hckpt = [], None, hp, hc
        self.num_spills += 1
        self.spill_bytes += n_pages * self.page_bytes + n_ckpt * self.checkpoint_bytes

    def _host_room(self, pages: int) -> bool:
        """Drop host leaves (LRU) until ``pages`` host pages are free."""
        if pages > self.host_pool.num_pages:
            return False
        while self.host_pool.free < pages:
            victim: Node | None = None
            for x in self._nodes.values():
                if (
                    x.hckpt is not None
                    and x.protect == 0
                    and (victim is None or x.ckpt_used < victim.ckpt_used)
                ):
                    victim = x
            if victim is None:
                return False
            if victim.children:
                self.host_pool.decref(victim.hckpt)
                victim.hckpt = None
                self.host_evictions += 1
            else:
                self._remove(victim)
        return True

    def _drop_subtree(self, node: Node) -> None:
        """Remove ``node`` with its (host) subtree, then its ancestors that became checkpoint-less leaves."""
        self._drop_below(node)
        self._remove(node)

    def _drop_below(self, node: Node) -> None:
        """Remove every descendant of ``node`` (all on the host), deepest first; ``node`` stays."""
        for child in list(node.children.values()):
            self._drop_below(child)
            assert child.on_host and child.protect == 0
            self._release(child)
            del node.children[child.tokens[0]]
            del self._nodes[child.id]
            self.evicted_nodes += 1

    def _release(self, node: Node) -> None:
        if node.on_host:
            self.host_pool.decref(node.hpages + (node.hckpt or []))
            node.hpages, node.hckpt = [], None
            self.host_evictions += 1
            return
        super()._release(node)

    def _publish_child(self, node: Node, token: int) -> Node | None:
        child = node.children.get(token)
        if child is not None and child.on_host:  # the lane's pages replace the host copy of this path
            self._drop_below(child)
            self._release(child)
            del node.children[token]
            del self._nodes[child.id]
            self.evicted_nodes += 1
            return None
        return child

    # ---- restore ------------------------------------------------------------------------------------------
    def host_path(self, m: Match) -> list[Node]:
        """The host nodes on ``m``'s root path, top down (a suffix of the path)."""
        out: list[Node] = []
        n: Node | None = m.node
        while n is not None and n.on_host:
            out.append(n)
            n = n.parent
        return out[::-1]

    def restore_pages(self, m: Match) -> int:
        """Device pages a restore of ``m`` allocates."""
        return sum(len(n.hpages) for n in self.host_path(m))

    def restore(self, m: Match) -> Restore | None:
        """Bring ``m``'s host nodes back to the device (``restore_pages(m)`` pages must be free, and the caller
        pins ``m.node``); None, with nothing changed, when no device checkpoint id can be had for ``m.node``."""
        path = self.host_path(m)
        assert path and path[-1] is m.node and m.node.hckpt is not None
        assert self.pool.free >= sum(len(n.hpages) for n in path)
        m.node.reserved += 1  # the checkpoint allocations below never take the one being restored
        try:
            top = self.new_checkpoint(important=True)
            if top is None:
                return None
            ckpts = {id(n): self.new_checkpoint(important=False) for n in path[:-1] if n.hckpt is not None}
        finally:
            m.node.reserved -= 1
        ckpts[id(m.node)] = top
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        held: list[int] = []
        nbytes = 0
        for n in path:
            cid = ckpts.get(id(n))
            hc = n.hckpt if cid is not None else None
            if (
                n.hckpt is not None and cid is None
            ):  # no device room for this intermediate checkpoint: drop it
                self.host_pool.decref(n.hckpt)
            dp = self.pool.alloc(len(n.hpages))
            self.copies.append(TierCopy(ticket, dp, list(n.hpages), cid, hc or []))
            held += n.hpages + (hc or [])
            nbytes += len(dp) * self.page_bytes + (self.checkpoint_bytes if hc is not None else 0)
            n.pages, n.ckpt, n.hpages, n.hckpt = dp, cid, [], None
        self._held[ticket] = held
        self.touch(m.node)
        self.num_restores += 1
        self.restore_bytes += nbytes
        return Restore(ticket, m.node.end - path[0].start, nbytes)

    def restored(self, ticket: int) -> None:
        """The runner finished restore ``ticket``: the host ids it read are free again."""
        self.host_pool.decref(self._held.pop(ticket, []))

    def drain(self) -> list[TierCopy]:
        """The spills and restores planned since the last call, in order (for the next batch)."""
        out, self.copies = self.copies, []
        return out
