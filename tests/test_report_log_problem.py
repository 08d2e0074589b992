"""A compile log truncated under a running kernel: the next report says its causes are unknown
(and never shows older events as the cell's)."""

from __future__ import annotations


def test_truncated_compile_log_is_said_in_the_report(py, tmp_path):
    out = py(f"""
        import os
        os.environ["TMPDIR"] = {str(tmp_path)!r}
        import torch, torch_xla, tpu_nb
        from tpu_nb.display.reports import RunView
        from tpu_nb.runtime.backend import current
        tpu_nb.setup("cpu")
        dev = tpu_nb.device()
        with tpu_nb.track() as first:
            a = (torch.ones(3, device=dev) * 2).sum()
            torch_xla.sync()
        with tpu_nb.track() as second:
            b = (torch.ones(5, device=dev) * 3).sum()
            torch_xla.sync()
            open(current().process.compile_log_path(), "w").close()     # truncated, mid-cell
            c = (torch.ones(7, device=dev) * 4).sum()
            torch_xla.sync()
        print("FIRST", first.metrics.compiles, len(first.compile_events),
              repr(first.compile_log_problem))
        old = {{f.graph_hash for f in first.compile_events}}
        print("SECOND", second.metrics.compiles,
              [e.graph_hash in old for e in second.compile_events])
        print("TEXT", RunView(second).text())
    """).stdout
    first = out.split("FIRST ")[1].split("\\n")[0]
    assert first.startswith("1 1 ''"), out
    second = out.split("SECOND ")[1].split("\\n")[0]
    assert "True" not in second  # no old event shown as this run's
    assert "compile causes unknown for this cell: the compile log" in out
