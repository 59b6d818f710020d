"""Arguments shared by the ``ninfer`` subcommands that run a model (generate, perplexity, bench-corpus)."""

from __future__ import annotations

import argparse

__all__ = ["add_backend_argument"]


def add_backend_argument(p: argparse.ArgumentParser) -> None:
    """``--backend reference|cuda`` (default reference)."""
    p.add_argument(
        "--backend",
        default="reference",
        choices=["reference", "cuda"],
        help="reference (NumPy, default) or cuda (an NVIDIA GPU)",
    )
