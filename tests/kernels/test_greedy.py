"""The Triton greedy decode step (crossml.kernels.greedy) against its torch reference, which is the
generator's general path step for step: tokens, finished flags, sequence and mask columns, the next
step's inputs and the host buffer must be equal. CPU cases run in Triton's interpreter; ``gpu`` cases
compile."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.greedy import CHUNK, MAX_EOS, greedy_step, greedy_step_reference  # noqa: E402
from tests.kernels._common import DEVICES  # noqa: E402

PAD = 99


def _state(device: str, rows: int, length: int, col: int, mask_dtype: torch.dtype, ids_dtype: torch.dtype,
           done_rows: tuple[int, ...], streams: int = 0) -> dict[str, torch.Tensor]:
    seq = torch.arange(rows * length, dtype=torch.long).reshape(rows, length) % 50
    mask = torch.zeros(rows, length, dtype=mask_dtype)
    mask[:, :col] = 1
    mask[0, :2] = 0  # row 0 starts with padding: its position is its count of ones, not its column
    done = torch.zeros(rows, dtype=torch.bool)
    done[list(done_rows)] = True
    return {k: v.to(device) for k, v in {
        "seq": seq, "mask": mask, "done": done, "out": torch.full((2 * rows,), -7, dtype=torch.long),
        "ids": torch.zeros(rows, 1, dtype=ids_dtype),
        "pos": torch.zeros((streams, rows, 1) if streams else (rows, 1), dtype=torch.long)}.items()}


CASES = {  # name: rows, vocab, length, col, ban_eos, stage, mask dtype, ids dtype, finished rows[, position streams]
    "one-row": (1, 1000, 12, 5, False, True, torch.int64, torch.int64, ()),
    "position-streams": (3, 700, 12, 6, False, True, torch.int64, torch.int64, (), 3),
    "chunks-ban": (3, 2 * CHUNK + 77, 9, 7, True, True, torch.int32, torch.int32, (2,)),
    "no-stage": (2, CHUNK, 9, 8, False, False, torch.int64, torch.int64, ()),
    "long-mask": (2, 300, 2500, 2100, False, True, torch.int64, torch.int64, (0,)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_step_matches_reference(device: str, case: str) -> None:
    rows, vocab, length, col, ban, stage, mask_dtype, ids_dtype, done_rows, *streams = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    logits = torch.randn(rows, vocab, generator=g)
    logits[0, 17] = 40.0
    logits[0, vocab - 3] = 40.0  # a tie across chunks: the first index wins
    eos = torch.tensor([3, 11], dtype=torch.long)
    logits[-1, 3] = 1e9  # an end-of-sequence id is the largest: chosen unless banned
    if rows > 2:
        logits[1, vocab // 2] = float("nan")  # counts as the largest
    logits = logits.to(device)
    got, want = (_state(device, rows, length, col, mask_dtype, ids_dtype, done_rows, *streams) for _ in range(2))
    for st in (got, want):  # the float32 copy of the logits and the host buffer (page-locked where there is a GPU)
        st["copy"] = torch.full((rows, vocab), -3.0, device=device)
        st["host"] = torch.full((2 * rows,), -7, dtype=torch.long, pin_memory=device != "cpu")
    for fn, st in ((greedy_step, got), (greedy_step_reference, want)):
        fn(logits, seq=st["seq"], mask=st["mask"], done=st["done"], eos=eos.to(device), pad=PAD, col=col,
           ban_eos=ban, out=st["out"], ids=st["ids"] if stage else None, pos=st["pos"] if stage else None,
           copy=st["copy"], host=st["host"])
    if device != "cpu":
        torch.cuda.synchronize()  # the host buffer is written by the kernel, with no copy to wait for
    for key in got:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, equal_nan=True, msg=f"{case}: {key}")
    torch.testing.assert_close(got["copy"], logits.float(), rtol=0, atol=0, equal_nan=True)
    assert got["host"].tolist() == got["out"].tolist()
    tokens = got["out"][:rows].tolist()
    if rows > 1:
        assert tokens[0] == (PAD if 0 in done_rows else 17)
    if rows > 2:
        assert tokens[1] == (PAD if 1 in done_rows else vocab // 2)
    assert (tokens[-1] == 3) == (not ban and rows - 1 not in done_rows)
    if stage:
        assert got["pos"].reshape(-1, rows)[:, 0].tolist() == [col - 2] * (streams[0] if streams else 1)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_step_float16_logits_and_all_banned(device: str) -> None:
    """fp16 logits are read as they are; a row whose only finite values are banned picks index 0, as argmax of
    all -inf does."""
    logits = torch.full((1, 40), float("-inf"), dtype=torch.float16)
    logits[0, 5] = 1.0
    st = [_state(device, 1, 4, 1, torch.int64, torch.int64, ()) for _ in range(2)]
    eos = torch.tensor([5], dtype=torch.long, device=device)
    copies = [torch.zeros(1, 40, device=device) for _ in st]
    for fn, s, c in zip((greedy_step, greedy_step_reference), st, copies):
        fn(logits.to(device), seq=s["seq"], mask=s["mask"], done=s["done"], eos=eos, pad=PAD, col=1, ban_eos=True,
           out=s["out"], ids=s["ids"], pos=s["pos"], copy=c)
    assert st[0]["out"].tolist() == st[1]["out"].tolist() == [0, 0]
    assert torch.equal(copies[0], copies[1]) and torch.equal(copies[0].cpu(), logits.float())  # the ban not in it


def test_greedy_step_rejects_bad_buffers() -> None:
    logits = torch.zeros(2, 10)
    st = _state("cpu", 2, 4, 1, torch.int64, torch.int64, ())
    common = {"seq": st["seq"], "mask": st["mask"], "done": st["done"], "pad": 0, "ban_eos": False, "out": st["out"]}
    with pytest.raises(ValueError, match="column 4"):
        greedy_step(logits, eos=torch.tensor([1]), col=4, **common)
    with pytest.raises(ValueError, match=f"1 to {MAX_EOS}"):
        greedy_step(logits, eos=torch.arange(MAX_EOS + 1), col=1, **common)
    with pytest.raises(ValueError, match="contiguous rows"):
        greedy_step(logits.t(), eos=torch.tensor([1]), col=1, **common)
    with pytest.raises(ValueError, match="copy must be a contiguous float32"):
        greedy_step(logits, eos=torch.tensor([1]), col=1, copy=torch.zeros(2, 10, dtype=torch.float16), **common)
    with pytest.raises(ValueError, match="host must be 4 contiguous int64"):
        greedy_step(logits, eos=torch.tensor([1]), col=1, host=torch.zeros(3, dtype=torch.long), **common)
