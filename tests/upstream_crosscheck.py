"""Manual check of the v1 test writer against upstream's own code (not collected by pytest: it needs a checkout
of upstream's sources and torch). Run from the repository root:

    python tests/upstream_crosscheck.py --upstream /path/to/Neroued-ninfer-checkout

1. Inventories: ``v1_inventory`` at the real 27B and 35B-A3B shapes gives exactly upstream's ordered object list
   (``tools/convert/qwen3_6_*/inventory.py`` ``TENSOR_SPECS``: name, shape, format, layout) and, with the same
   resource sizes, upstream's planned offsets (``tools/artifact/container.py`` ``plan_objects``).
2. Bytes: tiny dense and MoE files written by ``tests/v1_writer.py`` equal, byte for byte, the files upstream's
   ``ArtifactWriter`` writes from the same objects encoded by upstream's quantizer and layout code
   (``quantize_and_encode``, ``encode_direct``) from BF16 sources (upstream's converter reads BF16 checkpoints,
   so the values are rounded to bfloat16 first). Upstream's converter itself runs only at its pinned shapes; its
   recipe steps (slice, concat, de-interleave, transpose, cast) are what ``tests/v1_writer.upstream_values`` does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _inventories(up: Path) -> None:
    from tools.artifact import container as uc  # type: ignore[import-not-found]
    from tools.convert.qwen3_6_27b import inventory as inv27  # type: ignore[import-not-found]
    from tools.convert.qwen3_6_35b_a3b import inventory as inv35  # type: ignore[import-not-found]

    from ninfer.artifact.pinned import QWEN36_27B, QWEN36_35B_A3B
    from ninfer.artifact.v1_writer import RESOURCE_NAMES, DFlashShape, VisionShape, v1_inventory

    vision = VisionShape(hidden=1152, mlp=4304, depth=27, positions=2304, patch=1536)
    real = {
        "27b": (inv27, v1_inventory(QWEN36_27B, draft_rows=131072, vision=vision)),
        "35b": (
            inv35,
            v1_inventory(
                QWEN36_35B_A3B,
                draft_rows=131072,
                vision=vision,
                dflash=DFlashShape(layers=6, features=8, heads=32, kv_heads=8, head_dim=128, mlp=6144),
                q6_routed_down=(34, 38, 39),
            ),
        ),
    }
    sizes = {n: 1000 + 7 * i for i, n in enumerate(RESOURCE_NAMES)}
    for key, (mod, ours) in real.items():
        theirs = [(s.name, tuple(s.shape), s.format, s.layout) for s in mod.TENSOR_SPECS]
        mine = [
            (
                t.name,
                t.shape,
                t.format,
                "contiguous-le-v1" if t.format in ("BF16", "FP32", "I32") else "row-split-k128-v1",
            )
            for t in ours
        ]
        assert mine == theirs, (
            f"{key}: inventories differ at {next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)}"
        )
        specs = [uc.ResourceSpec(n, "raw-bytes-v1", sizes[n]) for n in RESOURCE_NAMES]
        specs += [uc.TensorSpec(s.name, tuple(s.shape), s.format, s.layout) for s in mod.TENSOR_SPECS]
        planned = [(o.name, o.offset, o.bytes) for o in uc.plan_objects(specs)]
        from ninfer.formats import FORMATS, align_up

        cur, mine_off = 0, []
        for n in RESOURCE_NAMES:
            mine_off.append((n, cur, sizes[n]))
            cur += sizes[n]
        for t in ours:
            cur = align_up(cur, 256)
            mine_off.append((t.name, cur, FORMATS[t.format].encoded_size(t.shape)))
            cur += mine_off[-1][2]
        assert mine_off == planned, f"{key}: planned offsets differ"
        print(f"{key}: {len(theirs)} tensors, names/shapes/formats/order and offsets equal upstream's")


def _bytes(tmp: Path) -> None:
    import torch
    import v1_writer as w
    from tools.artifact import container as uc  # type: ignore[import-not-found]
    from tools.artifact.layouts import encode_direct  # type: ignore[import-not-found]
    from tools.convert.common.quantize import quantize_and_encode  # type: ignore[import-not-found]

    from ninfer.formats import bf16_round

    for moe in (False, True):
        cfg = w.tiny_config(moe)
        canon = {n: bf16_round(x) for n, x in w.random_canonical(cfg, 7).items()}
        values = w.upstream_values(cfg, canon)
        values = {n: (v if v.dtype == np.int32 else bf16_round(v)) for n, v in values.items()}
        ours = tmp / f"ours_{moe}.ninfer"
        w.write_tiny(ours, cfg, canon, values=values, resources=w.FRONTEND)
        inv = w.inventory(cfg)
        entries = [(uc.ResourceSpec(n, "raw-bytes-v1", len(b)), b) for n, b in w.FRONTEND.items()]
        for t in inv:
            x = values[t.name]
            if t.format == "I32":
                payload = encode_direct(torch.from_numpy(x.astype(np.int32)), "I32")
            elif t.format in ("BF16", "FP32"):
                src = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
                payload = encode_direct(src if t.format == "BF16" else src.to(torch.float32), t.format)
            else:
                src = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
                payload = quantize_and_encode(src, t.format, device="cpu")
            layout = "contiguous-le-v1" if t.format in ("BF16", "FP32", "I32") else "row-split-k128-v1"
            entries.append((uc.TensorSpec(t.name, t.shape, t.format, layout), payload))
        theirs = tmp / f"theirs_{moe}.ninfer"
        uc.write_artifact(theirs, w.MODEL[moe], entries)
        a, b = ours.read_bytes(), theirs.read_bytes()
        assert a == b, f"moe={moe}: files differ (sizes {len(a)} / {len(b)}) first at byte " + str(
            next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        )
        print(f"moe={moe}: {len(inv)} tensors, {len(a):,} bytes identical to upstream's writer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--upstream", required=True, type=Path, help="a checkout of Neroued/ninfer (its tools/ tree)"
    )
    a = ap.parse_args()
    sys.path.insert(0, str(a.upstream))
    _inventories(a.upstream)
    with tempfile.TemporaryDirectory() as d:
        _bytes(Path(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
