"""The static KDP checks on snippets (true positives and negatives), notebooks, noqa,
syntax errors, the CLI and the flake8 plugin. Only parsed: nothing here is run."""

import subprocess
import sys
import textwrap

import nbformat
import pytest

from keras_dp_tools.checks.lint import check_source, lint_paths
from tests.helpers.processes import run_cli

TF = "import tensorflow as tf\n"
MIRRORED = TF + "strategy = tf.distribute.MirroredStrategy()\n"

# Each batch provably reaches what a synchronous strategy splits (issue 37: a strategy
# merely existing earlier is not enough; the data must be distributed).
DIST = "dist = strategy.experimental_distribute_dataset(ds)\n"
POSITIVE = {
    "literal in batch": MIRRORED + "ds = tf.data.Dataset.range(9).batch(64)\n" + DIST,
    "name bound to a literal": MIRRORED + "BATCH = 64\nds = ds.batch(BATCH)\n" + DIST,
    "annotated assignment": MIRRORED + "BATCH: int = 64\nds = ds.batch(BATCH)\n" + DIST,
    "constant expression": MIRRORED + "B = 32\nds = ds.batch(B * 2)\n" + DIST,
    "chained dataset calls": MIRRORED
    + "ds = ds.map(f).shuffle(100).batch(128).prefetch(2)\n"
    + DIST,
    "padded_batch": MIRRORED + "ds = ds.padded_batch(32, padded_shapes=[None])\n" + DIST,
    "from tensorflow import distribute": (
        "from tensorflow import distribute\nstrategy = distribute.MirroredStrategy()\n"
        "ds = ds.batch(64)\n" + DIST
    ),
    "class imported under another name": (
        "from tensorflow.distribute import MirroredStrategy as MS\nstrategy = MS()\n"
        "ds = ds.batch(64)\n" + DIST
    ),
    "module alias of tensorflow.distribute": (
        "import tensorflow.distribute as tfd\nstrategy = tfd.MirroredStrategy()\n"
        "ds = ds.batch(64)\n" + DIST
    ),
    "tensorflow without alias": (
        "import tensorflow\nstrategy = tensorflow.distribute.MirroredStrategy()\n"
        "ds = ds.batch(8)\n" + DIST
    ),
    "multi-worker strategy": (
        TF + "strategy = tf.distribute.MultiWorkerMirroredStrategy()\nds = ds.batch(64)\n" + DIST
    ),
    "experimental multi-worker strategy": (
        TF + "strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()\n"
        "ds = ds.batch(64)\n" + DIST
    ),
    "keras_dp_tools helper": (
        "import keras_dp_tools as kdt\nstrategy = kdt.mirrored_strategy(4)\n"
        "ds = ds.batch(128)\n" + DIST
    ),
    "dataset helper whose result is distributed": (
        MIRRORED + "def make_dataset():\n    return tf.data.Dataset.range(9).batch(64)\n"
        "dist = strategy.experimental_distribute_dataset(make_dataset())\n"
    ),
    "strategy passed to another function": (
        TF + "def make(ds, dist):\n    return dist.experimental_distribute_dataset(ds.batch(32))\n"
        "def main():\n    s = tf.distribute.MirroredStrategy()\n    make(ds, s)\n"
    ),
    "strategy passed by keyword": (
        TF + "def make(ds, dist=None):\n"
        "    return dist.experimental_distribute_dataset(ds.batch(32))\n"
        "def main():\n    s = tf.distribute.MirroredStrategy()\n    make(ds, dist=s)\n"
    ),
    "parameter named strategy": (
        "def build(strategy, ds):\n    return strategy.experimental_distribute_dataset("
        "ds.batch(16))\n"
    ),
    "parameter annotated as a Strategy": (
        TF + "def build(s: tf.distribute.Strategy, ds):\n"
        "    return s.experimental_distribute_dataset(ds.batch(16))\n"
    ),
    "a model built under a received strategy's scope": (
        "def build(dist_strategy, ds):\n    with dist_strategy.scope():\n"
        "        model = make_model()\n    model.fit(ds.batch(8))\n"
    ),
    "strategy on self": (
        TF + "class Trainer:\n    def __init__(self):\n"
        "        self.strategy = tf.distribute.MirroredStrategy()\n"
        "    def data(self, ds):\n        with self.strategy.scope():\n"
        "            self.model = make_model()\n"
        "        self.model.fit(ds.batch(32))\n"
    ),
    "nested input function": (
        TF + "def main():\n    strategy = tf.distribute.MirroredStrategy()\n"
        "    def input_fn():\n        return ds.batch(64)\n"
        "    return strategy.experimental_distribute_dataset(input_fn())\n"
    ),
    "image_dataset_from_directory": (
        MIRRORED + 'ds = tf.keras.utils.image_dataset_from_directory("d", batch_size=32)\n' + DIST
    ),
}

NEGATIVE = {
    "tutorial: per replica times replicas": (
        MIRRORED + "BATCH_SIZE_PER_REPLICA = 64\n"
        "BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync\n"
        "train = mnist_train.map(scale).cache().shuffle(10000).batch(BATCH_SIZE)\n"
    ),
    "replicas first": MIRRORED + "ds.batch(strategy.num_replicas_in_sync * 64)\n",
    "kdt.scale_batch_size": (
        MIRRORED + "import keras_dp_tools as kdt\nds.batch(kdt.scale_batch_size(64, strategy))\n"
    ),
    "imported scale_batch_size": (
        MIRRORED + "from keras_dp_tools import scale_batch_size\n"
        "ds.batch(scale_batch_size(64, strategy))\n"
    ),
    "tutorial: per-replica batch from the input context": (
        MIRRORED + "GLOBAL = 64 * strategy.num_replicas_in_sync\n"
        "def dataset_fn(input_context):\n"
        "    batch_size = input_context.get_per_replica_batch_size(GLOBAL)\n"
        "    return ds.shard(2, 0).batch(batch_size)\n"
        "dist = strategy.distribute_datasets_from_function(dataset_fn)\n"
    ),
    "no strategy anywhere": TF + "ds = tf.data.Dataset.range(9).batch(64)\n",
    "batch size is a parameter": MIRRORED
    + "def make(ds, batch_size):\n    return ds.batch(batch_size)\n",
    "batch size from arguments": MIRRORED + "ds.batch(args.batch_size)\n",
    "multiplied in place": MIRRORED + "B = 64\nB *= strategy.num_replicas_in_sync\nds.batch(B)\n",
    "int() of a scaled value": MIRRORED + "ds.batch(int(32 * strategy.num_replicas_in_sync))\n",
    "replica count in a variable": (
        MIRRORED
        + "n = strategy.num_replicas_in_sync\nper_replica = 64\nds.batch(per_replica * n)\n"
    ),
    "plan from plan_scaling": (
        MIRRORED + "import keras_dp_tools as kdt\n"
        "plan = kdt.plan_scaling(strategy, 64, base_lr=0.1, base_batch=256)\n"
        "ds.batch(plan.global_batch)\n"
    ),
    "strategy in an unrelated function": (
        TF + "def train():\n    s = tf.distribute.MirroredStrategy()\n"
        "def evaluate(ds):\n    return ds.batch(64)\n"
    ),
    "a batch made after the strategy that never reaches it": (
        MIRRORED + "ds = tf.data.Dataset.range(9).batch(64)\nplain_model.fit(ds)\n"
    ),
    "a product of numbers: a total worked out by hand": (
        MIRRORED + "ds = ds.batch(32 * 8)\n" + DIST
    ),
    "the default strategy (one replica)": TF
    + "strategy = tf.distribute.get_strategy()\nds = ds.batch(64)\n"
    + DIST,
    "single-device strategy": TF
    + "strategy = tf.distribute.OneDeviceStrategy('/gpu:0')\nds = ds.batch(64)\n"
    + DIST,
    "a string batch argument is not a size": MIRRORED + "ds.batch(size)\n",
}


@pytest.mark.parametrize("snippet", POSITIVE.values(), ids=POSITIVE.keys())
def test_unscaled_batches_are_flagged(snippet):
    assert [v.code for v in check_source(snippet)] == ["KDP001"]


# fit/evaluate/predict take the global batch: a constant may be meant (KDP003, not KDP001).
BUILT = MIRRORED + "with strategy.scope():\n    model = make_model()\n"
GLOBAL_BATCH = {
    "fit batch_size keyword": BUILT + "model.fit(x, y, batch_size=64)\n",
    "evaluate batch_size keyword": BUILT + "model.evaluate(x, y, batch_size=64)\n",
    "keras-io style fit": (
        TF + "strategy = tf.distribute.MirroredStrategy()\nbatch_size = 64\n"
        "with strategy.scope():\n    model = make_model()\n"
        "model.fit(x_train, y_train, batch_size=batch_size, epochs=2)\n"
    ),
}


@pytest.mark.parametrize("snippet", GLOBAL_BATCH.values(), ids=GLOBAL_BATCH.keys())
def test_constant_fit_batch_sizes_have_their_own_code(snippet):
    assert [v.code for v in check_source(snippet)] == ["KDP003"]
    scaled = snippet.replace("batch_size=64", "batch_size=64 * strategy.num_replicas_in_sync")
    scaled = scaled.replace("batch_size = 64", "batch_size = 64 * strategy.num_replicas_in_sync")
    assert check_source(scaled) == []


@pytest.mark.parametrize("snippet", NEGATIVE.values(), ids=NEGATIVE.keys())
def test_scaled_or_unrelated_batches_are_not_flagged(snippet):
    assert check_source(snippet) == []


def test_violation_points_at_the_batch_value():
    (violation,) = check_source(MIRRORED + "ds = ds.shuffle(9).batch(64)\n" + DIST)
    assert (violation.line, violation.col) == (3, 25)
    assert "64 * strategy.num_replicas_in_sync" in violation.message


SCALED_BATCH = MIRRORED + "ds.batch(64 * strategy.num_replicas_in_sync)\n"
LR_CASES = {
    "Adam keyword": ("opt = tf.keras.optimizers.Adam(learning_rate=1e-3)\n", ["KDP002"]),
    "SGD positional": ("opt = tf.keras.optimizers.SGD(0.1)\n", ["KDP002"]),
    "rate through a name": ("lr = 0.1\nopt = keras.optimizers.SGD(learning_rate=lr)\n", ["KDP002"]),
    "scaled rate": (
        "opt = tf.keras.optimizers.SGD(0.1 * strategy.num_replicas_in_sync)\n",
        [],
    ),
    "kdt.scale_learning_rate": (
        "opt = tf.keras.optimizers.SGD(kdt.scale_learning_rate(0.1, 1024, 256))\n",
        [],
    ),
    "a schedule": ("opt = tf.keras.optimizers.SGD(learning_rate=schedule)\n", []),
}


@pytest.mark.parametrize("case", LR_CASES.values(), ids=LR_CASES.keys())
def test_constant_learning_rate_next_to_a_scaled_batch(case):
    source, expected = case
    assert [v.code for v in check_source(SCALED_BATCH + source)] == expected


def test_constant_learning_rate_without_a_scaled_batch_is_not_kdp002():
    source = MIRRORED + "ds = ds.batch(64)\n" + DIST + "opt = tf.keras.optimizers.Adam(1e-3)\n"
    assert [v.code for v in check_source(source)] == ["KDP001"]


def test_syntax_errors_are_reported_not_raised(tmp_path):
    (violation,) = check_source("def broken(:\n    pass\n")
    assert violation.code == "KDP900" and violation.line == 1

    path = tmp_path / "broken.py"
    path.write_text("x = (\n")
    assert [str(r).split(": ")[1].split()[0] for r in lint_paths([tmp_path])] == ["KDP900"]


def test_noqa_comments_are_respected(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(
        MIRRORED
        + "a = ds.batch(64)  # noqa: KDP001\n"
        + "b = ds.batch(64)  # noqa\n"
        + "c = ds.batch(64)  # noqa: E501\n"
        + "d = ds.batch(64)  # NOQA:E501,kdp001\n"
        + "dist = strategy.experimental_distribute_dataset(a.concatenate(b).concatenate(c))\n"
        + "dist = strategy.experimental_distribute_dataset(d)\n"
    )
    reports = list(lint_paths([path]))
    assert [r.location for r in reports] == ["5:14"]


def write_notebook(path, *cells):
    notebook = nbformat.v4.new_notebook()
    for kind, source in cells:
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        notebook.cells.append(make(source))
    nbformat.write(notebook, str(path))


def test_notebooks_are_checked_across_cells_with_magics_ignored(tmp_path):
    path = tmp_path / "train.ipynb"
    write_notebook(
        path,
        ("code", "%matplotlib inline\n!pip install foo\n" + MIRRORED),
        ("markdown", "Batch the data (`ds.batch(64)` here is prose)"),
        ("code", "%%writefile data.txt\nds.batch(64)\n"),  # a cell magic: not Python
        (
            "code",
            "ds = ds.shuffle(10)\nds = ds.batch(64)\nother = ds.batch(32)  # noqa: KDP001\n"
            + "dist = strategy.experimental_distribute_dataset(ds)\n"
            + "dist2 = strategy.experimental_distribute_dataset(other)\n",
        ),
    )
    reports = [str(report) for report in lint_paths([tmp_path])]
    assert reports == [f"{path}:cell_3:2:15: KDP001 " + reports[0].split(" KDP001 ")[1]]


def test_not_a_notebook_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.ipynb"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not a Jupyter notebook"):
        list(lint_paths([path]))


@pytest.fixture
def project(tmp_path):
    (tmp_path / "good.py").write_text(NEGATIVE["tutorial: per replica times replicas"])
    (tmp_path / "bad.py").write_text(POSITIVE["literal in batch"])
    (tmp_path / "lr.py").write_text(SCALED_BATCH + LR_CASES["Adam keyword"][0])
    hidden = tmp_path / ".venv"
    hidden.mkdir()
    (hidden / "skipped.py").write_text(POSITIVE["literal in batch"])
    return tmp_path


def test_cli_prints_flake8_style_lines_and_exit_codes(project):
    result = run_cli("lint", str(project))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == [
        f"{project}/bad.py:3:37",
        f"{project}/lr.py:4:46",
    ]
    assert [line.split(": ")[1].split()[0] for line in lines] == ["KDP001", "KDP002"]

    assert run_cli("lint", str(project), "--ignore", "KDP001,KDP002").returncode == 0
    assert run_cli("lint", str(project), "--exit-zero").returncode == 0
    assert run_cli("lint", str(project / "good.py")).stdout == ""


def test_cli_names_a_missing_path():
    result = run_cli("lint", "does/not/exist.py")
    assert result.returncode == 2
    assert "No such file or directory: does/not/exist.py" in result.stderr


def test_flake8_runs_the_plugin(project):
    bad = textwrap.dedent(POSITIVE["literal in batch"]) + "ds.batch(32)  # noqa: KDP001\n"
    (project / "bad.py").write_text(bad)
    result = subprocess.run(
        [sys.executable, "-m", "flake8", "--select", "KDP", str(project / "bad.py")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{project}/bad.py:3:37: KDP001 " + result.stdout.split(" KDP001 ")[1].splitlines()[0]
    ]


def test_our_own_examples_demo_and_notebooks_are_clean():
    from tests.helpers import REPO

    paths = [REPO / "examples", REPO / "notebooks", REPO / "keras_dp_tools" / "tools" / "demo.py"]
    assert [str(report) for report in lint_paths(paths)] == []
