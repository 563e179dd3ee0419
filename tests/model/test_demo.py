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


# DeepSeek-V4.1 end to end: 1500 tokens give the ratio-1 layers 1500 entries (more than the top-512) and the
# two-level layer 96 candidate blocks of 8 to choose inside; fp4 compressed caches and fp8 keys in the second run.
LONG_TINY_V41 = ["demo", "--preset", "tiny-v4.1", "--layers", "5", "--prompts", "1500,40", "--decode-steps", "2",
                 "--step-tokens", "512"]


@pytest.mark.parametrize("records", [[], ["--kv-cache-dtype", "nvfp4_ds_mla", "--index-key-format", "fp8"]],
                         ids=["fp8-mxfp4", "fp4-fp8"])
def test_v41_demo_passes_its_check(capsys, records):
    assert main(LONG_TINY_V41 + records) == 0
    out = capsys.readouterr().out
    for expected in ("tiny-v4.1 (layers 0:swaonly, 1:c2a, 2:c2a, 3:c1a, 4:c1a)", "layer 2 c2a      (kv 1, index 1)",
                     "request 0: candidate blocks recall", "request 0: two-level selection recall", "check passed"):
        assert expected in out


@pytest.mark.parametrize("fault", ["selection", "candidates", "output", "slots"])
def test_v41_check_fails_on_a_planted_fault(capsys, monkeypatch, fault):
    """Planted faults: the top-k takes the lowest scores; the candidate blocks the lowest-scoring blocks; the
    attention output 10 % too large; every mapped slot (the compressed entries' and the compressor windows') one
    entry off."""
    import torch

    from dsv4 import ops
    from dsv4.model import layer_v41

    if fault == "selection":
        exact = ops.topk_transform
        monkeypatch.setattr(ops, "topk_transform", lambda logits, *args, **kwargs: exact(-logits, *args, **kwargs))
    elif fault == "candidates":
        exact_blocks = layer_v41.select_candidate_blocks
        monkeypatch.setattr(layer_v41, "select_candidate_blocks", lambda logits, *args: exact_blocks(
            torch.where(torch.isfinite(logits), -logits, logits), *args))
    elif fault == "output":
        exact_decode = ops.sparse_mla_decode

        def scaled(*args, **kwargs):
            out, lse = exact_decode(*args, **kwargs)
            return out * 1.1, lse

        monkeypatch.setattr(ops, "sparse_mla_decode", scaled)
    else:
        exact_map = ops.map_local_to_global_slots
        monkeypatch.setattr(ops, "map_local_to_global_slots", lambda local, *args: exact_map(
            torch.where(local >= 0, local + 1, local), *args))
    assert main(LONG_TINY_V41) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "check FAILED" in out
