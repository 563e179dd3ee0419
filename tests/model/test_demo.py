"""``python -m dsv4 demo`` end to end on the tiny preset, and its chunked-prefill schedule."""

from __future__ import annotations

import pytest

from dsv4.__main__ import main
from dsv4.model.cache_manager import ScheduledBatch
from dsv4.model.demo import prefill_batches


def test_prefill_schedule_chunks_under_the_budget():
    assert prefill_batches([700, 300, 100], 512) == [
        ScheduledBatch((0,), (512,), (512,)),
        ScheduledBatch((0, 1, 2), (188, 300, 24), (700, 300, 24)),
        ScheduledBatch((2,), (76,), (100,)),
    ]


def test_demo_runs_and_its_check_passes(capsys):
    argv = ["demo", "--preset", "tiny", "--prompts", "300,40", "--decode-steps", "2", "--step-tokens", "256"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for expected in ("demo: tiny (layers 0:swaonly, 1:c4a, 2:c128a)", "prefill [", "decode  [", "sparse_mla_decode",
                     "layer 2 c128a", "check passed"):
        assert expected in out


def test_version(capsys):
    import dsv4

    try:
        main(["--version"])
    except SystemExit as done:
        assert done.code == 0
    assert capsys.readouterr().out.strip() == f"dsv4 {dsv4.__version__}"


@pytest.mark.parametrize(("argv", "message"), [
    (["--prompts", "abc"], "argument --prompts: expected comma-separated token counts such as 2200,700, got 'abc'"),
    (["--prompts", "300,0"], "argument --prompts: prompt lengths must be positive"),
    (["--decode-steps", "0"], "argument --decode-steps: expected a positive integer, got 0"),
    (["--preset", "tiny", "--layers", "10"], "--layers 10: the tiny preset has 3 layers"),
])
def test_demo_rejects_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as done:
        main(["demo", *argv])
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_help_has_no_rst_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out
