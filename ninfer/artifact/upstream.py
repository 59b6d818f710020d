"""Upstream v1 files (``NINFER`` magic) served as they are, behind the same interface as our ``Artifact``.

A v1 file carries no config and no profile: its identity's pinned config gives the dimensions that shapes cannot
(head counts, RoPE, eps), every object's shape is checked against it (``v1_binding.bind``), and the weight profile
is upstream's group-int assignment, ``groupwise-int``. A test file of another size passes its ``config`` and is
then marked unregistered.

Canonical tensors are made of v1 rows on demand (``raw``): a whole parent is a view of the memory map; rows of a
fused parent are gathered plane by plane (the formats are row-local), and where one canonical tensor takes rows
from parents of different group-int formats (the 27B's ``q_proj`` from Q4 ``query_key`` and Q5 ``gate_value``,
``in_proj_qkv`` from Q4 and Q5) every part is widened to the widest format, which keeps every value exactly
(``formats.groupint.widen``). The vision tower, draft head and DFlash drafter are bound and checked
(``groups``), not uploaded.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np

from ninfer.artifact.container import ArtifactError
from ninfer.artifact.inventory import TensorPlan
from ninfer.artifact.registry import identity, shape_diff
from ninfer.artifact.rows import gather_rows, row_planes, take_rows
from ninfer.artifact.v1_binding import V1_MODEL_IDS, Recipe, bind
from ninfer.artifact.v1_container import V1Container, V1FormatError, is_v1_file
from ninfer.artifact.weights import ArtifactWeights
from ninfer.artifact.writer import RESOURCE_FILES
from ninfer.config import ModelConfig
from ninfer.formats import FORMATS
from ninfer.formats.groupint import widen, widest

__all__ = ["UpstreamArtifact", "is_upstream_v1", "open_upstream"]

is_upstream_v1 = is_v1_file
WEIGHT_PROFILE = "groupwise-int"


class UpstreamArtifact:
    """An opened, bound v1 file. ``manifest`` is None (a v1 file has none); ``groups`` lists its objects by
    component (text, mtp, draft_head, vision, dflash)."""

    container = "upstream-v1"
    manifest = None
    weight_profile = WEIGHT_PROFILE

    def __init__(self, path: str | os.PathLike[str], config: ModelConfig | None = None) -> None:
        self.path = os.fspath(path)
        self.v1 = V1Container.open(self.path)
        self.model_id = self.v1.model_id
        if self.model_id not in V1_MODEL_IDS:
            raise ArtifactError(
                f"{self.path}: upstream model id {self.model_id!r} is not registered for v1 files "
                f"({', '.join(V1_MODEL_IDS)}); `ninfer inspect` can still list it"
            )
        ident = identity(self.model_id)
        cfg = config if config is not None else ident.config
        if cfg.arch != ident.arch:
            raise ArtifactError(
                f"{self.path}: config architecture {cfg.arch!r} is not {self.model_id}'s {ident.arch!r}"
            )
        if not any(n.startswith("mtp/") for n in self.v1.tensor_names()):
            cfg = replace(cfg, mtp_num_hidden_layers=0)
        try:
            self.binding = bind(self.v1.objects, cfg)
        except V1FormatError as e:
            against = f"the pinned {self.model_id} shape" if config is None else "the given config"
            raise V1FormatError(f"{self.path}: {e} (checked against {against})") from None
        self.model_config = cfg
        self.architecture = ident.arch
        self.shape_registered = config is None or not shape_diff(ident.config, config)
        self.groups = self.binding.groups
        from ninfer.reference.weights import expected_shapes

        self._shapes = expected_shapes(cfg, mtp=True)
        self._info = {name: self._plan_info(name, r) for name, r in self.binding.recipes.items()}
        self.plan = {n: TensorPlan(i["shape"], i["format"], i["shape"]) for n, i in self._info.items()}

    # ---- canonical tensors -------------------------------------------------------------------------------------
    def _plan_info(self, name: str, r: Recipe) -> dict[str, Any]:
        shape = tuple(self._shapes[name])
        fmts = [self.v1.entry(s.parent).format for s in r.segments]
        fmt = fmts[0] if len(set(fmts)) == 1 or r.how == "conv" else widest(fmts)
        if (
            fmt is None
        ):  # a binding invariant: fused parents of one tensor are all group-int or all one format
            raise ArtifactError(f"{self.path}: {name!r} mixes formats {fmts} that cannot be joined exactly")
        if r.how == "conv":
            fmt = "BF16" if fmt == "BF16" else "FP32"
        return dict(
            name=name,
            format=fmt,
            layout=FORMATS[fmt].layout,
            shape=list(shape),
            nbytes=FORMATS[fmt].encoded_size(shape),
        )

    def tensor_names(self) -> list[str]:
        return list(self._info)

    def tensor_info(self, name: str) -> dict[str, Any]:
        try:
            return self._info[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def _rows(self, parent: str, rows: np.ndarray, fmt: str) -> np.ndarray:
        """Standalone ``fmt`` encoding of rows ``rows`` of ``parent``."""
        o = self.v1.entry(parent)
        codec = FORMATS[o.format]
        raw = self.v1.raw(parent)
        if rows.size == codec.rows_cols(o.shape)[0] and (rows == np.arange(rows.size)).all():
            sub, shape = raw, o.shape
        elif rows.size and rows[-1] - rows[0] + 1 == rows.size:  # one range: plane slices, not a gather
            shape = (int(rows.size), o.shape[-1])
            sub = np.zeros(codec.encoded_size(shape), np.uint8)
            for dst, src in zip(row_planes(codec, sub, shape), row_planes(codec, raw, o.shape), strict=True):
                dst[:] = src[rows[0] : rows[-1] + 1]
        else:
            shape = (int(rows.size), o.shape[-1])
            sub = take_rows(codec, raw, o.shape, rows)
        return sub if o.format == fmt else widen(sub, shape, o.format, fmt)

    def raw(self, name: str) -> np.ndarray:
        """The canonical tensor's encoded bytes in ``tensor_info(name)['format']`` (a view where it is one whole
        parent)."""
        info, r = self.tensor_info(name), self.binding.recipes[name]
        fmt, shape = info["format"], tuple(info["shape"])
        if r.how == "conv":
            return FORMATS[fmt].encode(self.tensor(name), shape)
        if r.how == "heads":  # per head: query rows, then gate rows
            d = self.model_config.head_dim
            pieces = [
                (s.parent, np.arange(s.r0 + h * d, s.r0 + (h + 1) * d))
                for h in range(self.model_config.num_attention_heads)
                for s in r.segments
            ]
        else:
            pieces = [(s.parent, np.arange(s.r0, s.r1)) for s in r.segments]
        if len(pieces) == 1:
            return self._rows(pieces[0][0], pieces[0][1], fmt)
        codec = FORMATS[fmt]
        out = np.zeros(info["nbytes"], np.uint8)
        dst = row_planes(codec, out, shape)
        r0 = 0
        for parent, rows in pieces:
            enc = self._rows(parent, rows, fmt)
            for d_plane, s_plane in zip(dst, row_planes(codec, enc, (rows.size, shape[-1])), strict=True):
                d_plane[r0 : r0 + rows.size] = s_plane
            r0 += rows.size
        return out

    def tensor(self, name: str) -> np.ndarray:
        """The canonical tensor as float32 in its HF shape."""
        info, r = self.tensor_info(name), self.binding.recipes[name]
        shape = tuple(info["shape"])
        if r.how == "conv":  # stored [T, C] -> [C, 1, T]
            return np.ascontiguousarray(self.v1.decode(r.segments[0].parent).T).reshape(shape)
        return FORMATS[info["format"]].decode(self.raw(name), shape)

    def rows(self, name: str, row_ids: np.ndarray) -> np.ndarray:
        """Rows of a 2-D canonical tensor (embedding gathers), reading only those rows."""
        info = self.tensor_info(name)
        ids = np.asarray(row_ids, np.int64).reshape(-1)
        uniq, inverse = np.unique(ids, return_inverse=True)
        got = gather_rows(FORMATS[info["format"]], self.raw(name), tuple(info["shape"]), uniq)
        return got[inverse.reshape(-1)]

    def weights(self) -> ArtifactWeights:
        return ArtifactWeights(self)

    # ---- resources and checks ----------------------------------------------------------------------------------
    def resource(self, role: str) -> bytes | None:
        entry = RESOURCE_FILES.get(role)  # (file name, media type)
        if entry is None or entry[0] not in self.v1.resource_names():
            return None
        return self.v1.resource(entry[0])

    def verify_blobs(self) -> None:
        """Every payload checked for what can be wrong in it (a v1 file has no checksums): group scales +0 or finite
        positive, no W8 code 0x80, direct floats finite, draft ids unique ids of the vocabulary. Q4/Q5/Q6 codes
        have no illegal bit patterns, so only the scale planes of those are read."""
        for o in self.v1.objects:
            if o.kind != "tensor" or o.format == "I32":
                continue
            raw = self.v1.raw(o.name)
            if o.format.endswith("_F16S"):
                planes = FORMATS[o.format].views(raw, o.shape)  # type: ignore[attr-defined]
                s = planes["scale"]
                if not np.isfinite(s).all() or np.signbit(s).any():
                    raise ArtifactError(
                        f"{self.path}: tensor {o.name!r} has a negative or non-finite group scale"
                    )
                if o.format == "W8G32_F16S" and (planes["base"] == 0x80).any():
                    raise ArtifactError(f"{self.path}: tensor {o.name!r}: W8G32_F16S: illegal code 0x80")
            elif not np.isfinite(self.v1.decode(o.name)).all():
                raise ArtifactError(f"{self.path}: tensor {o.name!r} holds non-finite values")
        if "text/draft_head_token_ids" in self.groups.get("draft_head", ()):
            ids = self.v1.decode("text/draft_head_token_ids")
            if np.unique(ids).size != ids.size or ids.min() < 0 or ids.max() >= self.model_config.vocab_size:
                raise ArtifactError(f"{self.path}: draft head token ids are not unique ids of the vocabulary")


def open_upstream(
    path: str | os.PathLike[str], verify: str = "manifest", config: ModelConfig | None = None
) -> UpstreamArtifact:
    """Open and bind a v1 file; ``verify="full"`` also decodes every object (``verify_blobs``)."""
    art = UpstreamArtifact(path, config)
    if verify == "full":
        art.verify_blobs()
    return art
