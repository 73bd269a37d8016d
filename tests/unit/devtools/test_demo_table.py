"""The demo's table alone (no cluster): what it prints when rows change, on a terminal and not."""

from __future__ import annotations

import io

import pytest

from cosyvoice_operator.devtools import demo as demo_module
from cosyvoice_operator.devtools.demo import Demo


@pytest.mark.parametrize("tty", [False, True])
def test_the_table_prints_what_changed_or_redraws_in_place(tty: bool) -> None:
    rows = [
        demo_module.Row("cosyvoice3", "Ready", "1/1", "1", "1", "12", "100", "holding at 1"),
    ]
    out = io.StringIO()
    d = Demo.__new__(Demo)  # the drawing alone: no cluster
    d.out, d.tty, d.load, d._drawn, d._last_rows, d.changes = out, tty, None, 0, {}, []
    d.shape = demo_module.Load()
    d.fleet = d.servers = None  # no router, no pods: the router line is empty
    d._draw(rows)
    d._draw(rows)
    rows[0].desired = "3"
    d._draw(rows)
    text = out.getvalue()
    if tty:
        # Every refresh after the first moves back over the last one and clears it.
        assert text.count("\x1b[J") == 2 and text.count("cosyvoice3") == 3
    else:
        # Unchanged rows are not printed again.
        assert "\x1b[" not in text and text.count("cosyvoice3") == 2
