"""CPU check of the ``causal_conv`` CUDA kernel (cuda_src/gdn.cu): compiled by g++ under the std::thread emulation
of tests/host/gdn_emu.cpp and run beside the one-thread-per-channel sequential pass it replaced
(tests/host/conv_driver.cpp). The token-tiled kernel must give the sequential pass's outputs and carried states
bitwise, for sequences that start near a tile's end (their first tokens spill into the next tile), empty and
one-token sequences, several sequences in one tile and a sequence over several tiles; both are also checked
against the NumPy reference conv."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator, rel_error, words

from ninfer.cuda.gdn import CONV_TILE
from ninfer.formats import bf16_decode, bf16_round
from ninfer.reference import ops

F32 = np.float32


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(
        tmp_path_factory, "conv_emu", ["gdn_emu.cpp", "gdn.cu", "emu_io.cpp", "conv_driver.cpp"]
    )


CASES = (  # channels, sequence lengths, bf16 activations
    (40, [62, 3, 70], False),  # the second sequence starts 2 rows before a tile's end: its first tokens spill
    (
        40,
        [0, 1, 2, 130, 0, 63, 5],
        True,
    ),  # empty, one- and two-token sequences (their state mixes old and new)
    (130, [200], False),  # one sequence over four tiles, two channel blocks
    (24, [64, 64, 1, 65], True),  # sequences on tile boundaries
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"C{c[0]}T{sum(c[1])}{'bf16' if c[2] else 'f32'}")
def test_causal_conv_tiles_equal_sequential(emu: Path, tmp_path: Path, case: tuple) -> None:
    c, lens, tb = case
    assert CONV_TILE == 64, "the cases place sequence starts around 64-row tiles"
    rng = np.random.default_rng(sum(lens) + c)
    n, nseq = sum(lens), len(lens)
    x = rng.standard_normal((n, c)).astype(F32)
    x = bf16_round(x) if tb else x
    w = (rng.standard_normal((c, 4)) * 0.5).astype(F32)
    state = rng.standard_normal((nseq + 1, c, 3)).astype(F32)
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    slots = (np.arange(nseq, dtype=np.int32)[::-1] + 1).copy()  # slot 0 is never touched
    for name, arr in {"x": words(x, tb), "w": w, "state": state, "starts": starts, "slots": slots}.items():
        arr.tofile(tmp_path / f"{name}.bin")
    proc = subprocess.run(
        [str(emu), str(tmp_path), str(n), str(c), str(nseq), str(nseq + 1), str(int(tb))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    dt = np.uint16 if tb else F32
    y, y_seq = (np.fromfile(tmp_path / f, dtype=dt).reshape(n, c) for f in ("y.bin", "y_seq.bin"))
    s_out, s_seq = (
        np.fromfile(tmp_path / f, dtype=F32).reshape(state.shape) for f in ("state_out.bin", "state_seq.bin")
    )
    np.testing.assert_array_equal(y, y_seq, "tiled vs sequential outputs")
    np.testing.assert_array_equal(s_out, s_seq, "tiled vs sequential carried states")
    np.testing.assert_array_equal(s_out[0], state[0])
    got = bf16_decode(y) if tb else y
    for b in range(nseq):
        rows = slice(starts[b], starts[b + 1])
        ref, new = ops.conv1d_causal(x[rows], state[slots[b]], w)
        np.testing.assert_array_equal(s_out[slots[b]], new, f"seq {b}: carried state")
        if lens[b]:
            assert rel_error(got[rows], ops.silu(ref)) <= (1e-2 if tb else 1e-5), f"seq {b}: output"
