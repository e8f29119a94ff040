"""Writes dev/test/fixtures/tensorboard/events.out.tfevents.fixture with TensorBoard's own Python
package: the records llmc/tensorboard.h must write byte for byte (build/test_tensorboard compares).

The events are tensorboard.compat.proto messages, framed by the RecordWriter that
tensorboard.summary.writer.event_file_writer.EventFileWriter writes through. EventFileWriter itself
is not used: its first record takes time.time() and adds a source_metadata naming itself, and the
fixture needs fixed wall times.

    $PYENV_PYTHON dev/test/make_tensorboard_fixture.py   (the python that dev/test/python_env.sh's
    `python_env tensorboard` picks)
"""
import os
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tensorboard", "events.out.tfevents.fixture")

# Kept in step with dev/test/test_tensorboard.cpp's records_match_what_tensorboard_wrote.
TEXT = "First line of a sample,\nand a second: caf\u00e9 \u2014 " + "long " * 40


def scalars(wall_time, step, values):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def text(wall_time, step, tag, string):
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                    string_val=[string.encode("utf-8")])
    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[value]))


def main():
    events = [
        event_pb2.Event(wall_time=1700000000.25, file_version="brain.Event:2"),
        # step 0 and a value of 0.0: proto3 leaves the step out, the oneof keeps the value
        scalars(1700000001.5, 0, [("perf/mfu_percent", 0.0)]),
        scalars(1700000002.75, 12, [("train/loss", 3.25), ("train/lr", 6e-4), ("train/grad_norm", -1.5)]),
        text(1700000003.0, 12, "samples", TEXT),
        event_pb2.Event(wall_time=1700000004.125, step=7, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)),
        scalars(1700000005.0, 3000000000, [("val/loss", 4.5)]),  # a step past 2^31
    ]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        writer = RecordWriter(f)
        for event in events:
            writer.write(event.SerializeToString())
    print("wrote %s (%d bytes)" % (OUT, os.path.getsize(OUT)), file=sys.stderr)


if __name__ == "__main__":
    main()
