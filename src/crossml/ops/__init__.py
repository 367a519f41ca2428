"""The operator library. Importing it registers every op module."""

from __future__ import annotations

import importlib
import pkgutil

from crossml.ops.registry import OpContext, OpSpec, lookup, op, registered_ops

__all__ = ["OpContext", "OpSpec", "lookup", "op", "registered_ops", "load_all"]

_loaded = False


def load_all() -> None:
    """Import every op module under crossml.ops (each registers its ops on import)."""
    global _loaded
    if _loaded:
        return
    import crossml.ops as pkg

    for mod in pkgutil.walk_packages(pkg.__path__, prefix="crossml.ops."):
        if mod.name.rsplit(".", 1)[-1].startswith("_") or mod.name.endswith(".registry"):
            continue
        importlib.import_module(mod.name)
    _loaded = True
