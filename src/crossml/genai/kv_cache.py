"""The decoder's KV cache: one static max-length buffer per layer, or a cache grown by concatenation.

Layers named by genai_config.json's ``sliding_window.layers`` get a window-sized static buffer instead
(``Model.kv_shapes``): their GroupQueryAttention (``sliding_window_cache=1``) keeps the most recent positions in
it and evicts the rest itself.

``StaticKVCache`` (``past_present_share_buffer``): ``past_key_values.i.key`` is a
[rows, kv_heads, max_length, head_size] buffer allocated once (each layer's own heads and head size, where a decoder's
layers differ: Gemma 4's global layers, ``DecoderIO.kv_dims``); GroupQueryAttention writes the new
rows into it in place (crossml's op does when the session marks it ``kv_inplace``). If a run hands
back a different tensor (an op that copies, or a recorded graph's output copy), it is copied back into
the buffer, so the buffers keep their addresses for the whole generation: still no growth, no host sync.

``GrowingKVCache``: ``past`` starts with length 0 and each ``present`` becomes the next ``past``.

``LayerStates``: the carried states of layers without a KV cache (LFM2's short convolutions, ``past.i.conv``:
[rows, channels, conv_cache_size]; Qwen3.5's linear-attention layers, a convolution state and ``past.i.recurrent``:
[rows, heads, value head size, key head size]), which each run replaces whole. Lent buffers (the static decode path's)
keep their addresses (each present is copied into them), so a recorded decode step reads them in place; elsewhere
(the CPU's eager runs) each present is taken as the next past itself, as GrowingKVCache does (Qwen3.5-0.8B's 20 MB
of states a step were copied: 3.2 ms of a 115 ms CPU step). Such a state cannot be cut back
to an earlier position: the generator rewinds by running the kept tokens again, pads no prompt, and copies the states
aside before a step it runs ahead (``save`` / ``restore``: the step may be dropped).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("crossml.genai")


class KVCache:
    """Past inputs to feed and present outputs to take back, per layer, keys and values."""

    def __init__(self, past_names: list[str], present_names: list[str]) -> None:
        self.past_names = past_names
        self.present_names = present_names
        self.tensors: list[torch.Tensor] = []

    def feed(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.past_names, self.tensors))

    def update(self, presents: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i of the cache becomes old row ``rows[i]``."""
        self.tensors = [t.index_select(0, rows) for t in self.tensors]

    def rewind(self, length: int) -> None:
        raise NotImplementedError


class StaticKVCache(KVCache):
    def __init__(self, past_names: list[str], present_names: list[str], rows: int, shapes: list[tuple[int, int, int]],
                 dtype: torch.dtype, device: torch.device, tensors: list[torch.Tensor] | None = None) -> None:
        """``shapes``: each buffer's (kv_heads, length, head_size) (``Model.kv_shapes``)."""
        super().__init__(past_names, present_names)
        self.tensors = tensors if tensors is not None else zero_kv(rows, shapes, dtype, device)
        self._warned = False

    def update(self, presents: list[torch.Tensor]) -> None:
        for i, p in enumerate(presents):
            buf = self.tensors[i]
            if p is buf or p.data_ptr() == buf.data_ptr():
                continue
            if p.shape != buf.shape:
                raise RuntimeError(f"static KV cache: '{self.present_names[i]}' came back with shape {tuple(p.shape)}, "
                                   f"expected the shared buffer's {tuple(buf.shape)}")
            if not self._warned:
                log.info("static KV cache: the model returned copies of the shared buffers (not written in place, "
                         "e.g. by a recorded graph); copying them back")
                self._warned = True
            buf.copy_(p)  # the buffers keep their addresses: every decode step feeds the same tensors

    def reorder(self, rows: torch.Tensor) -> None:
        for t in self.tensors:
            t.copy_(t.index_select(0, rows))

    def rewind(self, length: int) -> None:
        pass  # rows past `length` are masked out and overwritten by the next run


class GrowingKVCache(KVCache):
    def __init__(self, past_names: list[str], present_names: list[str], rows: int, dims: list[tuple[int, int]],
                 dtype: torch.dtype, device: torch.device) -> None:
        """``dims``: each past's (kv_heads, head_size) (``DecoderIO.kv_dims``)."""
        super().__init__(past_names, present_names)
        self.tensors = zero_kv(rows, [(h, 0, d) for h, d in dims], dtype, device)

    def update(self, presents: list[torch.Tensor]) -> None:
        self.tensors = list(presents)

    def rewind(self, length: int) -> None:
        self.tensors = [t[:, :, :length].contiguous() for t in self.tensors]


def zero_kv(rows: int, shapes: list[tuple[int, int, int]], dtype: torch.dtype,
            device: torch.device) -> list[torch.Tensor]:
    """One zeroed [rows, kv_heads, length, head_size] buffer per (kv_heads, length, head_size) of ``shapes``."""
    return [torch.zeros((rows, h, n, d), dtype=dtype, device=device) for h, n, d in shapes]


def _grouped_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, one grouped copy per element type: torch's grouped copy launches one kernel
    only for tensors of one type, and copies one by one otherwise (the Gated DeltaNet export's fp16 convolution and
    float32 recurrent states: 36 copies a step for Qwen3.5-0.8B)."""
    groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for d, s in zip(dst, src):
        pair = groups.setdefault(d.dtype, ([], []))
        pair[0].append(d)
        pair[1].append(s)
    for d, s in groups.values():
        torch._foreach_copy_(d, s)


def zero_states(rows: int, shapes: list[tuple[int, ...]], dtypes: list[torch.dtype],
                device: torch.device) -> list[torch.Tensor]:
    """One zeroed [rows, *shape] buffer per carried state (``LayerStates``'s, or the lent decode buffers')."""
    return [torch.zeros((rows, *shape), dtype=dtype, device=device) for shape, dtype in zip(shapes, dtypes)]


class LayerStates:
    """Per-layer states a run replaces whole (no sequence axis to grow or cut): at fixed addresses where ``tensors``
    are lent (the static decode buffers), else each run's presents taken as they are."""

    def __init__(self, past_names: list[str], present_names: list[str], rows: int, shapes: list[tuple[int, ...]],
                 dtypes: list[torch.dtype], device: torch.device, tensors: list[torch.Tensor] | None = None) -> None:
        self.past_names = past_names
        self.present_names = present_names
        self._lent = tensors is not None  # fixed addresses: presents are copied into them
        self.tensors = tensors if tensors is not None else zero_states(rows, shapes, dtypes, device)
        self._saved: list[torch.Tensor] | None = None  # save()'s copies
        self._kept: list[torch.Tensor] | None = None  # keep()'s copies

    def feed(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.past_names, self.tensors))

    def update(self, presents: list[torch.Tensor]) -> None:
        for i, (name, past, buf, p) in enumerate(zip(self.present_names, self.past_names, self.tensors, presents)):
            if p.shape != buf.shape:
                raise RuntimeError(f"layer state: '{name}' came back with shape {tuple(p.shape)}, expected "
                                   f"{tuple(buf.shape)} (the decoder's input '{past}', model.decoder.conv_cache_size)")
            if p.data_ptr() == buf.data_ptr():
                continue
            if not self._lent and p.dtype == buf.dtype and p.device == buf.device and p.is_contiguous():
                self.tensors[i] = p  # the run's own new tensor: the next past as it is
            else:
                buf.copy_(p)

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i becomes old row ``rows[i]`` (new tensors where not lent: a present the last run showed
        through ``get_output`` stays as it came)."""
        for i, t in enumerate(self.tensors):
            if self._lent:
                t.copy_(t.index_select(0, rows))
            else:
                self.tensors[i] = t.index_select(0, rows)

    def _copied(self, into: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """The states copied into ``into`` (made where None or of other shapes): one grouped copy per element type,
        queued on the device."""
        if into is None or any(k.shape != t.shape for k, t in zip(into, self.tensors)):
            into = [torch.empty_like(t) for t in self.tensors]
        _grouped_copy(into, self.tensors)
        return into

    def save(self) -> None:
        """Copy the states aside: what ``restore`` puts back."""
        self._saved = self._copied(self._saved)

    def restore(self) -> None:
        """Put back the states ``save`` copied (a generator's step that ran ahead was dropped)."""
        if self._saved is None:
            raise RuntimeError("layer states: restore() without a save()")
        if self._lent:
            _grouped_copy(self.tensors, self._saved)
        else:  # the copies become the states (the next save makes new ones)
            self.tensors, self._saved = self._saved, None

    def keep(self) -> list[torch.Tensor]:
        """Copy the states into buffers of their own, reused from call to call: a speculative round's states before
        its verifying run, which ``put`` sets back."""
        self._kept = self._copied(self._kept)
        return self._kept

    def put(self, values: list[torch.Tensor]) -> None:
        """Set the states to copies of ``values`` (a snapshot)."""
        if self._lent:
            _grouped_copy(self.tensors, values)
        else:
            self.tensors = [v.clone() for v in values]

    def reset(self) -> None:
        if self._lent:
            for t in self.tensors:
                t.zero_()
        else:
            self.tensors = [torch.zeros_like(t) for t in self.tensors]
