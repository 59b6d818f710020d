"""Elementwise fp32 activations shared by the ops (re-exported by ``ops``)."""

from __future__ import annotations

import numpy as np

__all__ = ["sigmoid", "silu", "softplus"]

F32 = np.float32


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1/(1+e^-x) without overflow: e^-|x| never exceeds 1."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(F32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * sigmoid(x)).astype(F32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1+e^x), linear above 20 (torch's threshold)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(F32, copy=False)
