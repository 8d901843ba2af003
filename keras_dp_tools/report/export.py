"""A report's frames as files: ``Report.to_csv`` and ``Report.to_parquet``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

_WRITERS = {
    "csv": lambda frame, path: frame.to_csv(path, index=False),
    "parquet": lambda frame, path: frame.to_parquet(path, index=False),
}


def write_frames(
    frames: dict[str, pd.DataFrame], directory: str | os.PathLike, file_format: str
) -> list[Path]:
    """Writes each frame as ``<directory>/<name>.<file_format>``, lists as text.

    Args:
        frames: file name (without suffix) -> frame.
        directory: where to write (created if missing).
        file_format: ``csv`` or ``parquet`` (parquet needs pyarrow's parquet support).

    Returns:
        The paths written, in the order of ``frames``.

    Raises:
        RuntimeError: ``parquet`` without pyarrow's parquet support (use ``csv``).

    Example:

    >>> import tempfile
    >>> import pandas as pd
    >>> from keras_dp_tools.report.export import write_frames
    >>> frames = {"steps": pd.DataFrame({"step": [1], "devices": [["/gpu:0", "/gpu:1"]]})}
    >>> [path.name for path in write_frames(frames, tempfile.mkdtemp(), "csv")]
    ['steps.csv']
    """
    if file_format == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as error:
            raise RuntimeError(
                f"to_parquet needs pyarrow's parquet support ({error}); use to_csv instead."
            ) from None
    write = _WRITERS[file_format]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in frames.items():
        path = directory / f"{name}.{file_format}"
        write(flat(frame), path)
        written.append(path)
    return written


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists (devices, GPU names) as text: CSV has no lists, and parquet wants one type.

    Args:
        frame: any frame.

    Returns:
        A copy whose list values are comma-separated text.

    Example:

    >>> import pandas as pd
    >>> from keras_dp_tools.report.export import flat
    >>> flat(pd.DataFrame({"devices": [["/gpu:0", "/gpu:1"]]}))["devices"].tolist()
    ['/gpu:0,/gpu:1']
    """

    def text(value):
        return ",".join(map(str, value)) if isinstance(value, (list, tuple, np.ndarray)) else value

    listed = [
        column
        for column in frame.columns
        if frame[column].map(lambda value: isinstance(value, (list, tuple, np.ndarray))).any()
    ]
    return frame.assign(**{column: frame[column].map(text) for column in listed})
