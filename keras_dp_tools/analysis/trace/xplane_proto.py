"""TensorFlow's generated ``xplane_pb2`` module, loaded without TensorFlow where it is not
imported yet. Its own module so that the trace readers (``xspace``, ``xevents``) share it
without importing each other."""

from __future__ import annotations

from pathlib import Path


def xplane_pb2():
    """TensorFlow's ``xplane_pb2``. Where TensorFlow is not imported yet (the analysis
    process), its generated module is loaded on its own: it needs only protobuf, while
    importing TensorFlow takes seconds of CPU."""
    import sys

    if "tensorflow" not in sys.modules:
        if _STANDALONE not in sys.modules:
            import importlib.util

            package = importlib.util.find_spec("tensorflow")
            folder = Path(package.origin).parent if package and package.origin else None
            source = folder / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py" if folder else None
            if source is not None and source.exists():
                spec = importlib.util.spec_from_file_location(_STANDALONE, source)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[_STANDALONE] = module
        if _STANDALONE in sys.modules:
            return sys.modules[_STANDALONE]
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


_STANDALONE = "keras_dp_tools._xplane_pb2"
