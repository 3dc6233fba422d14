"""`p3o plot`: every panel has a caption, and the captions are drawn."""

from __future__ import annotations

import json

from p3o.metrics import CAPTIONS, PANELS, plot_run


def test_every_panel_has_a_caption():
    assert set(CAPTIONS) == {title for title, _, _ in PANELS}
    assert all(0 < len(c) <= 90 for c in CAPTIONS.values())  # one short line each


def test_captions_are_drawn(tmp_path, monkeypatch):
    keys = {key for _, _, series in PANELS for key, _ in series}  # every panel's curves (agent, task panels too)
    rows = [{"step": s, **{k: 0.1 * s for k in keys}} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn: list[str] = []
    from matplotlib.axes import Axes

    text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: drawn.append(s) or text(self, x, y, s, *a, **k))
    plot_run(tmp_path)
    assert sorted(drawn) == sorted(CAPTIONS.values())


def test_the_agent_panels_draw_each_stop_reason(tmp_path, monkeypatch):
    """Issue 51 item 8: episode/stop_<reason> counts are curves of their own, one per reason the run logged."""
    rows = [
        {"step": s, "episode/turns": 2.0, "episode/stop_done": 14.0 - s, "episode/stop_env_error": float(s)}
        for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels: list[str] = []
    from matplotlib.axes import Axes

    plot = Axes.plot
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **k: labels.append(k.get("label")) or plot(self, *a, **k))
    plot_run(tmp_path)
    assert {"done", "env_error"} <= set(labels)
