"""Where a batch size comes from: names across files, and the flow of a value to a literal.

A value is followed through assignments, module constants of this and imported project
files, ``self`` and class attributes (``self.batch_size = 64``, ``class Config:
batch_size = 64``, ``Config.batch_size``, ``cfg = Config(); cfg.batch_size``) and dict
literals read with a constant key (``params = {"batch_size": 64}``; ``params["batch_size"]``).
"""

from __future__ import annotations

import ast
import operator

from keras_dp_tools.checks.lint.facts import Module
from keras_dp_tools.checks.lint.flow import (
    CONSTANT,
    GLOBAL,
    PARAMETER,
    SCALED,
    SCALED_CALLS,
    TRANSPARENT_CALLS,
    UNKNOWN,
    Flow,
    combine,
    from_input_context,
)
from keras_dp_tools.checks.lint.intent import GLOBAL as STATED_GLOBAL
from keras_dp_tools.checks.lint.intent import is_count
from keras_dp_tools.checks.lint.scopes import Scope
from keras_dp_tools.checks.lint.strategies import class_of, self_attribute

MAX_IMPORT_DEPTH = 4  # re-exports followed to find a name's definition
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
}


def _number(node) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    )


class Values:
    """Names and value flows of a module; ``project`` (a ``runner.Project``) resolves
    imports to other files."""

    def __init__(self, module: Module, project=None):
        self.module = module
        self.project = project

    # -- names across files ------------------------------------------------------

    def _load(self, module: Module, level: int, dotted: str) -> Module | None:
        if self.project is None or module.path is None:
            return None
        return self.project.load(module.path, level, dotted)

    def resolve_name(self, module: Module, name: str, depth: int = 0):
        """``("function", module, scope)``, ``("constant", module, name)`` or
        ``("module", module)`` for a module-level name; None when not followed."""
        collector = module.collector
        if depth > MAX_IMPORT_DEPTH:
            return None
        if name in collector.functions:
            return "function", module, collector.functions[name]
        if name in collector.module.assignments:
            return "constant", module, name
        if name not in collector.imports:
            return None
        level, dotted, imported = collector.imports[name]
        if imported is None:
            found = self._load(module, level, dotted)
            return ("module", found) if found is not None else None
        submodule = self._load(module, level, f"{dotted}.{imported}" if dotted else imported)
        if submodule is not None:
            return "module", submodule
        source = self._load(module, level, dotted)
        return self.resolve_name(source, imported, depth + 1) if source is not None else None

    def resolve(self, module: Module, node, depth: int = 0):
        """``resolve_name`` for a name or a dotted attribute of an imported module."""
        if isinstance(node, ast.Name):
            return self.resolve_name(module, node.id, depth)
        if isinstance(node, ast.Attribute):
            base = self.resolve(module, node.value, depth)
            if base is not None and base[0] == "module":
                package = base[1]
                if package.path.name == "__init__.py":  # pkg.data: a submodule first
                    submodule = self.project.load(package.path, 1, node.attr)
                    if submodule is not None:
                        return "module", submodule
                return self.resolve_name(package, node.attr, depth + 1)
        return None

    # -- where values come from ----------------------------------------------------

    def flow(self, module: Module, scope: Scope, node, seen=frozenset()) -> Flow:
        """Where a value comes from: scaled, global, constant, unknown, or parameters."""
        if isinstance(node, ast.Constant):
            if not _number(node):
                return Flow(UNKNOWN)
            if self._named_global(module, scope, node) or module.intent("", [node]) == "global":
                return Flow(GLOBAL)  # ... or a comment on (or above) its line says so
            return Flow(CONSTANT, origin=node, origin_module=module)
        if isinstance(node, ast.Attribute):
            if node.attr == "num_replicas_in_sync":
                return Flow(SCALED)
            if ast.unparse(node) in module.divided:  # FLAGS.batch_size % len(gpus) checked
                return Flow(GLOBAL)
            if node.attr in ("global_batch", "target_lr"):  # a plan's fields
                return self.flow(module, scope, node.value, seen)
            held = self._attribute_values(module, scope, node)
            if held is not None:
                return self._flows_of(module, node.attr, held, seen)
            if node.attr in module.collector.options and not self_attribute(node):
                default = module.collector.options[node.attr]  # args.batch_size
                if default is None:
                    return Flow(UNKNOWN)
                return self._flows_of(module, node.attr, [(module.collector.module, default)], seen)
            return self._imported_flow(module, node, seen)
        if isinstance(node, ast.Name):
            if (id(module), node.id) in seen:
                return Flow(UNKNOWN)
            owner, values, is_parameter = scope.lookup(node.id)
            if owner is None:
                return self._imported_flow(module, node, seen)
            if module.says_global(node.id, values):
                return Flow(GLOBAL)
            seen = seen | {(id(module), node.id)}
            flows = [self.flow(module, owner, value, seen) for value in values]
            if is_parameter:
                flows.append(Flow(PARAMETER, frozenset({(owner, node.id)})))
            return combine(flows)
        if isinstance(node, ast.Subscript):
            return self._item_flow(module, scope, node, seen)
        if isinstance(node, ast.Call):
            return self._call_flow(module, scope, node, seen)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Mult):
                if is_count(node.left) or is_count(node.right):
                    return Flow(SCALED)  # PER_WORKER_BATCH * NUM_WORKERS
                if _number(node.left) and _number(node.right):
                    return Flow(GLOBAL)  # 4096 * 9: a total worked out by hand
            return combine(
                [self.flow(module, scope, side, seen) for side in (node.left, node.right)]
            )
        if isinstance(node, ast.UnaryOp):
            return self.flow(module, scope, node.operand, seen)
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:  # bucket_batch_sizes
            return combine(self.flow(module, scope, element, seen) for element in node.elts)
        if isinstance(node, ast.IfExp):
            return combine(
                [self.flow(module, scope, side, seen) for side in (node.body, node.orelse)]
            )
        return Flow(UNKNOWN)

    def _flows_of(self, module: Module, name: str, pairs, seen) -> Flow:
        """The flow of the values ``name`` is given (``(scope, value)`` pairs)."""
        stated = module.intent(name, [value for _, value in pairs])
        if stated == STATED_GLOBAL:
            return Flow(GLOBAL)
        if not pairs:
            return Flow(UNKNOWN)
        return combine(self.flow(module, where, value, seen) for where, value in pairs)

    def _call_flow(self, module: Module, scope: Scope, node: ast.Call, seen) -> Flow:
        name = (module.collector.qualified(node.func) or "").split(".")[-1]
        if isinstance(node.func, ast.Attribute) and (
            node.func.attr in SCALED_CALLS or from_input_context(node.func)
        ):
            return Flow(SCALED)
        if name in SCALED_CALLS:
            return Flow(SCALED)
        if name in TRANSPARENT_CALLS:
            return combine(self.flow(module, scope, arg, seen) for arg in node.args)
        return Flow(UNKNOWN)

    def _attribute_values(self, module: Module, scope: Scope, node: ast.Attribute):
        """``(scope, value)`` pairs a class attribute is given, or None when the owner is
        not a class of this file (``self``, ``Config``, ``cfg = Config()``)."""
        collector = module.collector
        owner = None
        if self_attribute(node):
            owner = class_of(scope)
        elif isinstance(node.value, ast.Name):
            if node.value.id in collector.classes:
                owner = node.value.id
            else:
                values = scope.lookup(node.value.id)[1]
                made = {
                    value.func.id
                    for value in values
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                }
                if len(made) == 1 and len(values) == 1 and made <= collector.classes:
                    owner = made.pop()
        if owner is None or (owner, node.attr) not in collector.class_values:
            return None
        return collector.class_values[(owner, node.attr)]

    def _item_flow(self, module: Module, scope: Scope, node: ast.Subscript, seen) -> Flow:
        """``params["batch_size"]`` of a dict literal ``params = {"batch_size": 64}``."""
        key = node.slice
        if not (isinstance(node.value, ast.Name) and isinstance(key, ast.Constant)):
            return Flow(UNKNOWN)
        owner, values, _ = scope.lookup(node.value.id)
        if owner is None or not values or node.value.id in owner.unpacked:
            return Flow(UNKNOWN)
        found = []
        for value in values:
            if not isinstance(value, ast.Dict):
                return Flow(UNKNOWN)
            matches = [
                v
                for k, v in zip(value.keys, value.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == key.value
            ]
            if len(matches) != 1:
                return Flow(UNKNOWN)
            found.append((owner, matches[0]))
        return self._flows_of(module, str(key.value), found, seen)

    def _named_global(self, module: Module, scope: Scope, literal: ast.Constant) -> bool:
        """``GLOBAL_BATCH = 64`` earlier in the scope, then ``make(batch_size=64)``: the
        code has named this number the global batch."""
        return any(
            "batch" in name.lower()
            and module.says_global(name, values)
            and any(
                isinstance(value, ast.Constant)
                and value.value == literal.value
                and value.lineno <= literal.lineno
                for value in values
            )
            for name, values in scope.assignments.items()
        )

    def _imported_flow(self, module: Module, node, seen) -> Flow:
        """A module constant of another project file (``from config import BATCH``)."""
        found = self.resolve(module, node) if self.project is not None else None
        if found is None or found[0] != "constant":
            return Flow(UNKNOWN)
        _, owner, name = found
        return self.flow(owner, owner.collector.module, ast.Name(name, ast.Load()), seen)

    def evaluate(self, module: Module, scope: Scope, node, depth: int = 0):
        """The number a constant batch size works out to, or None."""
        if depth > 8:
            return None
        if _number(node):
            return node.value
        if isinstance(node, ast.Name):
            owner, values, is_parameter = scope.lookup(node.id)
            found = {self.evaluate(module, owner, value, depth + 1) for value in values}
            return found.pop() if len(found) == 1 and not is_parameter else None
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left = self.evaluate(module, scope, node.left, depth + 1)
            right = self.evaluate(module, scope, node.right, depth + 1)
            if left is None or right is None:
                return None
            try:
                return OPERATORS[type(node.op)](left, right)
            except ZeroDivisionError:
                return None
        return None
