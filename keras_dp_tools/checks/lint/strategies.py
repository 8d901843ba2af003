"""Which values are synchronous strategies, and which names hold models they build.

Only synchronous strategies count (``STRATEGY_CLASSES``): a ``ParameterServerStrategy``, a
``MirroredStrategy`` on one device or a DTensor mesh is never one, however it is held, and
``with x.scope():`` is a strategy's scope only when ``x`` provably holds one (a strategy
call, a name or ``self`` attribute bound to one, a parameter named as one, a function
returning one).
"""

from __future__ import annotations

import ast

from keras_dp_tools.checks.lint.scopes import (
    OTHER_STRATEGY_CLASSES,
    STRATEGY_CLASSES,
    STRATEGY_HELPERS,
    STRATEGY_PARAMETERS,
    STRATEGY_RUNNERS,
    Scope,
    keyword_value,
)


class StrategyFacts:
    """What ``Collector`` knows of strategies and models (a mixin: it fills in
    ``strategy_functions``, ``class_strategy_attrs`` and ``models`` while walking)."""

    # -- strategies and models ---------------------------------------------------------

    def is_strategy_call(self, node) -> bool:
        if not isinstance(node, ast.Call):
            return False
        if isinstance(node.func, ast.Name) and node.func.id in self.strategy_functions:
            return True
        name = self.qualified(node.func) or ""
        if name in self.strategy_functions:  # common.get_strategy() of a project file
            return True
        if name in STRATEGY_HELPERS or name.endswith(".mirrored_strategy"):
            return True
        parts = name.split(".")
        return parts[-1] in STRATEGY_CLASSES and "distribute" in parts[:-1] and not one_device(node)

    def is_strategy_value(self, value, line: int, scope: Scope | None = None) -> bool:
        """A strategy call, a name holding a strategy at ``line`` (of ``scope``, by
        default the scope being visited), or a ``self`` attribute holding one."""
        if self.is_strategy_call(value):
            return True
        if isinstance(value, ast.IfExp):  # TPUStrategy(tpu) if tpu else get_strategy()
            return any(
                self.is_strategy_value(side, line, scope) for side in (value.body, value.orelse)
            )
        if isinstance(value, ast.BoolOp):  # strategy or tf.distribute.MirroredStrategy()
            return any(self.is_strategy_value(side, line, scope) for side in value.values)
        scope = scope or self.scope
        if isinstance(value, ast.Name):
            return scope.strategy_name_at(value.id, line)
        attribute = self_attribute(value)
        return attribute is not None and attribute in self.class_strategy_attrs.get(
            class_of(scope) or "", set()
        )

    def is_default_strategy_call(self, node) -> bool:
        """``tf.distribute.get_strategy()``: the strategy whose scope the code is in,
        else the one-replica default."""
        return isinstance(node, ast.Call) and (self.qualified(node.func) or "").endswith(
            "distribute.get_strategy"
        )

    def is_other_strategy_call(self, node) -> bool:
        """A strategy that splits no batch over synchronous replicas
        (``ParameterServerStrategy``, ``OneDeviceStrategy``, a one-device mirror)."""
        if not isinstance(node, ast.Call):
            return False
        parts = (self.qualified(node.func) or "").split(".")
        if "distribute" not in parts[:-1]:
            return False
        return parts[-1] in OTHER_STRATEGY_CLASSES or (
            parts[-1] in STRATEGY_CLASSES and one_device(node)
        )

    def run_under_strategy(self, call: ast.Call) -> set[str]:
        """The functions ``call`` runs under a strategy's scope it never shows:
        ``MirroredStrategyRunner(num_slots=8).run(train)`` (or through a name bound to the
        runner) runs ``train`` under a ``MultiWorkerMirroredStrategy``, unless the runner
        is told the function makes its own (``use_custom_strategy=True``) or has one
        slot (one replica)."""
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "run"):
            return set()
        runner = func.value
        if isinstance(runner, ast.Name):
            values = self.scope.lookup(runner.id)[1]
            runner = values[0] if len(values) == 1 else None
        if not (
            isinstance(runner, ast.Call)
            and (self.qualified(runner.func) or "").split(".")[-1] in STRATEGY_RUNNERS
            and not _constant(keyword_value(runner, "use_custom_strategy"), True)
            and not _constant(keyword_value(runner, "num_slots"), 1)
        ):
            return set()
        given = call.args[:1] or [keyword_value(call, "train_fn")]
        return {function.id for function in given if isinstance(function, ast.Name)}

    def model_key(self, owner, scope: Scope) -> tuple | None:
        """How a model held by ``owner`` (a name or ``self.<attr>``) read in ``scope`` is
        known: the scope defining the name, or the class holding the attribute."""
        if isinstance(owner, ast.Name):
            defining = scope.lookup(owner.id)[0] or scope
            return id(defining), owner.id
        attribute = self_attribute(owner)
        if attribute is not None and class_of(scope):
            return "self", class_of(scope), attribute
        return None

    def mark_model(self, owner, line: int, scope: Scope | None = None) -> bool:
        """Marks ``owner`` as a model a strategy builds (or compiles) at ``line``; whether
        it is new."""
        scope = scope or self.scope
        key = self.model_key(owner, scope)
        line = line if key is None or key[0] != "self" else 0
        if key is None or line in self.models[key]:
            return False
        self.models[key].add(line)
        return True

    def distributed_model(self, owner, line: int, scope: Scope) -> bool:
        """Whether ``owner`` (read in ``scope``) holds a model built or compiled under a
        synchronous strategy's scope: in the scope defining the name, the last time it
        was assigned or compiled before ``line`` was under the scope; read elsewhere (a
        function reading a module's model, an attribute), once is enough."""
        key = self.model_key(owner, scope)
        marked = self.models.get(key) if key is not None else None
        if not marked:
            return False
        if key[0] == "self" or not isinstance(owner, ast.Name):
            return True
        defining = scope.lookup(owner.id)[0] or scope
        if defining is not scope:
            return True
        assigned = [
            value.lineno
            for value in scope.assignments.get(owner.id, [])
            if getattr(value, "lineno", None) is not None and value.lineno <= line
        ]
        before = [event for event in marked if event <= line]
        return bool(before) and max(before) >= max(assigned, default=0)


def self_attribute(node) -> str | None:
    """``attr`` for ``self.attr``, else None."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def class_of(scope: Scope | None) -> str | None:
    """The class whose method ``scope`` is (or is nested in)."""
    while scope is not None:
        if scope.class_name:
            return scope.class_name
        scope = scope.parent
    return None


def _constant(node, value) -> bool:
    return (
        isinstance(node, ast.Constant) and node.value == value and type(node.value) is type(value)
    )


def one_device(call: ast.Call) -> bool:
    """``MirroredStrategy(devices=["/gpu:0"])``: one replica, nothing split."""
    devices = keyword_value(call, "devices")
    devices = devices if devices is not None or not call.args else call.args[0]
    return isinstance(devices, (ast.List, ast.Tuple)) and len(devices.elts) == 1


def strategy_word(name: str) -> bool:
    """A parameter named as a (synchronous) strategy."""
    lowered = name.lower()
    if "ps_" in lowered or "parameter_server" in lowered:
        return False
    return "strateg" in lowered or name in STRATEGY_PARAMETERS
