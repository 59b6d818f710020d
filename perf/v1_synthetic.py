"""Load time and decode speed of an upstream v1 file at the real 27B shape, beside the same model in our container.

    python -m perf.v1_synthetic --dir /tmp/v1syn --out perf/results/v1_synthetic.json

Writes two synthetic files (random codes, moderate constant group scales, like ``perf/synthetic.py``): the v1 file
by ``ninfer.artifact.v1_writer`` (upstream's exact inventory and layout: 1118 tensors with the vision tower, draft
head and MTP layer; about 17.5 GB) and our own ``groupwise-int`` artifact of the same shape (about 16.5 GB). Both
are streamed one tensor at a time (host memory stays near the largest tensor, ~1 GB). Then, for each file: the page
cache is dropped for it (fsync + ``POSIX_FADV_DONTNEED``), ``load_cuda`` is timed (open and bind, upload through
pinned staging, the load-time repack: v1 rows gathered and Q4 parts widened to Q5), and decode is timed at 1 and 8
lanes with CUDA graphs. ``--skip-write`` reuses files from an earlier run; ``--keep`` leaves them on disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.pinned import QWEN36_27B
from ninfer.artifact.v1_writer import RESOURCE_NAMES, VisionShape, v1_inventory, write_v1
from ninfer.config import ModelConfig
from ninfer.formats import FORMATS

_QMAX = {"Q4G64_F16S": 8, "Q5G64_F16S": 16, "Q6G64_F16S": 32, "W8G32_F16S": 128}


def _bf16_words(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def synthetic_payload(rng: np.random.Generator) -> Callable[[str, str, tuple[int, ...]], np.ndarray]:
    """``(name, format, shape) -> encoded bytes``: random code planes with constant scales for matrices, values
    like the demo model's for vectors (norms near 0 or 1, GDN decay parameters in range)."""

    def make(name: str, fmt: str, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        if fmt == "I32":
            return np.arange(n, dtype="<i4").view(np.uint8)
        if len(shape) == 1 or name.endswith(("convolution", "conv1d.weight")):
            if name.endswith(("a_log", "A_log")):
                x = np.log(rng.uniform(1.0, 16.0, n))
            elif name.endswith(("convolution", "conv1d.weight")):
                x = rng.uniform(-0.5, 0.5, n)
            elif name.endswith(("gdn/norm", "linear_attn.norm.weight")):
                x = 1.0 + 0.1 * rng.standard_normal(n)
            else:
                x = 0.1 * rng.standard_normal(n)
            x = x.astype(np.float32)
            return x.view(np.uint8) if fmt == "FP32" else _bf16_words(x)
        std = 1.0 if "embed" in name else float(shape[-1]) ** -0.5
        if fmt == "BF16":
            return _bf16_words(rng.standard_normal(n, dtype=np.float32) * np.float32(std))
        codec = FORMATS[fmt]
        out = np.frombuffer(rng.bytes(codec.encoded_size(shape)), np.uint8).copy()
        v = codec.views(out, shape)  # type: ignore[attr-defined]
        if fmt == "W8G32_F16S":
            v["base"][v["base"] == 0x80] = 0x81  # 0x80 is not a code
        v["scale"][:] = np.float16(2.0 * std / _QMAX[fmt])
        v["scale"][:, -(-shape[-1] // codec.group) :] = 0  # groups wholly in the K padding (codes in a partly
        return out  # padded group stay random: only vision matrices, which nothing multiplies, have one)

    return make


REAL_VISION = VisionShape(hidden=1152, mlp=4304, depth=27, positions=2304, patch=1536)


def frontend() -> dict[str, bytes]:
    """The six v1 resources: the demo tokenizer and chat template (a real BPE tokenizer, so the file serves),
    empty JSON for the generation and preprocessor configs."""
    from ninfer.frontend.demo_tokenizer import demo_frontend_resources

    demo = demo_frontend_resources()
    files = {
        "tokenizer": "tokenizer.json",
        "tokenizer_config": "tokenizer_config.json",
        "chat_template": "chat_template.jinja",
    }
    by_file = {f"frontend/{n}": demo[role] for role, n in files.items()}
    return {n: by_file.get(n, b"{}") for n in RESOURCE_NAMES}


def write_v1_file(path: Path, seed: int, cfg: ModelConfig = QWEN36_27B, small: bool = False) -> float:
    """The synthetic v1 file of ``cfg`` (``small``: a tiny vision tower and draft head, for tests)."""
    make = synthetic_payload(np.random.default_rng(seed))
    inv = v1_inventory(
        cfg, draft_rows=32 if small else 131072, vision=VisionShape() if small else REAL_VISION
    )
    t0 = time.perf_counter()
    write_v1(
        path,
        "qwen3.6-27b",
        inv,
        lambda t: make(t.name, t.format, t.shape),
        frontend(),
    )
    return time.perf_counter() - t0


def write_ours(path: Path, seed: int, cfg: ModelConfig = QWEN36_27B) -> float:
    from ninfer.artifact.container import write_container
    from ninfer.artifact.registry import tensor_plan
    from ninfer.artifact.writer import ENCODER_ID

    make = synthetic_payload(np.random.default_rng(seed))
    plan = tensor_plan("qwen3.6-27b", cfg, "groupwise-int")
    entries = [
        (n, p.format, FORMATS[p.format].layout, p.shape, FORMATS[p.format].encoded_size(p.shape))
        for n, p in plan.items()
    ]
    base = dict(
        model_id="qwen3.6-27b",
        weight_profile="groupwise-int",
        architecture="qwen3_5",
        shape_registered=cfg == QWEN36_27B,
        config=cfg.to_dict(),
        recipe=dict(id="qwen3.6-27b/groupwise-int", encoder=ENCODER_ID),
        source=[],
        provenance=dict(tool="perf/v1_synthetic.py", synthetic=True),
    )
    t0 = time.perf_counter()
    write_container(path, base, entries, (make(n, f, s) for n, f, _, s, _ in entries), {})
    return time.perf_counter() - t0


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(
    path: Path, lanes: list[int], context: int, steps: int, log: Callable[[str], None]
) -> dict[str, Any]:
    import cupy

    from ninfer.artifact import open_artifact
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import tensor_bytes, upload_artifact

    from .bench_model import bench_decode

    drop_page_cache(path)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    art = open_artifact(path, verify="manifest")
    t1 = time.perf_counter()
    tensors = upload_artifact(art, progress=False)
    cupy.cuda.Device().synchronize()
    t2 = time.perf_counter()
    net = CudaQwen36(art.model_config, tensors)  # fuses (and, for v1, widens) on the device
    cupy.cuda.Device().synchronize()
    t3 = time.perf_counter()
    res: dict[str, Any] = {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "open_s": t1 - t0,
        "upload_s": t2 - t1,
        "fuse_s": t3 - t2,
        "load_s": t3 - t0,
        "device_weight_bytes": tensor_bytes(net.w),
        "formats": sorted(
            {r.fmt for w in net.w.values() for r in getattr(w, "runs", (w,)) if hasattr(r, "fmt")}
        ),
    }
    log(
        f"{path.name}: load {res['load_s']:.1f} s (open {res['open_s']:.2f}, upload {res['upload_s']:.1f}, fuse {res['fuse_s']:.1f})"
    )
    del tensors
    net.warmup()
    longest = context + steps + 64
    pages = -(-longest // 16)
    seqs = Sequences(net, slots=max(lanes) + 1, pages=pages * (max(lanes) + 1), page_size=16, context=longest)
    res["decode"] = []
    for n in lanes:
        r = bench_decode(seqs, n, context, steps)
        res["decode"].append(r)
        log(f"{path.name}: decode x{n} @{context}: {r['tok_s']:.1f} tok/s ({r['step_ms']:.2f} ms/step)")
    ids = np.zeros(1, np.int64)
    logits = net.lm_head(seqs.forward(seqs.new(), ids))
    res["logits_finite"] = bool(np.isfinite(logits).all())
    del net, seqs, art
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="where the two files are written (needs ~35 GB)")
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default: print only)")
    ap.add_argument("--lanes", default="1,8")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--skip-write", action="store_true", help="reuse the files of an earlier run")
    ap.add_argument("--keep", action="store_true", help="leave the files on disk")
    ap.add_argument("--only", choices=("v1", "ours"), default=None)
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    files = {"v1": a.dir / "qwen3_6_27b.v1.ninfer", "ours": a.dir / "qwen3_6_27b.groupwise-int.ninfer"}
    results: dict[str, Any] = {
        "model": "qwen3.6-27b",
        "synthetic": True,
        "context": a.context,
        "steps": a.steps,
    }
    kinds = [a.only] if a.only else ["v1", "ours"]
    for kind in kinds:
        if not a.skip_write:
            secs = (write_v1_file if kind == "v1" else write_ours)(files[kind], seed=1)
            results[f"{kind}_write_s"] = secs
            log(f"wrote {files[kind]} ({files[kind].stat().st_size / 1e9:.2f} GB) in {secs:.1f} s")
    lanes = [int(x) for x in a.lanes.split(",") if x]
    try:
        for kind in kinds:
            results[kind] = measure(files[kind], lanes, a.context, a.steps, log)
    finally:
        if not a.keep:
            for p in files.values():
                p.unlink(missing_ok=True)
    results["host_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    if "v1" in results and "ours" in results:
        results["v1_over_ours"] = {
            "load_s": results["v1"]["load_s"] / results["ours"]["load_s"],
            "decode_tok_s": [
                x["tok_s"] / y["tok_s"]
                for x, y in zip(results["v1"]["decode"], results["ours"]["decode"], strict=True)
            ],
        }
        log(f"v1 / ours: {results['v1_over_ours']}")
    text = json.dumps(results, indent=1)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
