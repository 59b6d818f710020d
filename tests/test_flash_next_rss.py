"""The n-gram table is read through its memory map, row by row, and never loaded whole.

A tiny Flash-Next artifact with a 512 MB n-gram table (the n-gram vocabulary of a much larger model) is written
to the test's tmp dir, then a fresh Python process loads it and runs 256 tokens (4,096 table rows) while its
peak resident set (``ru_maxrss``) is measured.

ru_maxrss counts the file pages a process has mapped, and on a cached file the kernel maps the cached neighbours of
every faulting page too ("fault-around", up to whole large folios), so after a sequential read of the file (the
writer, or ``verify="full"``) every random row read maps a window of the table: those pages are shared, clean
page cache, not a copy, but they count. The peak-RSS check therefore starts from a cold cache for the file (as
after a reboot: fsync, then ``POSIX_FADV_DONTNEED``), where the reader's ``MADV_RANDOM`` keeps each row read to
one page. A second run on a warm cache with full verification checks the private memory (``RssAnon``) instead:
whatever the cache holds, the process never makes its own copy of the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hf_tiny_flash import random_weights, tiny_hf_config

from ninfer.artifact import write_artifact
from ninfer.flash_next import FlashNextConfig
from ninfer.flash_next.names import ngram_table_name
from perf.v1_synthetic import drop_page_cache

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "posix_fadvise")), reason="Linux page-cache control"
)

NGRAM_BASE = 4_000_000  # 16 heads x 4M rows x 4 values x 2 B (bf16) = 512 MB

RUN = """
import json, resource, sys
import numpy as np
import ninfer

def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))

def mapped_kib(path):  # resident KiB of this process's mappings of the file (/proc/self/smaps)
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = line.rstrip().endswith(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total

rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
out = {"import": rss()}
m = ninfer.load(sys.argv[1], verify=sys.argv[2])
out["load"] = rss()
ids = np.random.default_rng(0).integers(3, 256, 256)
logits = m.logits(ids, prefill_chunk=64)
assert np.isfinite(logits).all()
out["run"] = rss()
out["anon"] = status("RssAnon")
out["mapped"] = mapped_kib(sys.argv[1])
out["hwm"] = status("VmHWM")  # the same peak from /proc, for the cross-check
out["cached"] = sorted(m.net.src._cache)
print(json.dumps(out))
"""


class LazyTable:
    """A row-sliceable float32 table source: rows repeat a random 64k-row block in a scrambled order."""

    def __init__(self, shape: tuple[int, int], seed: int) -> None:
        self.shape = shape
        self._block = np.random.default_rng(seed).normal(0, 0.5, (1 << 16, shape[1])).astype(np.float32)

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.shape[0])
        return self._block[(np.arange(a, b) * 40503) & 0xFFFF]


def _run(path: Path, verify: str) -> dict:
    """Run ``RUN`` in a fresh interpreter. Linux carries ru_maxrss across execve, and a child forked from this
    (large) test process starts from a copy of its memory, so the interpreter is forked by a small shell
    instead (``sh -c 'cmd; exit'`` forks rather than execs)."""
    cmd = ["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", RUN, str(path), verify]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_ngram_region_is_read_through_the_map(tmp_path: Path) -> None:
    small = FlashNextConfig.from_hf(tiny_hf_config())
    cfg = replace(small, ngram_vocab_size_base=NGRAM_BASE)  # only the table's shape changes
    table = ngram_table_name(cfg.ple_layers[0])
    weights: dict = random_weights(small, seed=1, mtp=False)
    weights[table] = LazyTable((cfg.ngram_table_rows(0), cfg.ngram_row_dim), seed=2)
    path = tmp_path / "big-table.ninfer"
    try:
        manifest = write_artifact(
            path, model_id="qwen3.8-flash-next", weight_profile="bf16", config=cfg, shape_registered=False,
            load_tensor=weights.__getitem__, resources={},
        )  # fmt: skip
        table_kib = next(t["nbytes"] for t in manifest["tensors"] if t["name"] == table) // 1024
        assert (
            table_kib > 500_000 and os.path.getsize(path) // 1024 < table_kib + 1024
        )  # the table is the file

        drop_page_cache(path)
        cold = _run(path, "manifest")
        cached = cold.pop("cached")
        print(f"\ncold cache: RSS {cold} KiB vs table {table_kib} KiB")
        assert table not in cached and "embed_tokens.weight" in cached  # the table alone stays uncached
        assert abs(cold["run"] - cold["hwm"]) < 4096, cold  # ru_maxrss is this interpreter's own peak
        assert cold["mapped"] < table_kib / 16, cold  # artifact pages resident: ~1 page per row read
        assert cold["run"] < table_kib / 5, cold  # peak of the whole process, interpreter and numpy included

        warm = _run(path, "full")  # hashes every blob (os.pread, not the map); the file is now cached
        warm.pop("cached")
        print(f"warm cache, full verify: RSS {warm} KiB")
        assert warm["anon"] < table_kib / 8, warm  # no private copy of the table
    finally:
        path.unlink(missing_ok=True)
