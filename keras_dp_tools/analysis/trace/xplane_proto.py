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


def raw_line_class():
    """A message class with ``XLine``'s fields, but its ``events`` (field 4) as
    ``repeated bytes``: parsing a serialised line into it (in C) hands back each event's
    serialised bytes, which ``xevents`` decodes with numpy, without a Python step per
    event. Fields keep their numbers and wire types, so protobuf merges repeated and
    unknown fields exactly as it does for ``XLine``."""
    return _line_variant("XLineRawEvents", repeated=True)


def line_header_class():
    """``XLine``'s fields with ``events`` as one ``optional bytes`` (each event read
    replaces the last): a line's other fields and whether it has events, parsed in C
    without keeping the events."""
    return _line_variant("XLineHeader", repeated=False)


def _line_variant(name: str, repeated: bool):
    if name not in _VARIANTS:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        line = descriptor_pb2.DescriptorProto()
        xplane_pb2().XLine.DESCRIPTOR.CopyToProto(line)
        line.name = name
        for field in line.field:
            if field.number == 4:  # events: XEvent messages, length-delimited as bytes are
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                field.ClearField("type_name")
                if not repeated:
                    field.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
        # proto2: an optional field says whether it was set (the other fields read the
        # same: the wire format and the last-one-wins merge are the same).
        file = descriptor_pb2.FileDescriptorProto(
            name=f"keras_dp_tools/{name}.proto", package="keras_dp_tools", syntax="proto2"
        )
        file.message_type.add().CopyFrom(line)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file)
        descriptor = pool.FindMessageTypeByName(f"keras_dp_tools.{name}")
        _VARIANTS[name] = message_factory.GetMessageClass(descriptor)
    return _VARIANTS[name]


_VARIANTS: dict = {}
