"""The pieces of one file's facts for the KDP checks: scopes, batch sites, call binding.

A scope is the module or a function. Facts carry their line, so that a check can ask
whether a name holds a strategy or a model *at* a line of a scope. ``collector.py`` walks a
file to fill them in.
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
}  # not get_strategy(): the default strategy has one replica and splits nothing
# Strategies that split no batch over synchronous replicas.
OTHER_STRATEGY_CLASSES = {"ParameterServerStrategy", "OneDeviceStrategy"}
STRATEGY_HELPERS = {
    "keras_dp_tools.mirrored_strategy",
    "keras_dp_tools.setup.devices.mirrored_strategy",
}
# Launchers that run a training function under a synchronous strategy's scope they make
# themselves (spark-tensorflow-distributor: a MultiWorkerMirroredStrategy, one replica
# per slot).
STRATEGY_RUNNERS = {"MirroredStrategyRunner"}
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
        self.strategy_lines: dict[str, set[int]] = defaultdict(set)  # lines assigning one
        # (name, line) -> the branches a strategy binding is in (``Collector._blocks``),
        # and the bindings of a name to anything else (a strategy that splits nothing,
        # ``get_strategy()``, None): (line, branches)
        self.binding_blocks: dict[tuple[str, int], tuple] = {}
        self.rebindings: dict[str, list[tuple[int, tuple]]] = defaultdict(list)
        self.strategy_line: int | None = None  # first line creating a strategy here
        self.batch_sites: list[Site] = []
        self.learning_rates: list[ast.expr] = []  # values given to optimizers
        self.calls: list[ast.Call] = []
        self.returns: list[ast.expr] = []  # values the function returns
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

    def rebound(self, name: str, since: int, line: int) -> bool:
        """Whether a binding of ``name`` to something that is not a synchronous
        strategy, after ``since`` and up to ``line``, always runs after the strategy bound
        at ``since``: it is in the same block or one enclosing it (``s =
        MirroredStrategy()`` then ``s = tf.distribute.get_strategy()``), not in another
        branch (the ``except`` or ``else`` of a TPU probe, an ``if`` that may not run)."""
        blocks = self.binding_blocks.get((name, since), ())
        return any(
            since < number <= line and blocks[: len(where)] == where
            for number, where in self.rebindings.get(name, [])
        )

    def holds_strategy(self, name: str, line: int) -> bool:
        """In this scope: a synchronous strategy bound to ``name`` by ``line`` (or
        received) that no later binding to something else surely replaced."""
        bound = [number for number in self.strategy_lines[name] if number <= line]
        bound = bound or [self.strategy_names[name]]
        return any(not self.rebound(name, since, line) for since in bound)

    def strategy_name_at(self, name: str, line: int) -> bool:
        """Whether ``name`` holds a strategy at ``line`` (this scope or an enclosing one).
        In the scope reading it, one bound before ``line`` that no later binding to
        something else surely replaced (``rebound``: ``get_strategy()`` or a
        ``ParameterServerStrategy`` on a later line; in an ``except`` or ``else`` branch
        it is a fallback, the strategy stays possible); a name of an enclosing scope is
        one if a binding to one is not surely replaced before the function is defined (it
        is read when called, which may be before a later rebinding)."""
        scope = self
        while scope is not None:
            if name in scope.strategy_names and scope.strategy_names[name] <= line:
                if scope is not self:  # ``line``: where the function reading it is defined
                    lines = scope.strategy_lines[name] or {scope.strategy_names[name]}
                    return any(not scope.rebound(name, since, line) for since in lines)
                return scope.holds_strategy(name, line)
            if scope is self and name in scope.assignments:
                return False  # a local name of something else shadows an outer strategy
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


def target_names(target) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(target_names(element) for element in target.elts))
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
