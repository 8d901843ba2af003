"""Walks one file once, filling in its scopes: imports, assignments, batch sites, calls,
command-line options, strategies and the models built under a strategy's scope
(``scopes.py`` holds the pieces, ``strategies.py`` what makes a strategy or a model).
"""

from __future__ import annotations

import ast
from collections import defaultdict

from keras_dp_tools.checks.lint.scopes import (
    BATCHING_CALLS,
    GLOBAL_BATCH_METHODS,
    OPTIMIZERS,
    OTHER_SPLITTERS,
    PER_REPLICA_SHAPES,
    Scope,
    Site,
    arguments_of,
    bind,
    keyword_value,
    target_names,
)
from keras_dp_tools.checks.lint.strategies import (
    StrategyFacts,
    class_of,
    self_attribute,
    strategy_word,
)

# Calls whose functions make sequence windows, not training batches (``window.batch(n)``).
WINDOW_METHODS = {"flat_map", "interleave"}


class Collector(StrategyFacts, ast.NodeVisitor):
    """Walks a module once, building scopes and the import aliases."""

    def __init__(
        self,
        sequence_classes: dict[str, ast.FunctionDef] | None = None,
        known: Collector | None = None,
        received: set[tuple[int, str]] = frozenset(),
        declined: set[tuple[int, str]] = frozenset(),
    ):
        """``known``: a first walk of the same file, whose strategies (module names,
        ``self`` attributes, functions returning one) hold from the start, as they do by
        the time its functions run; ``received``: (line of a function, parameter) pairs
        that callers give a strategy; ``declined``: parameters named as a strategy that
        every caller gives one that splits nothing (``Module``)."""
        self.received = received
        self.declined = declined
        self.aliases: dict[str, str] = {}
        # local name -> (level, module, imported name or None): for following imports.
        self.imports: dict[str, tuple[int, str, str | None]] = {}
        self.module = Scope(None, None)
        self.scopes: list[Scope] = [self.module]
        self.functions: dict[str, Scope] = {}  # module-level functions
        self.all_functions: dict[str, list[Scope]] = defaultdict(list)  # any depth
        self.classes: set[str] = set()
        self.class_strategy_attrs: dict[str, set[str]] = defaultdict(set)
        # (class, attribute) -> [(scope, line, branches)]: its bindings to a strategy not
        # surely replaced since (``self.strategy = get_strategy()`` on a later line).
        self._attribute_strategies: dict[tuple, list] = defaultdict(list)
        # (class, attribute) -> [(scope, value)]: ``self.x = v`` and class-body ``x = v``.
        self.class_values: dict[tuple[str, str], list[tuple[Scope, ast.expr]]] = defaultdict(list)
        self.strategy_functions: set[str] = set()  # functions returning a strategy
        self.sequence_classes = sequence_classes or {}
        # Models a strategy builds: (id of the scope, name) or ("self", class, attribute)
        # bound under ``with <strategy>.scope():`` (or compiled there) -> first line.
        self.models: dict[tuple, set[int]] = defaultdict(set)
        self.scoped_functions: set[str] = set()  # functions called under a strategy scope
        # functions a launcher runs under a strategy it makes -> the launching call
        self.runner_calls: dict[str, ast.Call] = {}
        self.window_functions: set[str] = set()  # functions given to flat_map/interleave
        self.window_calls: set[int] = set()  # batch calls inside such lambdas
        # Command-line options: argparse dest or absl flag name -> its default (or None).
        self.options: dict[str, ast.expr | None] = {}
        self._stack = [self.module]
        self._class: list[str] = []
        self._class_body: list[bool] = [False]
        self._targets: list[frozenset] = [frozenset()]
        self._strategy_blocks = 0
        self._windows = 0
        # The branches the statement being visited is in, outermost first: (id of an
        # if/try/loop/match, which part). A ``with`` body is no branch.
        self._blocks: list[tuple[int, str]] = []
        if known is not None:
            self.module.strategy_names = dict.fromkeys(known.module.strategy_names, 0)
            for owner, attributes in known.class_strategy_attrs.items():
                self.class_strategy_attrs[owner] |= attributes
            self.strategy_functions |= known.strategy_functions

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

    # -- scopes ------------------------------------------------------------------

    def visit_ClassDef(self, node):
        self.classes.add(node.name)
        self._class.append(node.name)
        self._class_body.append(True)
        for decorator in node.decorator_list:
            self.visit(decorator)
        for statement in node.body:
            self.visit(statement)
        self._class_body.pop()
        self._class.pop()

    def visit_FunctionDef(self, node):
        scope = Scope(node, self.scope, self._class[-1] if self._class_body[-1] else None)
        arguments = arguments_of(node)
        scope.parameters = [argument.arg for argument in arguments]
        for argument in arguments:
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            named = strategy_word(argument.arg) or annotation.endswith("Strategy")
            if (named and (node.lineno, argument.arg) not in self.declined) or (
                node.lineno,
                argument.arg,
            ) in self.received:
                scope.strategy_names[argument.arg] = node.lineno
                scope.received = True
        self.scopes.append(scope)
        if self.scope is self.module and not self._class:
            self.functions[node.name] = scope
        self.all_functions[node.name].append(scope)
        self._stack.append(scope)
        self._class_body.append(False)
        blocks, self._strategy_blocks = self._strategy_blocks, 0
        for statement in node.body:
            self.visit(statement)
        self._strategy_blocks = blocks
        self._class_body.pop()
        self._stack.pop()
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Return(self, node):
        if node.value is not None and self.scope is not self.module:
            self.scope.returns.append(node.value)
            if self.is_strategy_value(node.value, node.lineno) and self.scope.name:
                self.strategy_functions.add(self.scope.name)
        self.generic_visit(node)

    # -- facts -------------------------------------------------------------------

    def _assign(self, target, value):
        if self._strategy_blocks and isinstance(value, ast.Call):
            for name in target_names(target):
                self.mark_model(ast.Name(name, ast.Load()), value.lineno)
            if self_attribute(target):
                self.mark_model(target, value.lineno)
        if isinstance(target, (ast.Tuple, ast.List)):
            for name in target_names(target):  # unpacked: where the value goes, not what
                self.scope.assignments[name].append(ast.Tuple([], ast.Load()))
                self.scope.unpacked[name].append(value)
        if isinstance(target, ast.Name):
            if self._class_body[-1]:  # class Config: batch_size = 64
                self.class_values[(self._class[-1], target.id)].append((self.scope, value))
                return
            self.scope.assignments[target.id].append(value)
            # get_strategy() under a strategy's scope returns that strategy
            in_scope = self._strategy_blocks and self.is_default_strategy_call(value)
            if in_scope or self.is_strategy_value(value, value.lineno):
                self.scope.strategy_names.setdefault(target.id, value.lineno)
                self.scope.strategy_lines[target.id].add(value.lineno)
                self.scope.binding_blocks[(target.id, value.lineno)] = tuple(self._blocks)
            else:  # get_strategy(), None: replaces a strategy where it surely runs after
                if self.is_other_strategy_call(value):
                    self.scope.created(value.lineno)
                self.scope.rebindings[target.id].append((value.lineno, tuple(self._blocks)))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            self.scope.unpacked[target.value.id].append(value)  # data["train"] = ds
        elif self_attribute(target) and class_of(self.scope):
            owner = class_of(self.scope)
            self.class_values[(owner, target.attr)].append((self.scope, value))
            bindings = self._attribute_strategies[(owner, target.attr)]
            in_scope = self._strategy_blocks and self.is_default_strategy_call(value)
            if in_scope or self.is_strategy_value(value, value.lineno):
                self.class_strategy_attrs[owner].add(target.attr)
                self.scope.created(value.lineno)
                bindings.append((self.scope, value.lineno, tuple(self._blocks)))
            elif bindings:
                blocks = tuple(self._blocks)
                bindings[:] = [
                    (scope, line, where)
                    for scope, line, where in bindings
                    if scope is not self.scope or where[: len(blocks)] != blocks
                ]
                if not bindings:  # self.strategy = tf.distribute.get_strategy() after it
                    self.class_strategy_attrs[owner].discard(target.attr)

    def _visit_value(self, node, targets):
        self._targets.append(frozenset(set().union(*(target_names(t) for t in targets))))
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

    def _branch(self, node, part: str, statements) -> None:
        self._blocks.append((id(node), part))
        for statement in statements:
            self.visit(statement)
        self._blocks.pop()

    def visit_For(self, node):
        # for x, y in ds: elements pulled out of a dataset (to NumPy, to a plot) are not
        # the batches a strategy splits; the names are of unknown value.
        for name in target_names(node.target):
            self.scope.assignments[name].append(ast.Tuple([], ast.Load()))
        self.visit(node.target)
        self.visit(node.iter)
        self._branch(node, "body", node.body)
        self._branch(node, "else", node.orelse)

    visit_AsyncFor = visit_For

    def visit_While(self, node):
        self.visit(node.test)
        self._branch(node, "body", node.body)
        self._branch(node, "else", node.orelse)

    def visit_If(self, node):
        self.visit(node.test)
        self._branch(node, "body", node.body)
        self._branch(node, "else", node.orelse)

    def visit_Try(self, node):
        # ``else`` runs right after the body; ``finally`` after whichever branch ran.
        self._branch(node, "body", [*node.body, *node.orelse])
        for index, handler in enumerate(node.handlers):
            self._branch(node, f"except {index}", [handler])
        for statement in node.finalbody:
            self.visit(statement)

    visit_TryStar = visit_Try

    def visit_Match(self, node):
        self.visit(node.subject)
        for index, case in enumerate(node.cases):
            self._branch(node, f"case {index}", [case])

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
            named = strategy_word(owner.id)
            if (self.scope.node.lineno, owner.id) in self.declined:
                named = False
            if owner.id not in self.scope.strategy_names and not named:
                return False
            self.scope.strategy_names.setdefault(owner.id, self.scope.node.lineno)
            self.scope.received = True
            return True
        return False

    def visit_With(self, node):
        strategy = any(self._strategy_scope(item.context_expr) for item in node.items)
        for item in node.items:
            self.visit(item)
        self._strategy_blocks += strategy
        for statement in node.body:
            self.visit(statement)
        self._strategy_blocks -= strategy

    visit_AsyncWith = visit_With

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

    def _option(self, node: ast.Call) -> None:
        """``parser.add_argument("--batch-size", default=64)``, ``flags.DEFINE_integer(
        "batch_size", 64, ...)``: an option and its default."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else ""
        texts = [a.value for a in node.args if isinstance(a, ast.Constant)]
        texts = [text for text in texts if isinstance(text, str)]
        default = keyword_value(node, "default")
        if name == "add_argument":
            longs = [t for t in texts if t.startswith("--")] or [
                t for t in texts if t.startswith("-")
            ]
            dest = keyword_value(node, "dest")
            if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
                self.options[dest.value] = default
            elif longs:
                self.options[longs[0].lstrip("-").replace("-", "_")] = default
        elif name.startswith("DEFINE_") and texts and node.args:
            if default is None and len(node.args) > 1:
                default = node.args[1]
            self.options[texts[0]] = default

    def visit_Call(self, node):
        if self.is_strategy_call(node):
            self.scope.created(node.lineno)
        self.scope.calls.append(node)
        self._option(node)
        for name in self.run_under_strategy(node):
            self.scoped_functions.add(name)
            self.runner_calls.setdefault(name, node)
        func = node.func
        if self._strategy_blocks:
            if isinstance(func, ast.Attribute) and func.attr == "compile":
                self.mark_model(func.value, node.lineno)
            elif isinstance(func, ast.Name):
                self.scoped_functions.add(func.id)
        qualified = self.qualified(func) or ""
        if not qualified.startswith(OTHER_SPLITTERS) and not self._per_replica_shape(node):
            size, code = self._batch_size(node)
            if size is not None:
                self.scope.batch_sites.append(Site(size, node, code, self._targets[-1]))
                if self._windows:
                    self.window_calls.add(id(node))
        if qualified.split(".")[-1] in OPTIMIZERS:
            rate = keyword_value(node, "learning_rate") or keyword_value(node, "lr")
            rate = rate if rate is not None else (node.args[0] if node.args else None)
            if rate is not None:
                self.scope.learning_rates.append(rate)
        window = isinstance(func, ast.Attribute) and func.attr in WINDOW_METHODS
        if window:
            self.window_functions.update(a.id for a in node.args if isinstance(a, ast.Name))
        self.visit(func)
        self._windows += window
        for argument in [*node.args, *node.keywords]:
            self.visit(argument)
        self._windows -= window
