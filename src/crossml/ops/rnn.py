"""Recurrent layers: RNN, GRU and LSTM (every opset version).

The three share one driver: the input projection ``X @ W^T`` of every step is one matmul, then a
per-step cell function runs over time. ``sequence_lens`` is honoured on the device with masks (a
finished sequence keeps its state and writes zeros to ``Y``), so no value is read on the host.
Activation functions follow onnxruntime: names are case-insensitive, and ``activation_alpha`` /
``activation_beta`` are consumed in order by the functions that take them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from crossml.ops.registry import op

Act = Callable[[torch.Tensor], torch.Tensor]

# name -> (uses alpha, uses beta, default alpha, default beta)
_ACT_PARAMS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0), "sigmoid": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0), "softplus": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0), "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, 0.0),
}


def _make_act(name: str, a: float, b: float) -> Act:
    fns: dict[str, Act] = {
        "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softsign": F.softsign,
        "softplus": F.softplus,
        "affine": lambda x: x * a + b,
        "leakyrelu": lambda x: F.leaky_relu(x, a),
        "thresholdedrelu": lambda x: torch.where(x > a, x, torch.zeros_like(x)),
        "scaledtanh": lambda x: a * torch.tanh(b * x),
        "hardsigmoid": lambda x: torch.clamp(a * x + b, 0.0, 1.0),
        "elu": lambda x: F.elu(x, a),
    }
    return fns[name]


def _activations(names: Sequence[str] | None, alpha: Sequence[float] | None, beta: Sequence[float] | None,
                 defaults: Sequence[str], num_dirs: int, op_type: str) -> list[list[Act]]:
    """One list of activation functions per direction."""
    per_dir = len(defaults)
    names = list(names) if names else list(defaults) * num_dirs
    if len(names) == per_dir and num_dirs == 2:
        names = names * 2
    if len(names) != per_dir * num_dirs:
        raise ValueError(f"{op_type}: expected {per_dir * num_dirs} activations for {num_dirs} direction(s), "
                         f"got {len(names)}: {names}")
    alphas, betas = list(alpha or []), list(beta or [])
    fns: list[Act] = []
    for name in names:
        key = name.lower()
        if key not in _ACT_PARAMS:
            raise ValueError(f"{op_type}: unknown activation '{name}'; expected one of "
                             f"{', '.join(sorted(_ACT_PARAMS))}")
        use_a, use_b, da, db = _ACT_PARAMS[key]
        a = alphas.pop(0) if use_a and alphas else da
        b = betas.pop(0) if use_b and betas else db
        fns.append(_make_act(key, a, b))
    return [fns[d * per_dir:(d + 1) * per_dir] for d in range(num_dirs)]


def _num_dirs(direction: str, W: torch.Tensor, op_type: str) -> int:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"{op_type}: direction must be forward, reverse or bidirectional, got '{direction}'")
    n = 2 if direction == "bidirectional" else 1
    if W.shape[0] != n:
        raise ValueError(f"{op_type}: direction '{direction}' needs W with {n} direction(s), got shape "
                         f"{tuple(W.shape)}")
    return n


def _run(X: torch.Tensor, W: torch.Tensor, R: torch.Tensor, B: torch.Tensor | None,
         sequence_lens: torch.Tensor | None, states: list[torch.Tensor | None], *, layout: int, direction: str,
         num_gates: int, cell: Callable[[int, torch.Tensor, tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]],
         op_type: str) -> tuple[torch.Tensor, ...]:
    """Drive ``cell(d, x_proj_t, state) -> new state`` (state[0] is the hidden) over time.

    Returns Y and the final value of each state, in the requested layout.
    """
    if X.dim() != 3:
        raise ValueError(f"{op_type}: X must be 3-D, got shape {tuple(X.shape)}")
    num_dirs = _num_dirs(direction, W, op_type)
    if layout:
        X = X.transpose(0, 1)
        states = [s.transpose(0, 1) if s is not None else None for s in states]
    seq, batch = X.shape[0], X.shape[1]
    hidden = R.shape[-1]
    if W.shape[1] != num_gates * hidden or R.shape[1] != num_gates * hidden:
        raise ValueError(f"{op_type}: W and R must have {num_gates}*hidden_size = {num_gates * hidden} rows, "
                         f"got {tuple(W.shape)} and {tuple(R.shape)}")
    zeros = X.new_zeros((num_dirs, batch, hidden))
    states = [s if s is not None else zeros for s in states]
    valid = None
    if sequence_lens is not None:
        steps = torch.arange(seq, device=X.device).unsqueeze(1)
        valid = (steps < sequence_lens.to(X.device).reshape(1, -1)).unsqueeze(-1)  # (T, B, 1)
    ys, finals = [], []
    for d in range(num_dirs):
        proj = X @ W[d].mT  # (T, B, G*H)
        if B is not None:
            proj = proj + B[d, : num_gates * hidden]
        state = tuple(s[d] for s in states)
        out: list[torch.Tensor | None] = [None] * seq
        reverse = direction == "reverse" or d == 1
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            new = cell(d, proj[t], state)
            if valid is not None:
                new = tuple(torch.where(valid[t], n, s) for n, s in zip(new, state))
                out[t] = torch.where(valid[t], new[0], torch.zeros((), dtype=X.dtype, device=X.device))
            else:
                out[t] = new[0]
            state = new
        ys.append(torch.stack(out, 0) if seq else X.new_zeros((0, batch, hidden)))  # type: ignore[arg-type]
        finals.append(state)
    Y = torch.stack(ys, 1)  # (T, D, B, H)
    final = [torch.stack([f[i] for f in finals], 0) for i in range(len(states))]  # each (D, B, H)
    if layout:
        Y = Y.permute(2, 0, 1, 3)
        final = [f.transpose(0, 1) for f in final]
    return (Y, *final)


def _clip(x: torch.Tensor, clip: float | None) -> torch.Tensor:
    return x if clip is None else x.clamp(-clip, clip)


@op("RNN", since=1)
@op("RNN", since=7)
@op("RNN", since=14)
@op("RNN", since=22)
def rnn(X: torch.Tensor, W: torch.Tensor, R: torch.Tensor, B: torch.Tensor | None = None,
        sequence_lens: torch.Tensor | None = None, initial_h: torch.Tensor | None = None, *,
        activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
        activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
        hidden_size: int | None = None, layout: int = 0, output_sequence: int = 0,
        ) -> tuple[torch.Tensor, torch.Tensor]:
    acts = _activations(activations, activation_alpha, activation_beta, ("Tanh",), W.shape[0], "RNN")

    def cell(d: int, xw: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        g = xw + state[0] @ R[d].mT
        if B is not None:
            g = g + B[d, g.shape[-1]:]
        return (acts[d][0](_clip(g, clip)),)

    Y, Y_h = _run(X, W, R, B, sequence_lens, [initial_h], layout=layout, direction=direction, num_gates=1,
                  cell=cell, op_type="RNN")
    return Y, Y_h


@op("GRU", since=1)
@op("GRU", since=3)
@op("GRU", since=7)
@op("GRU", since=14)
@op("GRU", since=22)
def gru(X: torch.Tensor, W: torch.Tensor, R: torch.Tensor, B: torch.Tensor | None = None,
        sequence_lens: torch.Tensor | None = None, initial_h: torch.Tensor | None = None, *,
        activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
        activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
        hidden_size: int | None = None, layout: int = 0, linear_before_reset: int = 0,
        output_sequence: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    acts = _activations(activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh"), W.shape[0], "GRU")
    hid = R.shape[-1]

    def cell(d: int, xw: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        h = state[0]
        f, g = acts[d]
        r_w = R[d]  # (3H, H): z, r, h
        rb = B[d, 3 * hid:] if B is not None else None
        hr = h @ r_w[: 2 * hid].mT
        if rb is not None:
            hr = hr + rb[: 2 * hid]
        zr = xw[:, : 2 * hid] + hr
        z = f(_clip(zr[:, :hid], clip))
        r = f(_clip(zr[:, hid:], clip))
        if linear_before_reset:
            hh = h @ r_w[2 * hid:].mT
            if rb is not None:
                hh = hh + rb[2 * hid:]
            n = xw[:, 2 * hid:] + r * hh
        else:
            n = xw[:, 2 * hid:] + (r * h) @ r_w[2 * hid:].mT
            if rb is not None:
                n = n + rb[2 * hid:]
        n = g(_clip(n, clip))
        return ((1 - z) * n + z * h,)

    Y, Y_h = _run(X, W, R, B, sequence_lens, [initial_h], layout=layout, direction=direction, num_gates=3,
                  cell=cell, op_type="GRU")
    return Y, Y_h


@op("LSTM", since=1)
@op("LSTM", since=7)
@op("LSTM", since=14)
@op("LSTM", since=22)
def lstm(X: torch.Tensor, W: torch.Tensor, R: torch.Tensor, B: torch.Tensor | None = None,
         sequence_lens: torch.Tensor | None = None, initial_h: torch.Tensor | None = None,
         initial_c: torch.Tensor | None = None, P: torch.Tensor | None = None, *,
         activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
         activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
         hidden_size: int | None = None, input_forget: int = 0, layout: int = 0, output_sequence: int = 0,
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    acts = _activations(activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh", "Tanh"),
                        W.shape[0], "LSTM")
    hid = R.shape[-1]

    def cell(d: int, xw: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        h, c = state
        f_act, g_act, h_act = acts[d]
        gates = xw + h @ R[d].mT
        if B is not None:
            gates = gates + B[d, 4 * hid:]
        gi, go, gf, gc = gates.split(hid, dim=-1)
        if P is not None:
            p_i, p_o, p_f = P[d].split(hid)
            gi = gi + p_i * c
            gf = gf + p_f * c
        i = f_act(_clip(gi, clip))
        f = 1 - i if input_forget else f_act(_clip(gf, clip))
        c_new = f * c + i * g_act(_clip(gc, clip))
        if P is not None:
            go = go + p_o * c_new
        o = f_act(_clip(go, clip))
        return o * h_act(c_new), c_new

    Y, Y_h, Y_c = _run(X, W, R, B, sequence_lens, [initial_h, initial_c], layout=layout, direction=direction,
                       num_gates=4, cell=cell, op_type="LSTM")
    return Y, Y_h, Y_c
