"""Triton greedy decode step: the token choice and its bookkeeping in two launches.

A greedy decode step of ``crossml.genai`` (batch rows, a static max-length sequence) is, in torch, about
fifteen small kernels after the decoder's graph: the end-of-sequence ban while the sequence is shorter
than min_length, argmax over the vocabulary, pad for finished rows, the finished flags, the token's
column in the sequence and the attention mask, and the next step's input id and position. On an H200
those cost 55-75 us a token, against 0.8-1.1 ms for the decoder. Here they are two kernels:

1. ``_argmax_chunks_kernel``: one program per (row, chunk of CHUNK logits) writes the chunk's maximum
   and its first index (end-of-sequence ids at -inf when ``ban_eos``); with ``copy`` it also stores the
   chunk's logits as float32 there (the generator keeps that copy of a recorded graph's logits, which the
   next replay overwrites, so the copy costs no launch of its own);
2. ``_finish_kernel``: one program per row takes the first index of the largest chunk maximum (so the
   first index of the row's maximum, as ``torch.argmax``), puts pad for a row already finished, sets
   its finished flag when the token is an end-of-sequence id, writes the token into the sequence and a
   1 into the mask at column ``col``, and, with ``stage``, the next step's input id and position (the
   mask's count of ones up to ``col``, minus one). It also writes ``[tokens, finished flags]`` (int64)
   into ``out``, and with ``host`` into that page-locked host buffer too: the device writes it directly
   (unified addressing), so the host needs no copy launched behind the kernel, only an event after it. (On an
   H200 a device-to-host copy after the kernel and the next decode graph after the copy left 8 and 10 us
   gaps; the host buffer and the float32 copy removed two launches and most of those gaps.)

The outputs are the torch path's bit for bit (``greedy_step_reference`` is that path; tests compare the
two). One difference: a NaN counts as +inf, so in a row holding both, the first of them wins where
torch picks the NaN. Nothing reads a device value on the host. Under TRITON_INTERPRET=1 the kernels run
in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, next_power_of_2, on_device, pdl, pdl_wait, use_interpreter

__all__ = ["greedy_step", "greedy_step_reference"]

#: logits one program of the first kernel reduces (a Llama-3 vocabulary is 126 programs)
CHUNK = 1024
#: most end-of-sequence ids
MAX_EOS = 16


@triton.jit
def _argmax_chunks_kernel(x_ptr, eos_ptr, val_ptr, idx_ptr, copy_ptr, V, s_x, E, CHUNKS,
                          BAN_EOS: tl.constexpr, COPY: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    c = tl.program_id(0)
    r = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    v = tl.load(x_ptr + r.to(tl.int64) * s_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
    if COPY:
        tl.store(copy_ptr + r.to(tl.int64) * V + offs, v, mask=ok)
    v = tl.where(v != v, float("inf"), v)
    if BAN_EOS:
        for e in range(E):
            v = tl.where(offs == tl.load(eos_ptr + e), float("-inf"), v)
    i = tl.argmax(v, axis=0, tie_break_left=True)
    m = tl.max(v, axis=0)
    tl.store(val_ptr + r * CHUNKS + c, m)
    tl.store(idx_ptr + r * CHUNKS + c, c * BLOCK + i)


@triton.jit(do_not_specialize=["col"])  # one variant for every column (a column divisible by 16 made a second one)
def _finish_kernel(val_ptr, idx_ptr, CHUNKS, done_ptr, eos_ptr, E, pad, seq_ptr, s_seq, mask_ptr, s_mask,
                   ids_ptr, pos_ptr, out_ptr, host_ptr, ROWS, col,
                   STAGE: tl.constexpr, HAS_POS: tl.constexpr, HOST: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_L: tl.constexpr, STREAMS: tl.constexpr = 1, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    r = tl.program_id(0)
    cs = tl.arange(0, BLOCK_C)
    vals = tl.load(val_ptr + r * CHUNKS + cs, mask=cs < CHUNKS, other=float("-inf"))
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    token = tl.load(idx_ptr + r * CHUNKS + best).to(tl.int64)
    was_done = tl.load(done_ptr + r) != 0
    token = tl.where(was_done, pad, token)
    hits = tl.zeros((), dtype=tl.int32)
    for e in range(E):
        hits += (token == tl.load(eos_ptr + e)).to(tl.int32)
    done = was_done | (hits > 0)
    tl.store(done_ptr + r, done.to(done_ptr.dtype.element_ty))
    seq_row = r.to(tl.int64) * s_seq
    mask_row = r.to(tl.int64) * s_mask
    tl.store(seq_ptr + seq_row + col, token)
    tl.store(mask_ptr + mask_row + col, tl.full((), 1, mask_ptr.dtype.element_ty))
    tl.store(out_ptr + r, token)
    tl.store(out_ptr + ROWS + r, done.to(tl.int64))
    if HOST:
        tl.store(host_ptr + r, token)
        tl.store(host_ptr + ROWS + r, done.to(tl.int64))
    if STAGE:
        tl.store(ids_ptr + r, token.to(ids_ptr.dtype.element_ty))
        if HAS_POS:
            # position of column col: the mask's ones in columns 0..col (col's own 1 was just written, so it is
            # counted as 1 here rather than loaded back), minus one
            count = tl.zeros((BLOCK_L,), dtype=tl.int64)
            ls = tl.arange(0, BLOCK_L)
            for start in range(0, col, BLOCK_L):
                cols = start + ls
                count += tl.load(mask_ptr + mask_row + cols, mask=cols < col, other=0).to(tl.int64)
            pos = tl.sum(count, axis=0)  # (count + 1) - 1
            for stream in tl.static_range(STREAMS):  # multimodal RoPE's equal streams: [STREAMS, ROWS, 1]
                tl.store(pos_ptr + stream * ROWS + r, pos.to(pos_ptr.dtype.element_ty))


def _check(logits: torch.Tensor, seq: torch.Tensor, mask: torch.Tensor, done: torch.Tensor, eos: torch.Tensor,
           out: torch.Tensor, col: int, copy: torch.Tensor | None, host: torch.Tensor | None) -> None:
    rows = logits.shape[0]
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"greedy step: logits must be [rows, vocab] with contiguous rows, got shape "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if seq.shape[0] != rows or mask.shape[0] != rows or seq.stride(1) != 1 or mask.stride(1) != 1:
        raise ValueError(f"greedy step: sequence {tuple(seq.shape)} and mask {tuple(mask.shape)} must have "
                         f"{rows} rows with contiguous columns")
    if not 0 <= col < min(seq.shape[1], mask.shape[1]):
        raise ValueError(f"greedy step: column {col} is outside the sequence's {seq.shape[1]} columns")
    if seq.dtype != torch.int64 or out.dtype != torch.int64 or out.numel() != 2 * rows or done.numel() != rows:
        raise ValueError("greedy step: the sequence and out must be int64, out of 2 * rows values, done of rows")
    if not 1 <= eos.numel() <= MAX_EOS or eos.dtype != torch.int64:
        raise ValueError(f"greedy step: 1 to {MAX_EOS} int64 end-of-sequence ids, got {eos.numel()} {eos.dtype}")
    if copy is not None and (copy.dtype != torch.float32 or tuple(copy.shape) != tuple(logits.shape)
                             or not copy.is_contiguous() or copy.device != logits.device):
        raise ValueError(f"greedy step: copy must be a contiguous float32 tensor of the logits' shape "
                         f"{tuple(logits.shape)} on {logits.device}, got {copy.dtype} {tuple(copy.shape)} on "
                         f"{copy.device}")
    if host is not None and (host.dtype != torch.int64 or host.numel() != 2 * rows or not host.is_contiguous()):
        raise ValueError(f"greedy step: host must be {2 * rows} contiguous int64 values, got {host.dtype} "
                         f"{tuple(host.shape)}")


def greedy_step(logits: torch.Tensor, *, seq: torch.Tensor, mask: torch.Tensor, done: torch.Tensor,
                eos: torch.Tensor, pad: int, col: int, ban_eos: bool, out: torch.Tensor,
                ids: torch.Tensor | None = None, pos: torch.Tensor | None = None, copy: torch.Tensor | None = None,
                host: torch.Tensor | None = None) -> None:
    """Choose each row's next token from ``logits`` [rows, vocab] and record it in place (module docstring).

    ``seq`` [rows, L] int64 and ``mask`` [rows, L] get the token / a 1 at column ``col``; ``done`` [rows] (bool)
    is updated; ``out`` [2 * rows] int64 gets the tokens then the finished flags; ``ids`` [rows, 1] (and
    ``pos`` [rows, 1] or, for multimodal RoPE's streams, [3, rows, 1], if given) get the next step's inputs when
    ``ids`` is given. ``copy`` (float32, the logits'
    shape) gets ``logits.float()``; ``host`` (2 * rows int64, page-locked host memory the device can address, or
    on the interpreter's CPU any tensor) gets what ``out`` gets."""
    _check(logits, seq, mask, done, eos, out, col, copy, host)
    rows, vocab = logits.shape
    if pos is not None and (tuple(pos.shape) not in ((rows, 1), (3, rows, 1)) or not pos.is_contiguous()):
        raise ValueError(f"greedy step: pos must be contiguous [{rows}, 1] or [3, {rows}, 1], got {tuple(pos.shape)}")
    interpret = use_interpreter(logits, "greedy step")
    chunks = cdiv(vocab, CHUNK)
    vals = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((rows, chunks), dtype=torch.int64, device=logits.device)
    launch = on_device(logits, interpret)
    stage = ids is not None
    with launch:
        _argmax_chunks_kernel[(chunks, rows)](logits, eos, vals, idx, vals if copy is None else copy, vocab,
                                              logits.stride(0), eos.numel(), chunks, BAN_EOS=ban_eos,
                                              COPY=copy is not None, BLOCK=CHUNK,
                                              **({} if interpret else {"num_warps": 4, **pdl(logits)}))
        _finish_kernel[(rows,)](vals, idx, chunks, done, eos, eos.numel(), pad, seq, seq.stride(0), mask,
                                mask.stride(0), ids if stage else out, pos if pos is not None else out, out,
                                out if host is None else host, rows, col, STAGE=stage, HAS_POS=pos is not None,
                                HOST=host is not None, BLOCK_C=max(2, next_power_of_2(chunks)),
                                BLOCK_L=1024, STREAMS=pos.shape[0] if pos is not None and pos.dim() == 3 else 1,
                                **({} if interpret else {"num_warps": 4, **pdl(logits)}))


def greedy_step_reference(logits: torch.Tensor, *, seq: torch.Tensor, mask: torch.Tensor, done: torch.Tensor,
                          eos: torch.Tensor, pad: int, col: int, ban_eos: bool, out: torch.Tensor,
                          ids: torch.Tensor | None = None, pos: torch.Tensor | None = None,
                          copy: torch.Tensor | None = None, host: torch.Tensor | None = None) -> None:
    """``greedy_step`` in torch operations: what the generator's general path does for a plain greedy step, with
    the same functions (``crossml.genai.search``)."""
    from crossml.genai import search

    token = search.finish(search.greedy(logits.index_fill(1, eos, search.NEG_INF) if ban_eos else logits), done,
                          pad, eos)
    seq[:, col] = token
    mask[:, col] = 1
    out.copy_(torch.cat([token, done.long()]))
    if copy is not None:
        copy.copy_(logits)
    if host is not None:
        host.copy_(out)
    if ids is not None:
        ids.copy_(token[:, None].to(ids.dtype))
        if pos is not None:
            pos.copy_(search.position_of(mask, col))
