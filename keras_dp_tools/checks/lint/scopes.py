"""One file's facts for the KDP checks: its scopes, imports, batch sizes and strategies.

A scope is the module or a function. Facts carry their line, so that a check can ask
whether a strategy exists *at* a line of a scope (created earlier in it, received as a
parameter, or existing where the function was defined) rather than anywhere in the file.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field

STRATEGY_CLASSES = {
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategy",
    "TPUStrategy",
    "CentralStorageStrategy",
    "get_strategy",
}
STRATEGY_HELPERS = {
    "keras_dp_tools.mirrored_strategy",
    "keras_dp_tools.setup.devices.mirrored_strategy",
}
STRATEGY_PARAMETERS = {"strategy", "distribution_strategy", "dist_strategy", "strat"}
# Calls batching by their first argument (methods of a dataset, or tf.data.experimental).
BATCHING_CALLS = {"batch", "padded_batch", "ragged_batch", "dense_to_ragged_batch"}
# Keras methods whose batch_size is documented as the global batch (KDP003).
GLOBAL_BATCH_METHODS = {"fit", "evaluate", "predict"}
# Layers whose batch_size is the static shape each replica sees, not a batch to split.
PER_REPLICA_SHAPES = {"Input", "InputLayer"}
# Bases whose subclasses make batches themselves (a batch size given to the constructor).
SEQUENCE_BASES = {"Sequence", "PyDataset"}
# Other ways to split a batch over devices: not tf.distribute, not this rule's business.
OTHER_SPLITTERS = ("torch", "jax", "flax", "tensorflow.experimental.dtensor", "keras.distribution")
OPTIMIZERS = {
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Nadam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Adafactor",
    "Ftrl",
    "Lion",
    "Lamb",
    "LAMB",
}


@dataclass(frozen=True)
class Site:
    """A batch size given at a call: ``size`` the value, ``code`` KDP001 or KDP003;
    ``targets`` the names the statement assigns (where the batched data goes)."""

    size: ast.expr
    call: ast.Call
    code: str
    targets: frozenset = field(default=frozenset(), compare=False)

    def text(self) -> str:
        func = self.call.func
        name = f".{func.attr}" if isinstance(func, ast.Attribute) else ast.unparse(func)
        size = ast.unparse(self.size)
        return f"{name}({size})" if self.size in self.call.args else f"{name}(batch_size={size})"


class Scope:
    def __init__(self, node, parent: Scope | None, class_name: str | None = None):
        self.node = node
        self.parent = parent
        self.class_name = class_name
        self.name = getattr(node, "name", None)
        self.assignments: dict[str, list[ast.expr]] = defaultdict(list)
        self.unpacked: dict[str, list[ast.expr]] = defaultdict(list)  # a, b = value
        self.parameters: list[str] = []
        self.strategy_names: dict[str, int] = {}  # name -> line it became a strategy
        self.strategy_line: int | None = None  # first line creating a strategy here
        self.uses_self_attrs: set[str] = set()
        self.batch_sites: list[Site] = []
        self.learning_rates: list[ast.expr] = []  # values given to optimizers
        self.calls: list[ast.Call] = []
        self.received = False

    @property
    def creates_strategy(self) -> bool:
        return self.strategy_line is not None

    def created(self, line: int) -> None:
        if self.strategy_line is None or line < self.strategy_line:
            self.strategy_line = line

    def lookup(self, name: str) -> tuple[Scope | None, list[ast.expr], bool]:
        """The scope defining ``name``, its assigned values, and whether it is a parameter."""
        scope = self
        while scope is not None:
            if name in scope.parameters or name in scope.assignments:
                return scope, scope.assignments.get(name, []), name in scope.parameters
            scope = scope.parent
        return None, [], False

    def strategy_name_at(self, name: str, line: int) -> bool:
        """Whether ``name`` holds a strategy at ``line`` (this scope or an enclosing one)."""
        scope = self
        while scope is not None:
            if name in scope.strategy_names and scope.strategy_names[name] <= line:
                return True
            line = getattr(scope.node, "lineno", line)
            scope = scope.parent
        return False

    def within(self, other: Scope) -> bool:
        scope = self
        while scope is not None and scope is not other:
            scope = scope.parent
        return scope is other


def keyword_value(call: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


def arguments_of(function) -> list[ast.arg]:
    arguments = function.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def _target_names(target) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(element) for element in target.elts))
    return set()


def sequence_classes(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Classes subclassing ``Sequence``/``PyDataset`` whose ``__init__`` takes a batch size."""
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(base).split(".")[-1] for base in node.bases}
        if not bases & SEQUENCE_BASES:
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.FunctionDef)
                and statement.name == "__init__"
                and any("batch" in argument.arg for argument in arguments_of(statement))
            ):
                found[node.name] = statement
    return found


class Collector(ast.NodeVisitor):
    """Walks a module once, building scopes and the import aliases."""

    def __init__(self, sequence_classes: dict[str, ast.FunctionDef] | None = None):
        self.aliases: dict[str, str] = {}
        # local name -> (level, module, imported name or None): for following imports.
        self.imports: dict[str, tuple[int, str, str | None]] = {}
        self.module = Scope(None, None)
        self.scopes: list[Scope] = [self.module]
        self.functions: dict[str, Scope] = {}  # module-level functions
        self.all_functions: dict[str, list[Scope]] = defaultdict(list)  # any depth
        self.class_strategy_attrs: dict[str, set[str]] = defaultdict(set)
        self.sequence_classes = sequence_classes or {}
        # Names bound inside ``with <strategy>.scope():`` (the models the strategy builds),
        # with the first line they are bound there.
        self.distributed_models: dict[str, int] = {}
        self._stack = [self.module]
        self._class: list[str] = []
        self._targets: list[frozenset] = [frozenset()]
        self._strategy_blocks = 0

    @property
    def scope(self) -> Scope:
        return self._stack[-1]

    # -- names -----------------------------------------------------------------

    def visit_Import(self, node):
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
                self.imports[alias.asname] = (0, alias.name, None)
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
                self.imports[top] = (0, top, None)

    def visit_ImportFrom(self, node):
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
            self.imports[alias.asname or alias.name] = (node.level, node.module or "", alias.name)

    def distributed_model(self, owner, line: int) -> bool:
        """Whether ``owner`` names a model built under a strategy's scope before ``line``."""
        return (
            isinstance(owner, ast.Name)
            and owner.id in self.distributed_models
            and self.distributed_models[owner.id] <= line
        )

    def qualified(self, node) -> str | None:
        if isinstance(node, ast.Name):
            name = self.aliases.get(node.id, node.id)
        elif isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            if base is None:
                return None
            name = f"{base}.{node.attr}"
        else:
            return None
        return "tensorflow" + name[2:] if name == "tf" or name.startswith("tf.") else name

    def is_strategy_call(self, node) -> bool:
        if not isinstance(node, ast.Call):
            return False
        name = self.qualified(node.func) or ""
        if name in STRATEGY_HELPERS or name.endswith(".mirrored_strategy"):
            return True
        parts = name.split(".")
        return parts[-1] in STRATEGY_CLASSES and "distribute" in parts[:-1]

    def is_strategy_value(self, value, line: int, scope: Scope | None = None) -> bool:
        """A strategy call, or a name holding a strategy at ``line`` (of ``scope``, by
        default the scope being visited)."""
        if self.is_strategy_call(value):
            return True
        scope = scope or self.scope
        return isinstance(value, ast.Name) and scope.strategy_name_at(value.id, line)

    # -- scopes ------------------------------------------------------------------

    def visit_ClassDef(self, node):
        self._class.append(node.name)
        self.generic_visit(node)
        self._class.pop()

    def visit_FunctionDef(self, node):
        scope = Scope(node, self.scope, self._class[-1] if self._class else None)
        arguments = arguments_of(node)
        scope.parameters = [argument.arg for argument in arguments]
        for argument in arguments:
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            if argument.arg in STRATEGY_PARAMETERS or annotation.endswith("Strategy"):
                scope.strategy_names[argument.arg] = node.lineno
                scope.received = True
        self.scopes.append(scope)
        if self.scope is self.module and not self._class:
            self.functions[node.name] = scope
        self.all_functions[node.name].append(scope)
        self._stack.append(scope)
        blocks, self._strategy_blocks = self._strategy_blocks, 0
        for statement in node.body:
            self.visit(statement)
        self._strategy_blocks = blocks
        self._stack.pop()
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- facts -------------------------------------------------------------------

    def _assign(self, target, value):
        if self._strategy_blocks:
            for name in _target_names(target):
                self.distributed_models.setdefault(name, value.lineno)
        if isinstance(target, (ast.Tuple, ast.List)):
            for name in _target_names(target):  # unpacked: where the value goes, not what
                self.scope.assignments[name].append(ast.Tuple([], ast.Load()))
                self.scope.unpacked[name].append(value)
        if isinstance(target, ast.Name):
            self.scope.assignments[target.id].append(value)
            if self.is_strategy_value(value, value.lineno):
                self.scope.strategy_names.setdefault(target.id, value.lineno)
                self.scope.created(value.lineno)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self._class
            and self.is_strategy_call(value)
        ):
            self.class_strategy_attrs[self._class[-1]].add(target.attr)
            self.scope.created(value.lineno)

    def _visit_value(self, node, targets):
        self._targets.append(frozenset(set().union(*(_target_names(t) for t in targets))))
        self.visit(node.value)
        self._targets.pop()
        for target in targets:
            self.visit(target)

    def visit_Assign(self, node):
        for target in node.targets:
            self._assign(target, node.value)
        self._visit_value(node, node.targets)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assign(node.target, node.value)
            self._visit_value(node, [node.target])

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            combined = ast.BinOp(
                left=ast.Name(node.target.id, ast.Load()), op=node.op, right=node.value
            )
            ast.copy_location(combined, node)
            self.scope.assignments[node.target.id].append(combined)
        self.generic_visit(node)

    def _strategy_scope(self, expression) -> bool:
        """``with <strategy>.scope():``; a parameter entering a scope is one received."""
        if not (
            isinstance(expression, ast.Call)
            and isinstance(expression.func, ast.Attribute)
            and expression.func.attr == "scope"
        ):
            return False
        owner = expression.func.value
        if self.is_strategy_value(owner, expression.lineno):
            return True
        if isinstance(owner, ast.Name) and owner.id in self.scope.parameters:
            self.scope.strategy_names.setdefault(owner.id, self.scope.node.lineno)
            self.scope.received = True
            return True
        return (
            isinstance(owner, ast.Attribute)
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        )

    def visit_With(self, node):
        strategy = any(self._strategy_scope(item.context_expr) for item in node.items)
        for item in node.items:
            self.visit(item)
        self._strategy_blocks += strategy
        for statement in node.body:
            self.visit(statement)
        self._strategy_blocks -= strategy

    visit_AsyncWith = visit_With

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.scope.uses_self_attrs.add(node.attr)
        self.generic_visit(node)

    def _batch_size(self, node: ast.Call) -> tuple[ast.expr | None, str]:
        """The batch size a call is given, and its code (KDP003 for fit's global batch)."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in self.sequence_classes:  # MySequence(x, y, batch_size)
            init = self.sequence_classes[name]
            for parameter in [a.arg for a in arguments_of(init)[1:] if "batch" in a.arg]:
                bound = bind(node, init, parameter, skip_self=True)
                if bound is not None and bound[0] == "argument":
                    return bound[1], "KDP001"
            return None, "KDP001"
        size = keyword_value(node, "batch_size")
        if name in BATCHING_CALLS and node.args:
            size = node.args[0]
        elif name == "bucket_by_sequence_length":
            size = keyword_value(node, "bucket_batch_sizes")
            size = size if size is not None or len(node.args) < 3 else node.args[2]
        elif name in GLOBAL_BATCH_METHODS and isinstance(func, ast.Attribute):
            return size, "KDP003"
        return size, "KDP001"

    def _per_replica_shape(self, node: ast.Call) -> bool:
        """``keras.Input(batch_size=...)``, also under a local alias (``make = layers.Input``)."""
        names = [ast.unparse(node.func)]
        if isinstance(node.func, ast.Name):
            names += [ast.unparse(value) for value in self.scope.lookup(node.func.id)[1]]
        return any(name.split(".")[-1] in PER_REPLICA_SHAPES for name in names)

    def visit_Call(self, node):
        if self.is_strategy_call(node):
            self.scope.created(node.lineno)
        self.scope.calls.append(node)
        qualified = self.qualified(node.func) or ""
        if not qualified.startswith(OTHER_SPLITTERS) and not self._per_replica_shape(node):
            size, code = self._batch_size(node)
            if size is not None:
                self.scope.batch_sites.append(Site(size, node, code, self._targets[-1]))
        if qualified.split(".")[-1] in OPTIMIZERS:
            rate = keyword_value(node, "learning_rate") or keyword_value(node, "lr")
            rate = rate if rate is not None else (node.args[0] if node.args else None)
            if rate is not None:
                self.scope.learning_rates.append(rate)
        self.generic_visit(node)


def bind(call: ast.Call, function, name: str, skip_self=False) -> tuple[str, ast.expr] | None:
    """Which of the call's arguments (``"argument"``) or of the function's defaults
    (``"default"``) gives parameter ``name``; None when splats make it unknowable.
    ``skip_self``: the call is a constructor, ``function`` its ``__init__``."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return "argument", keyword.value
    arguments = function.args
    positional = [argument.arg for argument in [*arguments.posonlyargs, *arguments.args]]
    if skip_self:
        positional = positional[1:]
    splat = any(isinstance(arg, ast.Starred) for arg in call.args) or any(
        keyword.arg is None for keyword in call.keywords
    )
    if name in positional:
        index = positional.index(name)
        before = call.args[: index + 1]
        if index < len(call.args) and not any(isinstance(arg, ast.Starred) for arg in before):
            return "argument", call.args[index]
        if splat:
            return None
        offset = index - (len(positional) - len(arguments.defaults))
        return ("default", arguments.defaults[offset]) if offset >= 0 else None
    kwonly = [argument.arg for argument in arguments.kwonlyargs]
    if name in kwonly and not splat:
        default = arguments.kw_defaults[kwonly.index(name)]
        return ("default", default) if default is not None else None
    return None
