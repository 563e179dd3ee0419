"""The stall summary of an Nsight Compute SASS export (tools/perf/ncu_stalls.py): instructions, regions, reasons."""

import pytest

from tools.perf import ncu_stalls

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_barrier","stall_long_sb","stall_no_inst","stall_long_sb (Not Issued)"')
# A start run once per warp (512), a loop body (5,120) around a never-executed branch, then the end (512).
ROWS = [
    ('"0x10"', "S2R R0, SR_TID.X", 3, 512, 0, 0, 3, 0),
    ('"0x20"', "BAR.SYNC 0x1", 9, 512, 9, 0, 0, 0),
    ('"0x30"', "LDG.E R2, [R4]", 1, 5120, 0, 0, 1, 0),
    ('"0x40"', "FMUL R3, R2, R2", 40, 5120, 0, 40, 0, 40),
    ('"0x50"', "CALL.REL 0x900", 0, 0, 0, 0, 0, 0),
    ('"0x60"', "BRA 0x30", 2, 5120, 0, 1, 1, 1),
    ('"0x70"', "EXIT", 5, 512, 0, 0, 5, 0),
]


def export(rows=ROWS, second_kernel=False):
    lines = ['"Kernel Name","kernel_a"', HEADER]
    lines += [",".join([a, f'"{s}"', *(f'"{v:,}"' for v in rest)]) for a, s, *rest in rows]
    if second_kernel:
        lines += ['"Kernel Name","kernel_b"', HEADER, '"0x10","NOP","99","1","99","0","0","0"']
    return lines


def test_instructions_and_reasons():
    ins = ncu_stalls.read_instructions(export())
    assert [i.executed for i in ins] == [512, 512, 5120, 5120, 0, 5120, 512]
    assert ins[3].samples == 40 and ins[3].reasons == {"long_sb": 40}  # the "(Not Issued)" column is not a reason
    assert ins[4].reasons == {}


def test_regions_keep_unexecuted_code_inside_its_run():
    runs = ncu_stalls.regions(ncu_stalls.read_instructions(export()))
    assert [(r.first, r.last, r.executed, r.samples) for r in runs] == [(0, 1, 512, 12), (2, 5, 5120, 43),
                                                                      (6, 6, 512, 5)]
    assert runs[1].reasons == {"long_sb": 41, "no_inst": 2}


def test_only_the_first_kernel_is_read():
    assert len(ncu_stalls.read_instructions(export(second_kernel=True))) == len(ROWS)


def test_report_lists_regions_and_top_instructions():
    text = ncu_stalls.report(ncu_stalls.read_instructions(export()), min_samples=10, top=2)
    assert text.splitlines()[0] == "7 instructions, 60 samples"
    assert "long_sb 41" in text and "barrier 9" in text
    region_lines = [line for line in text.splitlines() if "%" in line]
    assert len(region_lines) == 2 and "71.7%" in region_lines[1]  # the 5-sample end is under min_samples
    top = text.split("top 2 instructions")[1].splitlines()[1:]
    assert "FMUL" in top[0] and "BAR.SYNC" in top[1]


def test_not_an_export():
    with pytest.raises(ValueError, match="not an ncu SASS source export"):
        ncu_stalls.read_instructions(['"Kernel Name","k"', '"a","b"'])
