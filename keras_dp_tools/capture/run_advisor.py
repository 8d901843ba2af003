"""RunAdvisor: the advisor's findings for a run, in TensorBoard's Text tab at the end of fit."""

from __future__ import annotations

from keras_dp_tools.capture.base import DataParallelCallback
from keras_dp_tools.capture.recorder import Recorder


class RunAdvisor(DataParallelCallback):
    """Writes ``Report.advice()`` for the run to TensorBoard's Text tab when ``fit`` ends.

    Put it after the other keras_dp_tools callbacks (``kdt.callbacks`` does), so their
    last records (e.g. a profiler window analysed at the end) are in. It reads this
    run's lines of this worker's records file (not the earlier runs in it, nor the other
    files under ``log_dir``) and advises on them.

    Example:

    ```python
    model.fit(dataset, callbacks=[*kdt.callbacks("runs/exp1"), kdt.RunAdvisor("runs/exp1")])
    ```

    Args:
        log_dir: run folder, as for the other callbacks.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir

    def on_train_begin(self, logs=None):
        self._release_recorder()
        self._recorder = Recorder.for_fit(self.log_dir, self.model)

    def on_train_end(self, logs=None):
        # The one door into the analysis (keras_dp_tools.analysis.runner).
        from keras_dp_tools.analysis.runner import run_advice_markdown

        recorder = self._recorder
        recorder.flush()
        # This run's lines only: the runs before it in the file are not read again.
        files = [(recorder.records_path, recorder.run_offset)]
        recorder.text("keras_dp/advice", run_advice_markdown(files, recorder.run_id))
        self._release_recorder()
