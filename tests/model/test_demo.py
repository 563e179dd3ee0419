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


LONG_TINY = ["demo", "--preset", "tiny", "--prompts", "2300,40", "--decode-steps", "1", "--step-tokens", "1024"]


def test_check_passes_where_the_indexer_selects(capsys):
    """2300 tokens: 575 compressed entries, more than the top-512, so the C4A selection is checked."""
    assert main(LONG_TINY) == 0
    out = capsys.readouterr().out
    assert "request 0: selection recall" in out and "check passed" in out


def test_check_fails_on_a_wrong_selection(capsys, monkeypatch):
    """A planted fault: the decode top-k takes the lowest-scoring entries."""
    from dsv4 import ops

    exact = ops.topk_transform
    monkeypatch.setattr(ops, "topk_transform", lambda logits, *args, **kwargs: exact(-logits, *args, **kwargs))
    assert main(LONG_TINY) == 1
    out = capsys.readouterr().out
    assert "request 0: selection recall" in out and "FAIL" in out and "check FAILED" in out


def test_check_fails_on_a_wrong_attention_output(capsys, monkeypatch):
    """A planted fault: the sparse MLA decode output 10 % too large."""
    from dsv4 import ops

    exact = ops.sparse_mla_decode

    def scaled(*args, **kwargs):
        out, lse = exact(*args, **kwargs)
        return out * 1.1, lse

    monkeypatch.setattr(ops, "sparse_mla_decode", scaled)
    assert main(LONG_TINY) == 1
    assert "check FAILED" in capsys.readouterr().out
