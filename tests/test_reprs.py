"""Python objects that print well (issue 20 item 6): one-line reprs, notebook HTML, a quiet validate."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")

import pipesim  # noqa: E402
from pipesim.plots import notebook  # noqa: E402
from cli_runner import ROOT  # noqa: E402


def small() -> pipesim.Result:
    profile = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, activation_bytes=1e6,
                                      param_bytes=1e6)
    return pipesim.simulate(profile, pipesim.Topology.uniform(num_devices=4), schedule="1f1b", num_stages=4,
                            num_microbatches=8, engine="analytic")


def test_repr_of_a_result_schedule_and_trace_is_one_line() -> None:
    result = small()
    assert repr(result) == ("<Result 1f1b p=4 m=8 K=1, analytic engine: iteration time 66 ms, 121.2 samples/s, "
                            "bubble 27.3%, peak memory 0.014 GB>")  # (m+p-1)(tf+tb) = 11 x 6 ms
    assert repr(result.schedule) == "<Schedule 1f1b: 4 stages on 4 ranks, m=8, K=1, flush weights>"
    assert repr(pipesim.build_schedule("interleaved-1f1b", 8, 8, num_ranks=4)) == \
        "<Schedule interleaved-1f1b: 8 stages on 4 ranks, m=8, K=1, flush weights>"
    # 4 x 8 x (F, B) + 4 U compute spans, 3 links x 8 x 2 sends
    assert repr(result.trace) == "<Trace 1f1b p=4 m=8 K=1: 116 spans, 76 memory events, makespan 66 ms>"



def test_repr_of_a_profile_is_one_short_line() -> None:
    # VGG-16 as PipeDream measured it: 672 ms forward and backward at batch 128 (traces/README.md).
    profile = pipesim.load_profile(ROOT / "traces" / "vgg16.json")
    assert repr(profile) == str(profile) == (
        "<Profile 'vgg16': 41 layers, microbatch 128, forward 233.9 ms + backward 438.6 ms, parameters 0.5534 GB, "
        "float32 on 'V100 (assumed; PipeDream profiles)'>")
    assert repr(pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3, param_bytes=1e6)) == (
        "<Profile 'uniform': 8 layers, microbatch 1, forward 8 ms + backward 16 ms, parameters 0.008 GB, "
        "float32 on 'synthetic'>")

def test_the_repl_echoes_one_line_per_object_and_nothing_for_validate() -> None:
    session = ("import pipesim\n"
               "p = pipesim.uniform_profile(num_layers=8, forward_s=1e-3, backward_s=2e-3)\n"
               "r = pipesim.simulate(p, pipesim.Topology.uniform(num_devices=4), schedule='gpipe', num_stages=4, "
               "num_microbatches=8)\n"
               "r\nr.trace\nr.schedule\npipesim.validate(r.schedule)\n")
    done = subprocess.run([sys.executable, "-i", "-q"], input=session, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    echoed = [line.removeprefix(">>> ").removeprefix("... ") for line in done.stdout.splitlines()]
    echoed = [line for line in echoed if line.strip(">. ")]
    assert [line.split(" ")[0] for line in echoed] == ["<Result", "<Trace", "<Schedule"], done.stdout + done.stderr


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: list[str] = []
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.ids += [value or "" for name, value in attrs if name == "id"]

    def handle_data(self, data: str) -> None:
        if self.tags and self.tags[-1] in ("td", "th"):
            self.cells.append(data)


def test_notebook_html_is_a_summary_table_and_the_timeline() -> None:
    result = small()
    for html in (result_html := notebook.result_html(result), notebook.trace_html(result.trace)):
        parsed = _Tags()
        parsed.feed(html)
        assert parsed.tags[:2] == ["table", "tr"] and "svg" in parsed.tags
        assert {"compute:F", "compute:B", "idle"} <= set(parsed.ids)  # the timeline's collections, by gid
    summary = _Tags()
    summary.feed(result._repr_html_())
    assert "svg" not in summary.tags and "27.3%" in summary.cells and "1f1b" in summary.cells
    assert result_html.startswith(result._repr_html_())
    assert notebook.register() is False  # no IPython session here to register with
