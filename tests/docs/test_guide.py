"""The Python snippets of docs/directml-guide.md run, in order, in one namespace."""

from __future__ import annotations

import os
import re

GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "directml-guide.md")


def snippets() -> list[str]:
    text = open(GUIDE).read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_guide_snippets_run():
    blocks = snippets()
    assert len(blocks) >= 6
    ns: dict = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"directml-guide.md[snippet {i}]", "exec"), ns)  # noqa: S102
