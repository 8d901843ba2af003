"""Batch sizes followed through helper functions and imports (KDP001), fit's global
batch (KDP003), JSON output and exit codes: a real project on disk, checked by
``keras-dp lint`` and by a real flake8 process, with the expected places read from
marker comments in the files (``# CALL:<case>``, ``# BATCH:<name>``), not from the
checker."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from keras_dp_tools.checks.lint import SEVERITIES, check_source
from keras_dp_tools.checks.lint.checker import MAX_CALL_DEPTH
from keras_dp_tools.common.severity import Severity
from tests.helpers.processes import run_cli

FILES = {
    "config.py": "BATCH = 48\n",
    "data.py": """
        import tensorflow as tf


        def make_dataset(batch, shuffle=100):
            ds = tf.data.Dataset.range(1000).shuffle(shuffle)
            return ds.batch(batch)  # BATCH:data


        def wrap(size):
            return make_dataset(size * 2)  # VIA:wrap


        def make_eval(batch=256):  # DEFAULT:eval
            return tf.data.Dataset.range(10).batch(batch)  # BATCH:eval


        def fixed():
            return tf.data.Dataset.range(10).batch(16)  # BATCH:fixed


        def train_model(model, batch_size):
            return model.fit(x, y, batch_size=batch_size)  # BATCH:fit
        """,
    "pkg/__init__.py": "from .data import make_pkg_dataset as make_batches\n",
    "pkg/data.py": """
        def make_pkg_dataset(ds, batch, drop=False):
            return ds.batch(batch, drop_remainder=drop)  # BATCH:pkg
        """,
    "pkg/train_relative.py": """
        import tensorflow as tf

        from .data import make_pkg_dataset

        strategy = tf.distribute.MirroredStrategy()
        ds = make_pkg_dataset(ds, 24)  # CALL:relative-import
        dist = strategy.experimental_distribute_dataset(ds)
        """,
    "evaluate.py": """
        from data import make_dataset

        ds = make_dataset(64)  # no strategy here or in make_dataset: clean
        """,
    "train.py": """
        import tensorflow as tf

        import data
        import keras_dp_tools as kdt
        import pkg
        from config import BATCH
        from data import fixed, make_dataset, make_eval, train_model, wrap
        from pkg.data import make_pkg_dataset

        PER_REPLICA = 32
        strategy = tf.distribute.MirroredStrategy()


        def make_local(batch):
            return ds.batch(batch)  # BATCH:local


        def make_mixed(ds, batch, drop=False):
            return ds.batch(batch, drop_remainder=drop)  # BATCH:mixed


        def make_default(ds, batch=64):  # DEFAULT:local
            return ds.batch(batch)  # BATCH:default


        def dist(data):
            return strategy.experimental_distribute_dataset(data)


        def main(args):
            with strategy.scope():
                model = make_model()
            dist(make_local(64))  # CALL:literal
            dist(make_local(PER_REPLICA))  # CALL:module-constant
            dist(make_local(batch=64))  # CALL:keyword
            dist(make_default(ds))  # CALL:default
            dist(make_mixed(ds, 16, drop=True))  # CALL:mixed
            dist(data.make_dataset(64))  # CALL:import-module
            dist(make_dataset(BATCH))  # CALL:imported-constant
            dist(make_pkg_dataset(ds, 8, drop=True))  # CALL:package
            dist(pkg.make_batches(ds, 4))  # CALL:re-export
            dist(wrap(8))  # CALL:two-levels
            dist(make_eval())  # CALL:imported-default
            dist(fixed())  # CALL:constant-inside
            train_model(model, 128)  # CALL:fit-helper
            model.fit(x, y, batch_size=64)  # CALL:fit-direct
            # Negative cases: scaled, of unknown origin, silenced, splatted, not distributed.
            dist(make_local(64 * strategy.num_replicas_in_sync))
            dist(make_local(args.batch_size))
            dist(data.make_dataset(kdt.scale_batch_size(64, strategy)))
            dist(make_default(ds, batch=PER_REPLICA * strategy.num_replicas_in_sync))
            dist(make_local(64))  # noqa: KDP001
            dist(make_mixed(ds, *sizes))
            make_local(64)
        """,
}
NOTEBOOK_CELLS = [
    ("code", "%matplotlib inline\nimport tensorflow as tf\nfrom data import make_dataset\n"),
    ("markdown", "Make the data (`make_dataset(64)` in prose is not code)"),
    (
        "code",
        "strategy = tf.distribute.MirroredStrategy()\nds = make_dataset(64)\n"
        "dist = strategy.experimental_distribute_dataset(ds)\n",
    ),
]
# case -> (code, the batch it reaches as (file, marker), the default it uses or None)
EXPECTED = {
    "literal": ("KDP001", ("train.py", "BATCH:local"), None),
    "module-constant": ("KDP001", ("train.py", "BATCH:local"), None),
    "keyword": ("KDP001", ("train.py", "BATCH:local"), None),
    "default": ("KDP001", ("train.py", "BATCH:default"), ("train.py", "DEFAULT:local")),
    "mixed": ("KDP001", ("train.py", "BATCH:mixed"), None),
    "import-module": ("KDP001", ("data.py", "BATCH:data"), None),
    "imported-constant": ("KDP001", ("data.py", "BATCH:data"), None),
    "package": ("KDP001", ("pkg/data.py", "BATCH:pkg"), None),
    "re-export": ("KDP001", ("pkg/data.py", "BATCH:pkg"), None),
    "two-levels": ("KDP001", ("data.py", "BATCH:data"), None),
    "imported-default": ("KDP001", ("data.py", "BATCH:eval"), ("data.py", "DEFAULT:eval")),
    "constant-inside": ("KDP001", ("data.py", "BATCH:fixed"), None),
    "fit-helper": ("KDP003", ("data.py", "BATCH:fit"), None),
    "fit-direct": ("KDP003", None, None),
    "relative-import": ("KDP001", ("pkg/data.py", "BATCH:pkg"), None),
}


def marker_line(root: Path, name: str, marker: str) -> int:
    lines = (root / name).read_text().splitlines()
    (number,) = [n for n, line in enumerate(lines, 1) if line.endswith(f"# {marker}")]
    return number


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "src"
    for name, source in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(source).lstrip())
    notebook = nbformat.v4.new_notebook()
    for kind, source in NOTEBOOK_CELLS:
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        notebook.cells.append(make(source))
    nbformat.write(notebook, str(root / "explore.ipynb"))
    return root


def expected_findings(root: Path) -> dict:
    """(file, line, code) -> (case, batch line, default line), from the markers. A default
    of the same file is reported where it is written (the constant to fix), any other
    value at the call where it enters."""
    found = {}
    for case, (code, batch, default) in EXPECTED.items():
        name = "pkg/train_relative.py" if case == "relative-import" else "train.py"
        line = marker_line(root, name, f"CALL:{case}")
        batch_at = (batch[0], marker_line(root, *batch)) if batch else None
        default_at = (default[0], marker_line(root, *default)) if default else None
        if default_at is not None and default_at[0] == name:
            line = default_at[1]
        found[(name, line, code)] = (case, batch_at, default_at)
    return found


def call_line(root: Path, name: str, case: str) -> int:
    return marker_line(root, name, f"CALL:{case}")


def lint_json(root: Path, *options: str) -> tuple[int, list[dict]]:
    result = run_cli("lint", str(root), "--format", "json", *options)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def run_flake8(root: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flake8", "--select", "KDP", *options, "."],
        capture_output=True,
        text=True,
        cwd=root,
    )


def flake8_findings(result) -> list[tuple[str, int, int, str, str]]:
    findings = []
    for line in result.stdout.splitlines():
        path, number, col, rest = line.split(":", 3)
        code, message = rest.strip().split(" ", 1)
        findings.append((str(Path(path)), int(number), int(col), code, message))
    return findings


def assert_names_places(message, case, call_line, batch_at, default_at, same_file):
    """A followed value's message names the call site, the batch(...) line it reaches,
    and the default it uses."""
    if batch_at is None:  # found in place: the line itself is the report's location
        return
    assert f"at line {call_line}" in message, (case, message)
    file, line = batch_at
    assert (f"at line {line}" if file == same_file else f"{file}:{line}") in message, (
        case,
        message,
    )
    if default_at is not None:
        file, line = default_at
        assert (f"line {line}" if file == same_file else f"{file}:{line}") in message, case


def test_helpers_and_imports_are_followed_by_keras_dp_lint(project):
    expected = expected_findings(project)
    status, findings = lint_json(project)
    assert status == 1
    python = {
        (str(Path(f["path"]).relative_to(project)), f["line"], f["code"]): f
        for f in findings
        if f["cell"] is None
    }
    assert set(python) == set(expected)
    for (name, line, code), (case, batch_at, default_at) in expected.items():
        finding = python[(name, line, code)]
        assert finding["severity"] == str(SEVERITIES[code])
        called = call_line(project, name, case)
        assert_names_places(finding["message"], case, called, batch_at, default_at, name)
        if batch_at is not None:  # the batch(...) line is a related place, path and line
            assert any(
                related["path"].endswith(batch_at[0]) and related["line"] == batch_at[1]
                for related in finding["related"]
            ), (case, finding["related"])
    (notebook,) = [f for f in findings if f["cell"] is not None]
    assert (notebook["path"], notebook["cell"], notebook["line"]) == (
        str(project / "explore.ipynb"),
        2,  # code cells counted from 1: the markdown cell does not count
        2,
    )
    assert notebook["col"] == len("ds = make_dataset(") + 1
    assert "make_dataset() at cell_2:2" in notebook["message"]
    assert f"data.py:{marker_line(project, 'data.py', 'BATCH:data')}" in notebook["message"]


def test_flake8_finds_the_same_places_as_keras_dp_lint(project):
    _, findings = lint_json(project)
    ours = {
        (str(Path(f["path"]).relative_to(project)), f["line"], f["col"], f["code"])
        for f in findings
        if f["cell"] is None
    }
    result = run_flake8(project)
    assert result.returncode == 1, result.stderr
    theirs = flake8_findings(result)
    assert {(path, line, col, code) for path, line, col, code, _ in theirs} == ours
    expected = expected_findings(project)
    assert {(path, line, code) for path, line, _, code, _ in theirs} == set(expected)
    for path, line, _, code, message in theirs:
        case, batch_at, default_at = expected[(path, line, code)]
        called = call_line(project, path, case)
        assert_names_places(message, case, called, batch_at, default_at, path)


def test_the_literal_is_the_place_reported(project):
    _, findings = lint_json(project)
    lines = (project / "train.py").read_text().splitlines()
    for case in ("literal", "keyword", "mixed", "fit-direct"):
        line = marker_line(project, "train.py", f"CALL:{case}")
        (finding,) = [f for f in findings if f["path"].endswith("train.py") and f["line"] == line]
        text = lines[line - 1]
        literal = re.search(r"\b(64|16)\b", text)
        assert finding["col"] == literal.start() + 1, (case, text)


def test_text_output_matches_json(project):
    _, findings = lint_json(project)
    text = run_cli("lint", str(project)).stdout.splitlines()
    rendered = []
    for f in findings:
        where = f"cell_{f['cell']}:" if f["cell"] is not None else ""
        rendered.append(f"{f['path']}:{where}{f['line']}:{f['col']}: {f['code']} {f['message']}")
    assert text == rendered


def test_kdp003_is_silenced_apart_from_kdp001(project):
    expected = expected_findings(project)
    _, findings = lint_json(project, "--ignore", "KDP003")
    codes = {f["code"] for f in findings}
    assert codes == {"KDP001"}
    assert len(findings) == 1 + sum(code == "KDP001" for _, _, code in expected)  # + notebook
    result = run_flake8(project, "--extend-ignore", "KDP001")
    assert {code for *_, code, _ in flake8_findings(result)} == {"KDP003"}


def test_kdp003_message_gives_both_readings():
    snippet = (
        "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n"
        "with strategy.scope():\n    model = make_model()\n"
        "model.fit(x, y, batch_size=64)\nmodel.fit(ds.batch(64))\n"
    )
    fit, batch = check_source(snippet)
    assert (fit.code, fit.severity, batch.code, batch.severity) == (
        "KDP003",
        Severity.WARNING,
        "KDP001",
        Severity.ERROR,
    )
    assert "global batch" in fit.message and "64 / n" in fit.message
    assert "64 * strategy.num_replicas_in_sync" in fit.message and "noqa: KDP003" in fit.message


def test_noqa_at_the_call_site_silences_a_followed_value(tmp_path):
    (tmp_path / "data.py").write_text("def make(ds, b):\n    return ds.batch(b)\n")
    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\nfrom data import make\n"
        "strategy = tf.distribute.MirroredStrategy()\n"
        "a = make(ds, 64)  # noqa: KDP001\nb = make(ds, 32)\n"
        "dist = strategy.experimental_distribute_dataset(a.concatenate(b))\n"
    )
    status, findings = lint_json(tmp_path)
    assert (status, [(f["line"], f["code"]) for f in findings]) == (1, [(5, "KDP001")])
    assert [line.split(": ")[0] for line in run_flake8(tmp_path).stdout.splitlines()] == [
        "./train.py:5:14"
    ]


def chain(depth: int) -> str:
    """A value passed down ``depth`` helpers to a batch(...)."""
    source = "import tensorflow as tf\ndef f1(b):\n    return ds.batch(b)\n"
    for n in range(2, depth + 1):
        source += f"def f{n}(b):\n    return f{n - 1}(b)\n"
    return (
        source + "def main():\n    s = tf.distribute.MirroredStrategy()\n"
        f"    s.experimental_distribute_dataset(f{depth}(64))\n"
    )


def test_calls_are_followed_to_a_bounded_depth():
    assert [v.code for v in check_source(chain(MAX_CALL_DEPTH))] == ["KDP001"]
    assert check_source(chain(MAX_CALL_DEPTH + 1)) == []


def test_recursion_and_import_cycles_end(tmp_path):
    recursive = (
        "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n"
        "def a(n):\n    return b(n).batch(n)\ndef b(n):\n    return a(n)\n"
        "strategy.experimental_distribute_dataset(a(8))\n"
    )
    (violation,) = check_source(recursive)
    assert "a() at line 7" in violation.message and "at line 4" in violation.message
    (tmp_path / "one.py").write_text(
        "from two import helper\nBATCH = 16\ndef make(ds, b):\n    return helper(ds, b)\n"
    )
    (tmp_path / "two.py").write_text(
        "from one import make, BATCH\ndef helper(ds, b):\n    return make(ds, b).batch(b)\n"
    )
    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\nfrom one import make, BATCH\n"
        "s = tf.distribute.MirroredStrategy()\ns.run(step, args=(make(ds, BATCH),))\n"
    )
    _, findings = lint_json(tmp_path)
    assert [(Path(f["path"]).name, f["line"]) for f in findings] == [("train.py", 4)]
    assert "two.py:3" in findings[0]["message"]


def test_unknown_origins_and_strategy_free_callers_stay_clean(tmp_path):
    snippets = {
        "parameter never bound": "import tensorflow as tf\nstrategy = tf.distribute."
        "MirroredStrategy()\ndef make(ds, b):\n    return ds.batch(b)\n",
        "no strategy anywhere": "def make(ds, b):\n    return ds.batch(b)\nmake(ds, 64)\n",
        "strategy in an unrelated function": (
            "import tensorflow as tf\ndef make(b):\n    return ds.batch(b)\n"
            "def train():\n    s = tf.distribute.MirroredStrategy()\n"
            "def evaluate():\n    make(64)\n"
        ),
        "rescaled inside the helper": (
            "import tensorflow as tf\ndef make(b, strategy):\n"
            "    b = b * strategy.num_replicas_in_sync\n    return ds.batch(b)\n"
            "make(64, tf.distribute.MirroredStrategy())\n"
        ),
        "a method is not followed": (
            "import tensorflow as tf\nstrategy = tf.distribute.MirroredStrategy()\n"
            "class Data:\n    def make(self, b):\n        return ds.batch(b)\nData().make(64)\n"
        ),
    }
    for name, snippet in snippets.items():
        assert check_source(snippet) == [], name


def test_exit_codes(tmp_path):
    clean = tmp_path / "clean.py"
    clean.write_text("import tensorflow as tf\nds = tf.data.Dataset.range(8).batch(4)\n")
    result = run_cli("lint", str(clean), "--format", "json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])
    bad_notebook = tmp_path / "bad.ipynb"
    bad_notebook.write_text("{not json")
    result = run_cli("lint", str(bad_notebook))
    assert result.returncode == 2 and "is not a Jupyter notebook" in result.stderr
    result = run_cli("lint", str(clean), "--format", "xml")
    assert result.returncode == 2 and "invalid choice: 'xml'" in result.stderr
