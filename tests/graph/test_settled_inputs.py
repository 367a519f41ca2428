"""``OpContext.settled_inputs``: which inputs a node's kernels may read before their PDL wait (the plan's previous step
is a product on the same GPU that wrote another of the node's inputs)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from crossml.graph.plan import Step, _Builder
from crossml.ops.registry import OpContext

GPU = torch.device("cuda", 0)


def _step(op_type: str, outputs: tuple[int, ...], device: torch.device = GPU) -> Step:
    return Step(fn=lambda *a: None, inputs=(), outputs=outputs, attrs={}, release=(), node_name=op_type,
                op_type=op_type, device=device)


def _settled(steps: list[Step], domain: str, in_slots: tuple[int, ...], device: torch.device = GPU,
             last_is_node: bool = True) -> tuple[bool, ...]:
    b = SimpleNamespace(steps=steps, last_node=(steps[-1], domain) if steps and last_is_node else None)
    return _Builder._settled(b, in_slots, device)


def test_after_the_product_that_wrote_an_input() -> None:
    # packed QKV (slot 7) from the previous MatMul; caches, lengths, cos/sin from earlier steps or the graph
    assert _settled([_step("Add", (3,)), _step("MatMul", (7,))], "", (7, -1, -1, 1, 2, 3, 4)) == \
        (False, True, True, True, True, True, True)
    assert _settled([_step("MatMulNBits", (7,))], "com.microsoft", (7, 5)) == (False, True)
    assert _settled([_step("NormMatMulNBits", (7, 8))], "com.crossml", (5, 7)) == (True, False)


def test_not_settled_otherwise() -> None:
    assert _settled([_step("Add", (7,))], "", (7, 1)) == ()  # not a product: may launch nothing
    assert _settled([_step("MatMul", (7,))], "", (1, 2)) == ()  # the product wrote none of the inputs
    assert _settled([_step("MatMul", (7,))], "", (7, 1), device=torch.device("cpu")) == ()
    assert _settled([_step("MatMul", (7,), device=torch.device("cpu"))], "", (7, 1)) == ()  # on another device
    assert _settled([_step("MatMul", (7,))], "", (7, 1), last_is_node=False) == ()  # a copy step came after it
    assert _settled([_step("MatMul", (7,))], "com.example", (7, 1)) == ()  # another domain's MatMul
    assert _settled([], "", (7, 1)) == ()


def test_context_settled() -> None:
    ctx = OpContext("n", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    assert not ctx.settled(3)  # the plan did not say
    ctx.settled_inputs = (False, True, True, True, True, True, True)
    assert ctx.settled(1, 3, 6) and ctx.settled(3, 11)  # 11: an absent optional input
    assert not ctx.settled(0, 3)


def test_settled_by_names_the_product() -> None:
    """``OpContext.settled_by``: the previous step's op type where it settles an input (the decode attention picks
    where its splits are combined by it), "" where nothing is settled."""
    steps = [_step("Add", (3,)), _step("MatMulNBits", (7,))]
    b = SimpleNamespace(steps=steps, last_node=(steps[-1], "com.microsoft"))
    b._settled = lambda in_slots, device: _Builder._settled(b, in_slots, device)
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    _Builder._settle(b, ctx, (7, 1), GPU)
    assert ctx.settled_inputs == (False, True) and ctx.settled_by == "MatMulNBits"
    _Builder._settle(b, ctx, (1, 2), GPU)  # the product wrote none of the inputs
    assert ctx.settled_inputs == () and ctx.settled_by == ""
