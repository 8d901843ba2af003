"""Lazy public names for packages (PEP 562): importing a package stays cheap, and each
name's module is imported the first time the name is used."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, namespace: dict, exports: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package`` that load ``exports`` (public name
    -> defining module) on first access and cache them in ``namespace``."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
