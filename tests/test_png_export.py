"""save_figure's PNG step: kaleido failures are retried, then skipped with a warning (the
HTML is written either way), so that a figure cannot end a long run."""

import warnings

import pytest

from cwlens.plotting import export


class FlakyFigure:
    """A figure whose PNG export fails ``failures`` times (as kaleido does under load)."""

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def write_html(self, path, **kwargs):
        path.write_text("<html></html>")

    def write_image(self, path, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("ReferenceError: kaleido_scopes is not defined")
        path.write_bytes(b"\x89PNG")


@pytest.fixture(autouse=True)
def a_browser(monkeypatch):
    monkeypatch.setattr(export, "find_chrome", lambda: "/usr/bin/true")
    monkeypatch.delenv("BROWSER_PATH", raising=False)


def test_a_failure_below_the_limit_is_retried(tmp_path):
    fig = FlakyFigure(export.PNG_TRIES - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = export.save_figure(fig, tmp_path / "f")
    assert [p.name for p in written] == ["f.html", "f.png"] and fig.calls == export.PNG_TRIES


def test_persistent_failures_warn_and_keep_the_html(tmp_path):
    fig = FlakyFigure(10)
    with pytest.warns(UserWarning, match=r"f\.png was not written: kaleido failed 3 times .*kaleido_scopes"):
        written = export.save_figure(fig, tmp_path / "f")
    assert [p.name for p in written] == ["f.html"] and (tmp_path / "f.html").exists()
    assert not (tmp_path / "f.png").exists() and fig.calls == export.PNG_TRIES


def test_the_browser_path_is_not_left_in_the_environment(tmp_path):
    """A fake browser set for one export must not reach later tests (in CI it did: the
    report's screenshot test then ran ``/usr/bin/true``, which exits 0 and writes nothing)."""
    import os

    export.save_figure(FlakyFigure(0), tmp_path / "f")
    assert "BROWSER_PATH" not in os.environ


@pytest.mark.parametrize("stem, name", [("edges_captured_qwen2.5-coder-0.5b-gsm8k-logprob",
                                         "edges_captured_qwen2.5-coder-0.5b-gsm8k-logprob"),
                                        ("fig.png", "fig"), ("fig.html", "fig")])
def test_a_dot_in_the_stem_stays(tmp_path, stem, name):
    """A model name with a dot (qwen2.5, llama-3.1) was cut at it: edges_captured_qwen2.html."""
    written = export.save_figure(FlakyFigure(0), tmp_path / stem)
    assert [p.name for p in written] == [f"{name}.html", f"{name}.png"]
