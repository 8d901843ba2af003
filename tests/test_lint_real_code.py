"""The KDP checks on the patterns met in third-party training code (docs/lint-corpus.md),
each written here as a minimal case of our own: for each cause of a wrong report, code
that must be reported and code that must not. Lines to report carry ``# REPORT``; the
expected places are read from those markers, never from the checker."""

import json
import subprocess
import sys

import pytest

from keras_dp_tools.checks.lint import check_source

from .conftest import run_cli

TF = "import tensorflow as tf\n"
MIRRORED = TF + "strategy = tf.distribute.MirroredStrategy()\n"
DIST = "dist = strategy.experimental_distribute_dataset(ds)\n"


def marked(source: str) -> list[int]:
    return [n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# REPORT")]


def reported(source: str) -> list[int]:
    return [violation.line for violation in check_source(source)]


# 1. Scope follows the code: a batch is the strategy's business where it reaches what the
# strategy distributes, or runs after the strategy exists in its scope.
SCOPE = {
    "made before the strategy, given to fit of a model built under its scope": TF
    + "ds = tf.data.Dataset.range(9).batch(64)  # REPORT\n"
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(ds)\n",
    "made in a helper whose result is distributed": TF
    + "def make():\n    return tf.data.Dataset.range(9).batch(64)  # REPORT\n"
    + "def main():\n    strategy = tf.distribute.MirroredStrategy()\n"
    + "    dist = strategy.experimental_distribute_dataset(make())\n",
    "inline strategy scope, batch made earlier in the function": TF
    + "def main():\n    ds = make_ds().batch(12)  # REPORT\n"
    + "    with tf.distribute.MirroredStrategy().scope():\n        model = build()\n"
    + "    model.fit(ds, validation_data=ds)\n",
    "a single-device section above the strategy": TF
    + "ds = tf.data.Dataset.range(9).batch(64)\n"
    + "model.fit(ds)\n"
    + "strategy = tf.distribute.MirroredStrategy()\n",
    "a single-worker dataset built for comparison": TF
    + "single = make_dataset(64)\nsingle_model.fit(single)\n"
    + "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(make_dataset(global_batch_size))\n",
    "fit before the strategy, in a guide's first section": TF
    + "model.fit(x, y, batch_size=32)\n"
    + "strategy = tf.distribute.MirroredStrategy()\n",
    "scope() of something that is not a strategy": TF
    + "def check(ds):\n    with random_tool.scope():\n        pass\n    return ds.batch(8)\n",
}

# 2. Per-replica contracts: these batches are per replica by the API; scaling is wrong.
CONTRACTS = {
    "distribute_datasets_from_function": MIRRORED
    + "def dataset_fn(ctx):\n    return tf.data.Dataset.range(9).batch(16)\n"
    + "dist = strategy.distribute_datasets_from_function(dataset_fn)\n",
    "experimental_ name with a lambda": MIRRORED
    + "dist = strategy.experimental_distribute_datasets_from_function(\n"
    + "    lambda ctx: tf.data.Dataset.range(9).batch(16))\n",
    "Estimator input_fn with RunConfig(train_distribute=...)": MIRRORED
    + "config = tf.estimator.RunConfig(train_distribute=strategy)\n"
    + "def input_fn():\n    return tf.data.Dataset.range(9).batch(10)\n"
    + "estimator = tf.estimator.Estimator(model_fn, config=config)\n"
    + "estimator.train(input_fn=input_fn, steps=10)\n"
    + "estimator.evaluate(input_fn, steps=10)\n",
    "Estimator input_fn through a lambda": MIRRORED
    + "def make(batch):\n    return tf.data.Dataset.range(9).batch(batch)\n"
    + "estimator.train(input_fn=lambda: make(32), steps=10)\n",
    "DatasetCreator and ClusterCoordinator": MIRRORED
    + "def dataset_fn(_):\n    return tf.data.Dataset.range(9).batch(32)\n"
    + "creator = tf.keras.utils.experimental.DatasetCreator(dataset_fn)\n"
    + "def eval_fn():\n    return tf.data.Dataset.range(9).batch(8)\n"
    + "per_worker = coordinator.create_per_worker_dataset(eval_fn)\n",
    "computed from input_context": MIRRORED
    + "def make(input_context):\n"
    + "    size = input_context.get_per_replica_batch_size(64) + 0\n"
    + "    return tf.data.Dataset.range(9).batch(16)\n",
}
CONTRACT_REPORTED = {
    "the same batch, distributed by the strategy instead": MIRRORED
    + "ds = tf.data.Dataset.range(9).batch(16)  # REPORT\n"
    + "dist = strategy.experimental_distribute_dataset(ds)\n",
    "a helper the dataset_fn does not own, called from elsewhere": MIRRORED
    + "def make():\n    return tf.data.Dataset.range(9).batch(16)  # REPORT\n"
    + "def dataset_fn(ctx):\n    return make()\n"
    + "dist = strategy.experimental_distribute_dataset(make())\n",
}

# 3. Stated intent: the code itself treats the value as the global batch.
INTENT = {
    "a name that says global": MIRRORED + "GLOBAL_BATCH = 64\nds.batch(GLOBAL_BATCH)\n",
    "global_batch_size in a helper's parameter": MIRRORED
    + "def make(global_batch_size):\n    return ds.batch(global_batch_size)\nmake(64)\n",
    "divided by the replica count elsewhere": MIRRORED
    + "batch_size = 64\nds = ds.batch(batch_size)\n"
    + "per_replica = batch_size // strategy.num_replicas_in_sync\n",
    "divided by a core count": MIRRORED
    + "BATCH = 1024\nds.batch(BATCH)\nper_core = BATCH / NUM_CORES\n",
    "given as compute_average_loss's global_batch_size": MIRRORED
    + "B = 64\nds.batch(B)\n"
    + "loss = tf.nn.compute_average_loss(losses, global_batch_size=B)\n",
    "a comment on its definition": MIRRORED
    + "BATCH = 256  # the global batch, across all replicas\nds.batch(BATCH)\n",
    "the literal the scope names the global batch": MIRRORED
    + "global_batch_size = 64\nds = make_dataset(batch_size=64)\n",
}
INTENT_REPORTED = {
    "a comment that says per replica": MIRRORED
    + "BATCH = 256  # per replica\nds = ds.batch(BATCH)  # REPORT\n"
    + DIST,
    "a global name for something else": MIRRORED
    + "global_step = 100\nds = ds.batch(100)  # REPORT\n"
    + DIST,
}

# 4. Not tf.distribute: other ways to split a batch are not this rule's business.
OTHER_SPLITTERS = {
    "a PyTorch DataLoader next to a strategy": MIRRORED
    + "import torch\nloader = torch.utils.data.DataLoader(data, batch_size=64)\n",
    "a DTensor layout map scope": TF
    + "from tensorflow.experimental import dtensor\n"
    + "mesh = dtensor.create_mesh([('batch', 8)], devices=devices)\n"
    + "layout_map = tf.keras.dtensor.experimental.LayoutMap(mesh=mesh)\n"
    + "with layout_map.scope():\n    model = build()\n"
    + "ds = ds.batch(128)\nmodel.fit(ds)\n",
    "a JAX pmap batch": MIRRORED
    + "import jax\nfrom jax.experimental import pjit\n"
    + "batches = jax.numpy.reshape(x, (8, 32, -1))\n"
    + "step = jax.pmap(train_step)\nloader = jax_utils.prefetch(batch_size=32)\n",
}
OTHER_SPLITTERS_REPORTED = {
    "the tf.distribute batch of a file that also uses PyTorch": MIRRORED
    + "import torch\nloader = torch.utils.data.DataLoader(data, batch_size=64)\n"
    + "ds = tf.data.Dataset.range(9).batch(64)  # REPORT\n"
    + DIST,
}

# 5. Other batching calls, where real code hides the same mistake.
BATCHING_CALLS_REPORTED = {
    "dense_to_ragged_batch": MIRRORED
    + "ds = ds.apply(tf.data.experimental.dense_to_ragged_batch(32))  # REPORT\n"
    + DIST,
    "ragged_batch": MIRRORED + "ds = ds.ragged_batch(32)  # REPORT\n" + DIST,
    "bucket_by_sequence_length": MIRRORED
    + "ds = ds.bucket_by_sequence_length(length, [10, 20], [32, 32, 32])  # REPORT\n"
    + DIST,
    "experimental bucket_by_sequence_length by keyword": MIRRORED
    + "f = tf.data.experimental.bucket_by_sequence_length(\n"
    + "    length, bucket_boundaries=[10], bucket_batch_sizes=[16, 16])  # REPORT\n"
    + "ds = ds.apply(f)\n"
    + DIST,
    "a keras.utils.Sequence with a batch size, given to fit": TF
    + "class Batches(tf.keras.utils.Sequence):\n"
    + "    def __init__(self, x, y, batch_size):\n        self.batch_size = batch_size\n"
    + "BATCH = 256\n"
    + "train = Batches(x, y, BATCH)  # REPORT\n"
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(train)\n",
    "a PyDataset subclass, batch size by keyword": MIRRORED
    + "class Frames(keras.utils.PyDataset):\n"
    + "    def __init__(self, paths, batch_size=32, **kwargs):\n        pass\n"
    + "frames = Frames(paths, batch_size=64)  # REPORT\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(frames)\n",
}
BATCHING_CALLS = {
    "a scaled ragged batch": MIRRORED
    + "ds = ds.ragged_batch(32 * strategy.num_replicas_in_sync)\n",
    "scaled bucket sizes": MIRRORED
    + "n = strategy.num_replicas_in_sync\n"
    + "ds = ds.bucket_by_sequence_length(length, [10], [32 * n, 32 * n])\n",
    "a Sequence given a scaled batch": MIRRORED
    + "class Batches(tf.keras.utils.Sequence):\n"
    + "    def __init__(self, x, batch_size):\n        pass\n"
    + "train = Batches(x, 64 * strategy.num_replicas_in_sync)\n",
    "a Keras Input's batch_size (the shape each replica sees)": MIRRORED
    + "inputs = tf.keras.Input(shape=(4,), batch_size=16)\n"
    + "make_input = tf.keras.layers.Input\nother = make_input(shape=(4,), batch_size=16)\n",
}

# 6. One finding per line.
ONE_PER_LINE_REPORTED = {
    "a literal given to a helper's batch_size keyword": MIRRORED
    + "def make(batch_size):\n    return ds.batch(batch_size)\n"
    + "train = make(batch_size=64)  # REPORT\n"
    + "dist = strategy.experimental_distribute_dataset(train)\n",
}
ONE_PER_LINE = {
    "a helper that scales its batch_size keyword itself": MIRRORED
    + "def make(batch_size, strategy):\n"
    + "    return ds.batch(batch_size * strategy.num_replicas_in_sync)\n"
    + "train = make(batch_size=64, strategy=strategy)\n",
}
# Issue 37: the causes of wrong reports on code the rules had not seen. For each, code
# that must be reported and code that must not.
BUILT = MIRRORED + "with strategy.scope():\n    model = build()\n"

# 7. Only a proven flow into what a synchronous strategy splits is reported.
PROVEN_REPORTED = {
    "through a dict of datasets": BUILT
    + "data = {}\ndata['train'] = raw.batch(64)  # REPORT\n"
    + "model.fit(data['train'])\n",
    "through a self attribute": TF
    + "class Trainer:\n    def __init__(self):\n"
    + "        self.strategy = tf.distribute.MirroredStrategy()\n"
    + "        self.train_ds = raw.batch(64)  # REPORT\n"
    + "    def train(self):\n        with self.strategy.scope():\n"
    + "            model = build()\n        model.fit(self.train_ds)\n",
    "through a function's result": MIRRORED
    + "def make():\n    ds = raw.shuffle(10)\n    return ds.batch(32)  # REPORT\n"
    + "train, = (make(),)\n"
    + "dist = strategy.experimental_distribute_dataset(make())\n",
    "into a helper that fits the model it is given": BUILT
    + "def train(m, ds):\n    m.fit(ds, epochs=2)\n"
    + "train(model, raw.batch(64))  # REPORT\n",
    "a model compiled under the scope": MIRRORED
    + "model = build()\nwith strategy.scope():\n    model.compile('adam')\n"
    + "model.fit(raw.batch(64))  # REPORT\n",
    "a model built by a function called under the scope": MIRRORED
    + "def build_and_train():\n    model = build()\n    model.compile('adam')\n"
    + "    model.fit(raw.batch(64))  # REPORT\n"
    + "with strategy.scope():\n    build_and_train()\n",
    "strategy.run given a batch": MIRRORED
    + "ds = raw.batch(64)  # REPORT\n"
    + "strategy.run(step, args=(next(iter(ds)),))\n",
    "a batch size held on self": TF
    + "class Trainer:\n    def __init__(self, strategy):\n"
    + "        self.strategy = strategy\n        self.batch_size = 64\n"
    + "    def data(self):\n"
    + "        ds = raw.batch(self.batch_size)  # REPORT\n"
    + "        return self.strategy.experimental_distribute_dataset(ds)\n",
    "a constant passed to a method of the class": TF
    + "class Trainer:\n    def __init__(self):\n"
    + "        self.strategy = tf.distribute.MirroredStrategy()\n"
    + "    def make(self, b):\n        return raw.batch(b)\n"
    + "    def train(self):\n        ds = self.make(64)  # REPORT\n"
    + "        return self.strategy.experimental_distribute_dataset(ds)\n",
    "a batch size in a config class": MIRRORED
    + "class CFG:\n    batch_size = 32\n"
    + "ds = raw.batch(CFG.batch_size)  # REPORT\n"
    + DIST,
    "a batch size in a dict literal": MIRRORED
    + "params = {'batch_size': 16, 'lr': 0.1}\n"
    + "ds = raw.batch(params['batch_size'])  # REPORT\n"
    + DIST,
}
PROVEN = {
    "a later snippet builds its model with no scope": MIRRORED
    + "ds = raw.batch(64)\nmodel = build()\nmodel.fit(ds)\n",
    "a display helper after the strategy": MIRRORED
    + "def show(ds):\n    for images, labels in ds.batch(9).take(1):\n        plot(images)\n"
    + "show(raw)\n",
    "NumPy pulled out of a batch, then given to a distributed model": BUILT
    + "def to_numpy(ds, n):\n    for x, y in ds.batch(n):\n        return x.numpy(), y.numpy()\n"
    + "digits, labels = to_numpy(raw, 24)\nmodel.predict(digits)\n",
    "a model built under the scope fits other data than the batch": BUILT
    + "preview = raw.batch(64)\nshow(preview)\nmodel.fit(x_train, y_train)\n",
    "a strategy passed only by name, of unknown kind": TF
    + "from helpers import get_strategy\nstrategy = get_strategy()\n"
    + "ds = raw.batch(64)\n"
    + DIST,
    "data made after the fit that reads the name": BUILT
    + "ds = raw.batch(64 * strategy.num_replicas_in_sync)\nmodel.fit(ds)\n"
    + "ds = raw.batch(8)\nplot(ds)\n",
}

# 8. Stated intent, read both ways.
INTENT_37 = {
    "multiplied by a worker count": MIRRORED
    + "PER_WORKER_BATCH = 64\nNUM_WORKERS = 4\n"
    + "ds = raw.batch(PER_WORKER_BATCH * NUM_WORKERS)\n"
    + DIST,
    "a product of numbers": MIRRORED + "BATCH = 4096 * 9\nds = raw.batch(BATCH)\n" + DIST,
    "a comment above the definition": MIRRORED
    + "# Must be divisible by the number of workers.\nBATCH = 1024\n"
    + "ds = raw.batch(BATCH)\n"
    + DIST,
    "a comment above, two lines up": MIRRORED
    + "# The batch for one step,\n# split across the replicas by the strategy.\n"
    + "BATCH = 1024\nds = raw.batch(BATCH)\n"
    + DIST,
    "a summed loss averaged over it": MIRRORED
    + "BATCH_SIZE = 64\nds = raw.batch(BATCH_SIZE)\n"
    + DIST
    + "def step(x):\n    return tf.reduce_sum(loss(x)) / BATCH_SIZE\n",
    "a comment naming the cores it spans": MIRRORED
    + "BATCH = 128  # for all 8 TPU cores\nds = raw.batch(BATCH)\n"
    + DIST,
    "a comment writing it as a product over cores": MIRRORED
    + "# 16 x 8 cores\nBATCH = 128\nds = raw.batch(BATCH)\n"
    + DIST,
    "a name that says effective": MIRRORED
    + "EFFECTIVE_BATCH_SIZE = 512\nds = raw.batch(EFFECTIVE_BATCH_SIZE)\n"
    + DIST,
    "a command-line size the code checks divides over the GPUs": MIRRORED
    + "flags.DEFINE_integer('batch_size', 64, 'training batch size')\n"
    + "if FLAGS.batch_size % len(gpus):\n    raise ValueError('not divisible')\n"
    + "ds = raw.batch(FLAGS.batch_size)\n"
    + DIST,
    "an attribute divided by the replica count": MIRRORED
    + "class Config:\n    batch_size = 256\ncfg = Config()\n"
    + "ds = raw.batch(cfg.batch_size)\n"
    + "per_replica = cfg.batch_size // strategy.num_replicas_in_sync\n"
    + DIST,
    "an assert that it divides": MIRRORED
    + "batch_size = 256\nassert batch_size % 8 == 0\n"
    + "ds = raw.batch(batch_size)\n"
    + DIST,
}
INTENT_37_REPORTED = {
    "a per-core size whose comment mentions the global batch": MIRRORED
    + "# This is the per-core batch size. The global batch size is 8x this.\n"
    + "BATCH = 128\nds = raw.batch(BATCH)  # REPORT\n"
    + DIST,
    "a comment that says it is for each of the cores": MIRRORED
    + "BATCH = 128  # for each of the 8 TPU cores\nds = raw.batch(BATCH)  # REPORT\n"
    + DIST,
    "a comment with a core count that states no product": MIRRORED
    + "BATCH = 128  # max 8 cores on this machine\nds = raw.batch(BATCH)  # REPORT\n"
    + DIST,
    "another object's batch size divided, not this one": MIRRORED
    + "class Config:\n    batch_size = 256\ncfg = Config()\n"
    + "ds = raw.batch(cfg.batch_size)  # REPORT\n"
    + "eval_share = eval_cfg.batch_size // strategy.num_replicas_in_sync\n"
    + DIST,
    "a name that says per worker": MIRRORED
    + "PER_WORKER_BATCH = 64\nds = raw.batch(PER_WORKER_BATCH)  # REPORT\n"
    + DIST,
    "a comment above that says nothing of intent": MIRRORED
    + "# Training batch.\nBATCH = 64\nds = raw.batch(BATCH)  # REPORT\n"
    + DIST,
}

# 9. Not synchronous: ParameterServerStrategy and DTensor, however held.
NOT_SYNCHRONOUS = {
    "a name rebound to a ParameterServerStrategy in a later section": MIRRORED
    + "strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
    + "ds = raw.batch(64)\nwith strategy.scope():\n    model = build()\nmodel.fit(ds)\n",
    "ParameterServerStrategy on an attribute": TF
    + "class Trainer:\n    def __init__(self, resolver):\n"
    + "        self._strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
    + "    def train(self):\n        with self._strategy.scope():\n"
    + "            self.model = build()\n"
    + "        self.model.fit(raw.batch(64))\n"
    + "        self._strategy.experimental_distribute_dataset(raw.batch(8))\n",
    "ParameterServerStrategy passed to a helper": TF
    + "def train(dist, ds):\n    with dist.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))\n"
    + "train(tf.distribute.experimental.ParameterServerStrategy(resolver), raw)\n",
    "ParameterServerStrategy given to a parameter named strategy": TF
    + "def train(ds, strategy=None):\n    with strategy.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))\n"
    + "ps = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
    + "train(raw, strategy=ps)\ntrain(raw)\n",
    "ParameterServerStrategy given to a constructor, kept on self": TF
    + "class Trainer:\n    def __init__(self, strategy):\n        self.strategy = strategy\n"
    + "    def train(self):\n        with self.strategy.scope():\n"
    + "            self.model = build()\n        self.model.fit(raw.batch(64))\n"
    + "Trainer(tf.distribute.experimental.ParameterServerStrategy(resolver)).train()\n",
    "a DTensor layout map held on self": TF
    + "from tensorflow.experimental import dtensor\n"
    + "class Trainer:\n    def __init__(self, mesh):\n"
    + "        self.layout_map = tf.keras.dtensor.experimental.LayoutMap(mesh=mesh)\n"
    + "    def train(self):\n        with self.layout_map.scope():\n"
    + "            model = build()\n        model.fit(raw.batch(64))\n",
}
SYNCHRONOUS_REPORTED = {
    "MirroredStrategy on an attribute": TF
    + "class Trainer:\n    def __init__(self):\n"
    + "        self._strategy = tf.distribute.MirroredStrategy()\n"
    + "    def train(self):\n        with self._strategy.scope():\n"
    + "            self.model = build()\n"
    + "        self.model.fit(raw.batch(64))  # REPORT\n",
    "TPU or the default strategy, the Kaggle way": TF
    + "try:\n    tpu = tf.distribute.cluster_resolver.TPUClusterResolver()\n"
    + "    strategy = tf.distribute.TPUStrategy(tpu)\nexcept ValueError:\n"
    + "    strategy = tf.distribute.get_strategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(raw.batch(128))  # REPORT\n",
    "a parameter named strategy that one caller gives a synchronous one": TF
    + "def train(ds, strategy=None):\n    with strategy.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))  # REPORT\n"
    + "train(raw, tf.distribute.experimental.ParameterServerStrategy(resolver))\n"
    + "train(raw, tf.distribute.MirroredStrategy())\n",
    "a parameter named strategy of a function no call here reaches": TF
    + "def train(ds, strategy):\n    with strategy.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))  # REPORT\n",
    "a strategy from a function of this file that returns one": TF
    + "def get_strategy():\n    try:\n"
    + "        return tf.distribute.TPUStrategy(resolver)\n    except ValueError:\n"
    + "        return tf.distribute.get_strategy()\n"
    + "strategy = get_strategy()\nds = raw.batch(128)  # REPORT\n"
    + DIST,
}

# 10. Sequence windows are not the training batch; the training batch still is.
WINDOWS = {
    "a window batched inside flat_map": MIRRORED
    + "ds = raw.window(20, shift=1).flat_map(lambda w: w.batch(20))\n"
    + "ds = ds.map(split).batch(64 * strategy.num_replicas_in_sync)\n"
    + DIST,
    "sequences of one plus a length": MIRRORED
    + "seq_len = 100\nchunks = chars.batch(1 + seq_len, drop_remainder=True)\n"
    + "dist = strategy.experimental_distribute_dataset(chunks.map(split))\n",
    "a window function given to flat_map": MIRRORED
    + "def windows(w):\n    return w.batch(21)\n"
    + "ds = raw.window(21).flat_map(windows).batch(16 * strategy.num_replicas_in_sync)\n"
    + DIST,
}
WINDOWS_REPORTED_37 = {
    "sequences of a constant length through names, then the training batch": TF
    + "strategy = tf.distribute.TPUStrategy(resolver)\n"
    + "SEQ_LEN = 100\nsequences = chars.batch(SEQ_LEN, drop_remainder=True)\n"
    + "pairs = sequences.map(split_input_target)\n"
    + "ds = pairs.shuffle(10000)\nds = ds.batch(64, drop_remainder=True)  # REPORT\n"
    + DIST,
    "batched, unbatched and batched again": MIRRORED
    + "ds = raw.batch(256).map(decode).unbatch()\nds = ds.batch(32)  # REPORT\n"
    + DIST,
    "batched then mapped, with no second batch: the training batch": MIRRORED
    + "ds = raw.batch(64)  # REPORT\nds = ds.map(augment).prefetch(2)\n"
    + DIST,
}
WINDOWS_REPORTED = {
    "sequences of seq_len + 1, then the training batch": MIRRORED
    + "seq_len = 100\nsequences = chars.batch(seq_len + 1, drop_remainder=True)\n"
    + "ds = sequences.map(split_input_target)\n"
    + "ds = ds.shuffle(10000).batch(64, drop_remainder=True)  # REPORT\n"
    + DIST,
    "both on one line": MIRRORED
    + "ds = chars.batch(101).map(split_input_target).batch(64)  # REPORT\n"
    + DIST,
}

# 11. A strategy name rebound to the one-replica default on a straight line is the default
# from then on; in another branch (a TPU probe's except or else) it is a fallback.
PROBE = "    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()\n"
REBOUND = {
    "get_strategy() on the next line": TF
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "strategy = tf.distribute.get_strategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(raw.batch(32))\nmodel.predict(x, batch_size=5)\n",
    "rebound after the probe, in the same block": TF
    + "def main():\n    try:\n"
    + "    "
    + PROBE
    + "        dist = tf.distribute.TPUStrategy(resolver)\n"
    + "    except ValueError:\n        dist = None\n"
    + "    dist = tf.distribute.get_strategy()\n"
    + "    ds = raw.batch(64)\n"
    + "    dist.experimental_distribute_dataset(ds)\n",
    "a module strategy rebound to ParameterServerStrategy, read by a function": TF
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
    + "def train(ds):\n    return strategy.experimental_distribute_dataset(ds.batch(64))\n",
    "an attribute rebound to the default on the next line": TF
    + "class Trainer:\n    def __init__(self):\n"
    + "        self.strategy = tf.distribute.MirroredStrategy()\n"
    + "        self.strategy = tf.distribute.get_strategy()\n"
    + "    def train(self):\n        with self.strategy.scope():\n"
    + "            self.model = build()\n        self.model.fit(raw.batch(64))\n",
    "a module strategy rebound before a function reads it": TF
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "strategy = tf.distribute.get_strategy()\n"
    + "def train(ds):\n    with strategy.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))\n",
}
REBOUND_REPORTED = {
    "the default strategy in the except branch of a TPU probe": TF
    + "try:\n"
    + PROBE
    + "    strategy = tf.distribute.TPUStrategy(resolver)\n"
    + "except ValueError:\n    strategy = tf.distribute.get_strategy()\n"
    + "with strategy.scope():\n    model = build()\n"
    + "model.fit(raw.batch(32))  # REPORT\n",
    "the default strategy in the else branch of an if": TF
    + "if tpu:\n    strategy = tf.distribute.TPUStrategy(tpu)\n"
    + "else:\n    strategy = tf.distribute.get_strategy()\n"
    + "ds = raw.batch(128)  # REPORT\n"
    + "dist = strategy.experimental_distribute_dataset(ds)\n",
    "TPU or the default in one expression": TF
    + "strategy = tf.distribute.TPUStrategy(tpu) if tpu else tf.distribute.get_strategy()\n"
    + "ds = raw.batch(128)  # REPORT\n"
    + "dist = strategy.experimental_distribute_dataset(ds)\n",
    "mirrored on several GPUs, one device otherwise": TF
    + "if len(gpus) > 1:\n    strategy = tf.distribute.MirroredStrategy()\n"
    + "else:\n    strategy = tf.distribute.OneDeviceStrategy('/gpu:0')\n"
    + "ds = raw.batch(64)  # REPORT\n"
    + DIST,
    "a rebinding that may not run": MIRRORED
    + "if args.cpu:\n    strategy = tf.distribute.get_strategy()\n"
    + "ds = raw.batch(64)  # REPORT\n"
    + DIST,
    "an attribute given the default only in the except branch": TF
    + "class Trainer:\n    def __init__(self):\n        self.model = None\n"
    + "        try:\n            self.strategy = tf.distribute.TPUStrategy(resolver)\n"
    + "        except ValueError:\n            self.strategy = tf.distribute.get_strategy()\n"
    + "    def train(self):\n        with self.strategy.scope():\n"
    + "            self.model = build()\n"
    + "        self.model.fit(raw.batch(64))  # REPORT\n",
    "get_strategy() under the strategy's scope is that strategy": MIRRORED
    + "with strategy.scope():\n    strategy = tf.distribute.get_strategy()\n"
    + "ds = raw.batch(64)  # REPORT\n"
    + DIST,
    "a module strategy rebound only after the function reading it": TF
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "def train(ds):\n    with strategy.scope():\n        model = build()\n"
    + "    model.fit(ds.batch(64))  # REPORT\n"
    + "    return strategy.experimental_distribute_dataset(ds.batch(32))  # REPORT\n"
    + "train(raw)\nstrategy = tf.distribute.OneDeviceStrategy('/gpu:0')\ntrain(raw)\n",
    "a strategy parameter's default filled in": TF
    + "def main(strategy=None):\n"
    + "    strategy = strategy or tf.distribute.MirroredStrategy()\n"
    + "    ds = raw.batch(64)  # REPORT\n"
    + "    return strategy.experimental_distribute_dataset(ds)\n"
    + "main()\n",
    "rebound to the default, then to a strategy again": TF
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "strategy = tf.distribute.get_strategy()\n"
    + "strategy = tf.distribute.MirroredStrategy()\n"
    + "ds = raw.batch(64)  # REPORT\n"
    + DIST,
}

# 12. A launcher that runs the training function under a strategy it makes itself:
# spark-tensorflow-distributor's MirroredStrategyRunner (a MultiWorkerMirroredStrategy).
SPARK = "from spark_tensorflow_distributor import MirroredStrategyRunner\n"
TRAIN_FN = (
    "def train():\n    import tensorflow as tf\n"
    "    def make():\n        return raw.shuffle(100).batch({size}){mark}\n"
    "    model = build()\n    model.compile('adam')\n"
    "    model.fit(make(), epochs=2)\n"
)
CONSTANT_TRAIN = SPARK + TRAIN_FN.format(size="64", mark="")
RUNNER_REPORTED = {
    name: SPARK + TRAIN_FN.format(size="64", mark="  # REPORT") + launch
    for name, launch in {
        "MirroredStrategyRunner(...).run(train)": (
            "MirroredStrategyRunner(num_slots=8).run(train)\n"
        ),
        "a runner held by a name, the function by keyword": (
            "runner = MirroredStrategyRunner(num_slots=4, local_mode=True)\n"
            "runner.run(train_fn=train)\n"
        ),
    }.items()
}
RUNNER = {
    "scaled by the replica count of the runner's strategy": SPARK
    + TRAIN_FN.format(size="64 * tf.distribute.get_strategy().num_replicas_in_sync", mark="")
    + "MirroredStrategyRunner(num_slots=8).run(train)\n",
    "the function makes its own strategy": CONSTANT_TRAIN
    + "MirroredStrategyRunner(num_slots=8, use_custom_strategy=True).run(train)\n",
    "one slot: one replica": CONSTANT_TRAIN
    + "MirroredStrategyRunner(num_slots=1, local_mode=True).run(train)\n",
    "the function is called, not given to the runner": CONSTANT_TRAIN
    + "runner = MirroredStrategyRunner(num_slots=8)\ntrain()\n",
}


MUST_REPORT = {
    **{f"scope: {k}": v for k, v in SCOPE.items() if "# REPORT" in v},
    **{f"contracts: {k}": v for k, v in CONTRACT_REPORTED.items()},
    **{f"intent: {k}": v for k, v in INTENT_REPORTED.items()},
    **{f"other splitters: {k}": v for k, v in OTHER_SPLITTERS_REPORTED.items()},
    **{f"batching calls: {k}": v for k, v in BATCHING_CALLS_REPORTED.items()},
    **{f"one per line: {k}": v for k, v in ONE_PER_LINE_REPORTED.items()},
    **{f"proven flow: {k}": v for k, v in PROVEN_REPORTED.items()},
    **{f"intent read both ways: {k}": v for k, v in INTENT_37_REPORTED.items()},
    **{f"synchronous: {k}": v for k, v in SYNCHRONOUS_REPORTED.items()},
    **{f"windows: {k}": v for k, v in {**WINDOWS_REPORTED, **WINDOWS_REPORTED_37}.items()},
    **{f"rebound strategy: {k}": v for k, v in REBOUND_REPORTED.items()},
    **{f"strategy runner: {k}": v for k, v in RUNNER_REPORTED.items()},
}
MUST_NOT_REPORT = {
    **{f"scope: {k}": v for k, v in SCOPE.items() if "# REPORT" not in v},
    **{f"contracts: {k}": v for k, v in CONTRACTS.items()},
    **{f"intent: {k}": v for k, v in INTENT.items()},
    **{f"other splitters: {k}": v for k, v in OTHER_SPLITTERS.items()},
    **{f"batching calls: {k}": v for k, v in BATCHING_CALLS.items()},
    **{f"one per line: {k}": v for k, v in ONE_PER_LINE.items()},
    **{f"proven flow: {k}": v for k, v in PROVEN.items()},
    **{f"intent read both ways: {k}": v for k, v in INTENT_37.items()},
    **{f"not synchronous: {k}": v for k, v in NOT_SYNCHRONOUS.items()},
    **{f"windows: {k}": v for k, v in WINDOWS.items()},
    **{f"rebound strategy: {k}": v for k, v in REBOUND.items()},
    **{f"strategy runner: {k}": v for k, v in RUNNER.items()},
}


@pytest.mark.parametrize("source", MUST_REPORT.values(), ids=MUST_REPORT.keys())
def test_reported_once_on_the_marked_lines(source):
    assert reported(source) == marked(source)


@pytest.mark.parametrize("source", MUST_NOT_REPORT.values(), ids=MUST_NOT_REPORT.keys())
def test_not_reported(source):
    assert check_source(source) == []


def test_the_message_says_what_would_make_the_value_global():
    (violation,) = check_source(INTENT_REPORTED["a comment that says per replica"])
    assert "GLOBAL_BATCH_SIZE" in violation.message
    assert "'# global batch' on its definition" in violation.message
    assert "BATCH * strategy.num_replicas_in_sync" in violation.message


def test_a_null_byte_is_one_syntax_finding():
    (violation,) = check_source("x = 1\0\n")
    assert violation.code == "KDP900" and "file not checked" in violation.message


def test_a_magic_looking_line_inside_brackets_is_python(tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(MIRRORED))
    notebook.cells.append(
        nbformat.v4.new_code_cell("print('%d'\n      %(1))\nds = ds.batch(64)\n%time x\n" + DIST)
    )
    nbformat.write(notebook, str(tmp_path / "guide.ipynb"))
    findings = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    assert [(f["cell"], f["line"], f["code"]) for f in findings] == [(2, 3, "KDP001")]


@pytest.fixture
def project(tmp_path):
    """Every case as a file of a project; a data module reached through an import."""
    for number, source in enumerate([*MUST_REPORT.values(), *MUST_NOT_REPORT.values()]):
        (tmp_path / f"case_{number}.py").write_text(source)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("")
    (tmp_path / "data" / "pipeline.py").write_text(
        "def make(ds, size):\n    return ds.batch(size)\n"
    )
    (tmp_path / "train.py").write_text(
        MIRRORED + "from data import pipeline\nds = pipeline.make(ds, 64)  # REPORT\n" + DIST
    )
    return tmp_path


def test_a_project_data_module_is_followed_and_flake8_agrees_with_json(project):
    findings = json.loads(run_cli("lint", str(project), "--format", "json").stdout)
    ours = {(f["path"].split("/")[-1], f["line"], f["col"], f["code"]) for f in findings}
    expected = {
        (path.name, line)
        for path in sorted(project.glob("*.py"))
        for line in marked(path.read_text())
    }
    assert {(name, line) for name, line, _, _ in ours} == expected
    result = subprocess.run(
        [sys.executable, "-m", "flake8", "--select", "KDP", "."],
        capture_output=True,
        text=True,
        cwd=project,
    )
    theirs = set()
    for line in result.stdout.splitlines():
        path, number, col, rest = line.split(":", 3)
        theirs.add((path.split("/")[-1], int(number), int(col), rest.split()[0]))
    assert theirs == ours


def test_a_model_name_is_distributed_only_from_where_the_scope_builds_it():
    source = (
        TF
        + "model = build()\nmodel.fit(x, y, batch_size=32)\n"
        + "strategy = tf.distribute.MirroredStrategy()\n"
        + "with strategy.scope():\n    model = build()\n"
        + "model.fit(x, y, batch_size=32)  # REPORT\n"
    )
    assert reported(source) == marked(source)


def test_data_reaches_the_strategy_by_its_own_name_not_a_namesake_in_another_function():
    source = (
        TF
        + "def export():\n    ds = tf.data.Dataset.range(9).batch(64)\n    save(ds)\n"
        + "def main():\n    ds = tf.data.Dataset.range(9).batch(64)  # REPORT\n"
        + "    strategy = tf.distribute.MirroredStrategy()\n"
        + "    with strategy.scope():\n        model = build()\n"
        + "    model.fit(ds)\n"
    )
    assert reported(source) == marked(source)


# 13. Notebooks: magics and shell lines anywhere in a cell are blanked, blocks kept.
def notebook_findings(tmp_path, *cells) -> list[tuple]:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells.extend(nbformat.v4.new_code_cell(cell) for cell in cells)
    nbformat.write(notebook, str(tmp_path / "course.ipynb"))
    findings = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    return [(f["cell"], f["line"], f["code"]) for f in findings]


def test_a_magic_inside_a_block_and_shell_continuations_keep_the_file_checked(tmp_path):
    assert notebook_findings(
        tmp_path,
        "try:\n    %tensorflow_version 2.x\nexcept Exception:\n    pass\n",
        "!pip install -q \\\n    tensorflow-datasets \\\n    keras\nfiles = !ls data\n",
        "if True:\n    !nvidia-smi\nelse:\n    %env X=1\n" + MIRRORED,
        "%%time\nds = raw.batch(64)\n" + DIST,
    ) == [(4, 2, "KDP001")]


def test_magics_alone_are_no_finding_and_no_syntax_error(tmp_path):
    assert (
        notebook_findings(
            tmp_path,
            "try:\n    %tensorflow_version 2.x\nexcept Exception:\n    pass\n",
            "!wget -q https://example.invalid/a.zip \\\n  -O a.zip\n%%bash\n",
            "%%writefile notes.txt\nthis is not python(\n",
            MIRRORED + "ds = raw.batch(64 * strategy.num_replicas_in_sync)\n" + DIST,
        )
        == []
    )


def test_a_timed_statement_is_checked_as_the_program(tmp_path):
    assert notebook_findings(
        tmp_path,
        BUILT,
        "ds = raw.batch(64)\n%time history = model.fit(ds, epochs=2)\n",
        "for _ in range(2):\n    %timeit -n 1 -r 1 model.fit(raw.batch(32))\n",
        "ds = raw.batch(16)\nhistory = %time model.fit(ds)\n",
        "%time model.fit(raw.batch(16 * strategy.num_replicas_in_sync))\n%time\n",
    ) == [(2, 1, "KDP001"), (3, 2, "KDP001"), (4, 1, "KDP001")]


def test_a_broken_cell_is_left_out_and_a_written_python_file_is_checked_alone(tmp_path):
    assert notebook_findings(
        tmp_path,
        MIRRORED,
        "train_dataset = # TODO: your code here\n",
        "%%writefile train.py\n" + BUILT + "ds = raw.batch(32)\nmodel.fit(ds)\n",
        "ds = raw.batch(16)\n" + DIST,
    ) == [(2, 1, "KDP900"), (3, 6, "KDP001"), (4, 1, "KDP001")]


def test_a_python_file_exported_from_a_notebook_keeps_its_magics_out(tmp_path):
    (tmp_path / "kernel.py").write_text(
        "!pip install -q efficientnet\n" + BUILT + "%%time\nmodel.fit(raw.batch(128))\n"
    )
    findings = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    assert [(f["line"], f["code"]) for f in findings] == [(7, "KDP001")]


# 14. Each message gives the value, the line defining it and the line reaching the strategy.
def test_the_message_names_value_definition_and_where_the_strategy_is_reached():
    source = BUILT + "BATCH_SIZE = 30 + 2\nds = raw.batch(BATCH_SIZE)\nmodel.fit(ds)\n"
    (violation,) = check_source(source)
    assert violation.line == 6
    assert "BATCH_SIZE (= 32)" in violation.message
    assert "defined at line 5" in violation.message
    assert "model.fit() at line 7" in violation.message
    assert [(r.line, r.note) for r in violation.related] == [
        (5, "the value is defined here"),
        (7, "the data reaches the strategy here"),
    ]


def test_a_launcher_finding_names_the_call_that_enters_the_strategy():
    source = RUNNER_REPORTED["MirroredStrategyRunner(...).run(train)"]
    launch = len(source.splitlines())  # the launcher is the last line
    (violation,) = check_source(source)
    assert violation.line == 5
    assert "model.fit() at line 8" in violation.message
    assert f"MirroredStrategyRunner(num_slots=8).run() at line {launch}" in violation.message
    assert [(r.line, r.note) for r in violation.related] == [
        (8, "the data reaches the strategy here"),
        (launch, "the launcher enters the strategy's scope here"),
    ]


def test_a_followed_call_says_where_the_strategy_is_reached():
    source = MIRRORED + (
        "def make(b):\n    return raw.batch(b)\n"
        "train = make(48)\n"
        "dist = strategy.experimental_distribute_dataset(train)\n"
    )
    (violation,) = check_source(source)
    assert violation.line == 5
    assert "batch size 48 passed to make() at line 5 reaches .batch(b) at line 4" in (
        violation.message
    )
    assert "strategy.experimental_distribute_dataset() at line 6" in violation.message


def test_a_run_is_summed_up_in_one_line(tmp_path):
    from keras_dp_tools.checks.lint import Summary, lint_paths

    (tmp_path / "clean.py").write_text(TF + "ds = raw.batch(64)\n")
    (tmp_path / "bad.py").write_text(MIRRORED + "ds = raw.batch(64)\n" + DIST)
    summary = Summary()
    reports = list(lint_paths([tmp_path], summary=summary))
    assert (summary.files, summary.findings, len(reports)) == (2, 1, 1)
    assert summary.line() == "keras-dp lint: 2 files checked, 1 finding"
    clean = Summary()
    assert list(lint_paths([tmp_path / "clean.py"], summary=clean)) == []
    assert clean.line() == "keras-dp lint: 1 file checked, 0 findings"


def test_a_function_defined_above_the_strategy_it_uses_is_followed():
    source = TF + (
        "def main():\n    with strategy.scope():\n        model = build()\n"
        "    model.fit(raw.batch(64))  # REPORT\n"
        "if __name__ == '__main__':\n"
        "    strategy = tf.distribute.MirroredStrategy()\n    main()\n"
    )
    assert reported(source) == marked(source)
    ps = source.replace("MirroredStrategy()", "experimental.ParameterServerStrategy(r)")
    assert check_source(ps) == []


def test_a_strategy_or_a_model_from_a_project_helper_is_followed(tmp_path):
    (tmp_path / "common.py").write_text(
        TF
        + "def get_strategy():\n    return tf.distribute.MirroredStrategy()\n"
        + "def build(strategy):\n    with strategy.scope():\n        model = make()\n"
        + "    return model\n"
        + "def get_ps_strategy(resolver):\n"
        + "    return tf.distribute.experimental.ParameterServerStrategy(resolver)\n"
    )
    (tmp_path / "train.py").write_text(
        TF
        + "import common\nfrom common import build, get_ps_strategy\n"
        + "strategy = common.get_strategy()\n"
        + "ds = raw.batch(64)\n"
        + DIST
        + "model = build(strategy)\nmodel.fit(raw.batch(32))\n"
        + "ps = get_ps_strategy(r)\nps.experimental_distribute_dataset(raw.batch(8))\n"
    )
    findings = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    assert [(f["path"].split("/")[-1], f["line"]) for f in findings] == [
        ("train.py", 5),
        ("train.py", 8),
    ]


def test_a_model_name_rebuilt_without_the_scope_is_not_distributed():
    source = BUILT + (
        "model.fit(raw.batch(32))  # REPORT\n"
        "model = build()\nmodel.fit(raw.batch(64))\n"
        "with strategy.scope():\n    model.compile('sgd')\n"
        "model.fit(raw.batch(16))  # REPORT\n"
    )
    assert reported(source) == marked(source)


def test_a_mirrored_strategy_on_one_device_splits_nothing():
    source = TF + "strategy = tf.distribute.MirroredStrategy(devices=['/gpu:0'])\n"
    assert check_source(source + "ds = raw.batch(64)\n" + DIST) == []
    two = source.replace("['/gpu:0']", "['/gpu:0', '/gpu:1']")
    assert [v.line for v in check_source(two + "ds = raw.batch(64)\n" + DIST)] == [3]


def test_a_command_line_default_is_shown_with_its_value():
    source = MIRRORED + (
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--batch-size', type=int, default=48)\n"
        "args = parser.parse_args()\n"
        "ds = raw.batch(args.batch_size)\n" + DIST
    )
    (violation,) = check_source(source)
    assert violation.line == 7
    assert "args.batch_size (= 48), defined at line 5" in violation.message


def test_an_imported_constant_is_shown_where_it_is_defined(tmp_path):
    (tmp_path / "config.py").write_text("BATCH = 48\n")
    (tmp_path / "train.py").write_text(
        MIRRORED + "from config import BATCH\nds = raw.batch(BATCH)\n" + DIST
    )
    (finding,) = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    assert finding["line"] == 4
    assert "batch size BATCH (= 48), defined at " in finding["message"]
    assert [(r["path"].split("/")[-1], r["line"]) for r in finding["related"]] == [
        ("config.py", 1),
        ("train.py", 5),
    ]


def test_a_file_gives_the_same_findings_whatever_order_files_are_checked_in(tmp_path):
    (tmp_path / "common.py").write_text(
        TF + "def get_strategy():\n    return tf.distribute.MirroredStrategy()\n"
    )
    (tmp_path / "train.py").write_text(
        "import common\nstrategy = common.get_strategy()\nds = raw.batch(64)\n" + DIST
    )
    (tmp_path / "a_first.py").write_text("import train\n")  # reads train.py as an import
    findings = json.loads(run_cli("lint", str(tmp_path), "--format", "json").stdout)
    assert [(f["path"].split("/")[-1], f["line"]) for f in findings] == [("train.py", 3)]
    alone = json.loads(run_cli("lint", str(tmp_path / "train.py"), "--format", "json").stdout)
    assert [f["line"] for f in alone] == [3]
