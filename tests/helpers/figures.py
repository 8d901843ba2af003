"""Reading matplotlib figures back: their axes, plotted series, and the global steps
the points stand for, for tests of the plots."""

from matplotlib.figure import Figure


def only_axes(figure):
    assert isinstance(figure, Figure)
    return figure.axes[0]


def data_lines(axes):
    """The plotted series (the dotted window separators have no markers)."""
    return [line for line in axes.get_lines() if line.get_marker() not in (None, "None", "")]


def steps_of(axes, line) -> list[int]:
    """The global steps a line's points stand for, read off the axis's tick labels."""
    ticks = {tick: int(label.get_text()) for tick, label in tick_labels(axes)}
    return [ticks[x] for x in line.get_xdata()]


def tick_labels(axes):
    return zip(axes.get_xticks(), axes.get_xticklabels(), strict=True)


def assert_each_line_stays_in_one_window(axes, windows):
    lines = data_lines(axes)
    assert lines
    for line in lines:
        steps = steps_of(axes, line)
        inside = [(start, end) for start, end in windows if start <= min(steps) < end]
        assert inside, f"{line.get_label()} starts at step {min(steps)}, in no window"
        assert max(steps) < inside[0][1], f"{line.get_label()} crosses unmeasured steps {steps}"
    return lines
