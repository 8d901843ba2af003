"""Lazy public names for packages (PEP 562): importing a package stays cheap, and each
name's module is imported the first time the name is used."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, namespace: dict, exports: dict[str, str | tuple[str, str]]):
    """``__getattr__`` and ``__dir__`` for ``package`` that load ``exports`` on first
    access and cache them in ``namespace``.

    ``exports`` maps a public name to its defining module (the attribute of the same
    name), to ``(module, attribute)`` when the public name differs, or to
    ``(module, None)`` for the module itself (``kdt.plots``).

    Args:
        package: the package's name, for the error message.
        namespace: the package's ``globals()``, where loaded names are cached.
        exports: public name -> where it is defined (as above).

    Returns:
        ``(__getattr__, __dir__)``, to assign in the package's ``__init__``.

    Example:

    ```python
    from keras_dp_tools.common.lazy import lazy_exports

    _EXPORTS = {"Report": "keras_dp_tools.report.facade"}
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
    ```
    """

    def __getattr__(name: str):
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = target if isinstance(target, tuple) else (target, name)
        loaded = importlib.import_module(module)
        value = loaded if attribute is None else getattr(loaded, attribute)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
