"""The page as Gradio's conventions want it, checked on the built app without a server: a
numeric training curve with titled axes, one-click example primes, the API shown with the
named endpoints public, and a runs folder that can live on mounted storage (CHARGEN_RUNS)."""

import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return app.build_app(ROOT / "models", tmp_path_factory.mktemp("runs"))


def of_type(demo, kind):
    return [block for block in demo.blocks.values() if isinstance(block, kind)]


def test_the_curve_is_numeric_with_titled_axes(demo):
    """Both axes quantitative (as categories, 3.41 was drawn below 3.16), with readable ticks
    and titles with units; no frame before the first points (a chart Gradio first builds from
    an empty frame loses its y axis title)."""
    (plot,) = of_type(demo, gr.LinePlot)
    assert plot.value is None and plot.y_axis_format == ".2f"
    assert (plot.x_title, plot.y_title) == ("training time (seconds)", "training loss (bits per character)")
    for frame in (app.curve_frame([(10.0, 3)]), app.curve_frame([(10.0, 3.41), (20.0, 3.16)])):
        data = plot.postprocess(frame)
        assert data.datatypes == {"seconds": "quantitative", "bits/char": "quantitative"}
    long = [(float(t), 3.0) for t in range(1, 3001)]  # (thinned to a few hundred, the last point kept)
    assert len(app.curve_frame(long)) <= app.CURVE_POINTS + 1 and app.curve_frame(long)["seconds"].iloc[-1] == 3000
    data = plot.postprocess(app.curve_frame([(10.0, 3.41), (20.0, 3.16)]))
    assert [row[1] for row in data.data] == [3.41, 3.16] and all(isinstance(row[1], float) for row in data.data)


def test_example_primes_for_each_shipped_model(demo):
    samples = [sample for dataset in of_type(demo, gr.Dataset) for sample in dataset.raw_samples]
    assert {model for model, _ in samples} == {"shakespeare", "names"}
    assert ["shakespeare", "ROMEO:\n"] in samples


def test_the_api_is_shown_and_its_endpoints_are_public(demo):
    assert "api" in app.FOOTER_LINKS
    visibility = {d["api_name"]: d["api_visibility"] for d in demo.config["dependencies"]}
    public = {"generate", "continue", "describe", "train", "stop_training"}
    assert {name for name, shown in visibility.items() if shown == "public"} == public
    assert all(shown == "private" for name, shown in visibility.items() if name not in public), visibility


def test_the_runs_folder_comes_from_chargen_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("CHARGEN_RUNS", str(tmp_path / "bucket" / "runs"))
    assert app.make_parser().parse_args([]).runs == tmp_path / "bucket" / "runs"
    monkeypatch.delenv("CHARGEN_RUNS")
    assert app.make_parser().parse_args([]).runs == Path("runs")
