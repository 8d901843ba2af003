"""Splits the corpus by thread into a dev half and a test half (run once, before any run).

Method: the threads are grouped by the cause class they were labelled with (blind, from
the thread alone); within each class, in class order 1-6, the thread names are sorted,
shuffled with ``random.Random(36)`` (one generator for the whole split), and dealt in
turn to the half that holds fewer threads so far (dev on a tie). Each class thus falls
as evenly as its count allows, and the halves differ by at most one thread.

Usage: python benchmarks/advisor_corpus/split.py   (prints name -> half)
"""

import random

CAUSE_OF = {
    "tf35095_mnist_tiny_cnn": 1,
    "tf48374_mwms_mnist_tutorial": 1,
    "tf26392_small_dnn": 1,
    "tf49730_sequence_hdf5": 2,
    "tf39494_from_generator_files": 2,
    "tf47633_pydataset_workers": 2,
    "tf42117_histogram_callbacks": 3,
    "tf103564_kfold_fit_overheads": 3,
    "isonet36_compile_outside_scope": 4,
    "tf26020_strategy_one_device": 4,
    "tf34008_ctl_proportional": 5,
    "tf38924_ctl_eager_serial": 5,
    "rnnt18_ctl_eager_rnn": 5,
    "tf36530_ctl_vs_fit": 5,
    "tf40421_gru_kernel_fallback": 6,
    "tf33809_ocr_gru_slower_learning": 6,
}


def split(cause_of, seed=36):
    """Returns {name: "dev" | "test"}, balanced by cause class."""
    rng = random.Random(seed)
    halves = {"dev": [], "test": []}
    for cause in sorted(set(cause_of.values())):
        names = sorted(name for name, c in cause_of.items() if c == cause)
        rng.shuffle(names)
        for name in names:
            half = "dev" if len(halves["dev"]) <= len(halves["test"]) else "test"
            halves[half].append(name)
    return {name: half for half, names in halves.items() for name in names}


if __name__ == "__main__":
    for name, half in sorted(split(CAUSE_OF).items(), key=lambda item: (item[1], item[0])):
        print(f"{half:4s}  cause {CAUSE_OF[name]}  {name}")
