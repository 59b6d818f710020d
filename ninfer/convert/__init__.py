"""Converters from upstream checkpoints to .ninfer artifacts."""

from ninfer.convert.hf import ConversionError, canonical_name, convert

__all__ = ["ConversionError", "canonical_name", "convert"]
