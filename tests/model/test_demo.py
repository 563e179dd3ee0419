"""``python -m dsv4 demo`` end to end on the tiny preset, and its chunked-prefill schedule."""

from __future__ import annotations

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
    argv = ["demo", "--preset", "tiny", "--prompts", "300,40", "--decode-steps", "2", "--layers", "3",
            "--step-tokens", "256"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for expected in ("layers 0:swaonly, 1:c4a, 2:c128a", "prefill [", "decode  [", "sparse_mla_decode",
                     "layer 2 c128a", "check passed"):
        assert expected in out
