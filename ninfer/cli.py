"""The ``ninfer`` command line: convert, inspect, verify, demo, generate, serve, perplexity, bench-corpus."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

DEFAULT_DEMO_PATH = os.path.join("build", "demo.ninfer")


def _cmd_convert(a: argparse.Namespace) -> int:
    from ninfer.convert import convert

    m = convert(
        a.hf_dir,
        a.output,
        a.profile,
        allow_unregistered_shape=a.allow_unregistered_shape,
        model_id=a.model_id,
        progress=not a.quiet,
    )
    size = os.path.getsize(a.output)
    print(
        f"wrote {a.output}: {m['model_id']} / {m['weight_profile']}, {len(m['tensors'])} tensors, {size:,} bytes"
    )
    print(f"verified: digest {m['digest']['content']}")
    return 0


def _inspect_v1(path: str, as_json: bool) -> int:
    """An upstream v1 file: its components and the verdict ``serve`` acts on (a file that does not bind is listed
    with the reason it cannot be served)."""
    from ninfer.artifact.upstream import UpstreamArtifact
    from ninfer.artifact.v1_container import V1Container

    c = V1Container.open(path)
    try:
        art: Any = UpstreamArtifact(path)
        verdict, groups = "servable", art.groups
    except ValueError as e:
        art, verdict, groups = None, f"not servable: {e}", {}
    if as_json:
        objects = [{k: v for k, v in dataclasses.asdict(o).items() if v is not None} for o in c.objects]
        info = {
            "container": "upstream-v1",
            "model_id": c.model_id,
            "weight_profile": "groupwise-int",
            "verdict": verdict,
            "groups": {g: list(n) for g, n in groups.items()},
            "objects": objects,
        }
        print(json.dumps(info, indent=2, default=list))
        return 0
    by_fmt: dict[str, list[int]] = {}
    for o in c.objects:
        by_fmt.setdefault(o.format or o.kind, []).append(o.bytes)
    print(path)
    print(f"  container    upstream v1 ({len(c.objects)} objects, payload at {c.payload_offset})")
    print(f"  model        {c.model_id}" + (f" ({art.architecture})" if art is not None else ""))
    print("  profile      groupwise-int")
    print(f"  verdict      {verdict}")
    if art is not None:
        cfg = art.model_config
        print(
            f"  shape        hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers} "
            f"({len(cfg.linear_attention_layers)} GDN + {len(cfg.full_attention_layers)} attention), vocab {cfg.vocab_size}"
            + (f", experts {cfg.num_experts} top-{cfg.num_experts_per_tok}" if cfg.is_moe else "")
        )
        used = {
            "text": "served",
            "mtp": "served (MTP drafts)",
            "draft_head": "kept",
            "vision": "kept",
            "dflash": "kept",
        }
        for g, names in groups.items():
            size = sum(c.entry(n).bytes for n in names)
            print(f"    {g:<12} {len(names):>5} objects {size:>16,} bytes  {used[g] if names else 'absent'}")
    for fmt, sizes in sorted(by_fmt.items()):
        print(f"    {fmt:<16} {len(sizes):>5} objects {sum(sizes):>16,} bytes")
    print("  resources    " + ", ".join(f"{n} ({c.entry(n).bytes:,} B)" for n in c.resource_names()))
    return 0


def _cmd_inspect(a: argparse.Namespace) -> int:
    from ninfer.artifact import open_artifact
    from ninfer.artifact.v1_container import is_v1_file

    if is_v1_file(a.artifact):
        return _inspect_v1(a.artifact, a.json)
    art = open_artifact(a.artifact, verify="manifest")
    m = art.manifest
    if a.json:
        print(json.dumps(m, indent=2, sort_keys=True))
        return 0
    by_fmt: dict[str, list[int]] = {}
    for t in m["tensors"]:
        by_fmt.setdefault(t["format"], []).append(t["nbytes"])
    print(f"{a.artifact}")
    print(
        f"  model        {m['model_id']} ({m['architecture']}){'' if m['shape_registered'] else ' [unregistered shape]'}"
    )
    print(f"  profile      {m['weight_profile']}")
    print(f"  digest       {m['digest']['content']}")
    cfg = art.model_config
    print(
        f"  shape        hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers} "
        f"({len(cfg.linear_attention_layers)} GDN + {len(cfg.full_attention_layers)} attention), vocab {cfg.vocab_size}"
        + (f", experts {cfg.num_experts} top-{cfg.num_experts_per_tok}" if cfg.is_moe else "")
    )
    print(f"  tensors      {len(m['tensors'])}")
    for fmt, sizes in sorted(by_fmt.items()):
        print(f"    {fmt:<16} {len(sizes):>5} tensors {sum(sizes):>16,} bytes")
    print("  resources    " + ", ".join(f"{r['role']} ({r['nbytes']:,} B)" for r in m["resources"]))
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    """The checks ``serve`` acts on, plus every payload: hashes (ours) or a full decode (upstream v1)."""
    from ninfer.artifact import open_artifact

    t0 = time.perf_counter()
    art = open_artifact(a.artifact, verify="full")
    if art.manifest is None:  # upstream v1
        n, what = len(art.v1.objects), "upstream v1 objects bound and decoded"
    else:
        n, what = len(art.manifest["tensors"]), "tensors checked"
    print(f"OK {a.artifact}: {art.model_id}, {n} {what} in {time.perf_counter() - t0:.2f}s")
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from ninfer.demo import build_demo

    path = build_demo(a.output, seed=a.seed)
    print(f"wrote demo artifact {path} (ninfer-demo: random weights, its text is random)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ninfer", description="Single-GPU inference for the Qwen3.6 hybrid family."
    )
    p.add_argument("--version", action="version", version=f"ninfer {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="convert a transformers checkpoint directory to a .ninfer artifact")
    c.add_argument(
        "hf_dir", help="the transformers checkpoint directory (config.json, *.safetensors, tokenizer)"
    )
    c.add_argument("-o", "--output", required=True, help="the .ninfer file to write")
    c.add_argument("--profile", default="bf16", help="bf16 | nvfp4 | groupwise-int | fp8")
    c.add_argument(
        "--model-id", default=None, help="registered identity to bind (default: matched by config)"
    )
    c.add_argument(
        "--allow-unregistered-shape",
        action="store_true",
        help="convert a checkpoint whose shape is not a registered one (tiny test models); marked so",
    )
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=_cmd_convert)

    i = sub.add_parser("inspect", help="show an artifact's identity, profile, shape and tensors")
    i.add_argument("artifact", help="a .ninfer artifact or an upstream v1 file")
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    i.set_defaults(func=_cmd_inspect)

    v = sub.add_parser("verify", help="check an artifact fully: structure, registry, inventory, hashes")
    v.add_argument("artifact", help="a .ninfer artifact or an upstream v1 file")
    v.set_defaults(func=_cmd_verify)

    d = sub.add_parser("demo", help="build the tiny demo artifact (random weights)")
    d.add_argument(
        "-o", "--output", default=DEFAULT_DEMO_PATH, help=f"the file to write (default {DEFAULT_DEMO_PATH})"
    )
    d.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    d.set_defaults(func=_cmd_demo)

    from ninfer.generate_cli import register as register_generate

    register_generate(sub)

    from ninfer.evaluate.cli import register as register_evaluation

    register_evaluation(sub)

    try:
        from ninfer.api.cli import register
    except ImportError as e:  # a broken install: say why instead of dropping the subcommand
        _register_unavailable_serve(sub, e)
    else:
        register(sub)
    from ninfer.supervisor.cli import register as register_supervisor

    register_supervisor(sub)
    return p


def _version() -> str:
    """The installed distribution's version (the package's own when it runs from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ninfer")
    except PackageNotFoundError:
        from ninfer import __version__

        return __version__


def _register_unavailable_serve(sub: Any, error: ImportError) -> None:
    """``ninfer serve`` when ``ninfer.api`` cannot be imported: listed, and running it prints the import error."""
    reason = f"{type(error).__name__}: {error}"
    s = sub.add_parser("serve", help=f"serve an artifact over HTTP (unavailable here: {reason})")
    s.add_argument("args", nargs=argparse.REMAINDER)

    def unavailable(_: argparse.Namespace) -> int:
        print(f"ninfer serve: error: the HTTP server cannot be imported: {reason}", file=sys.stderr)
        return 2

    s.set_defaults(func=unavailable)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: the shell's status for SIGINT, no traceback
        print(f"ninfer {args.command}: interrupted", file=sys.stderr)
        return 130
    except (
        ValueError,
        OSError,
        KeyError,
        RuntimeError,
    ) as e:  # ArtifactError, ConversionError, ... are ValueErrors
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"ninfer {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
