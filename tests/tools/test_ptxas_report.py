"""The ptxas -v log filter behind the CUDA compile check (tools/check/ptxas_report.py): spills, serialized wgmma and
a dropped setmaxnreg fail, each on the function it concerns and only for the architecture asked for."""

import sys

from tools.check import ptxas_report


def log(kernel_b_frame="0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", serialized_in=None,
        setmaxnreg_ignored=False):
    lines = [
        "ptxas info    : Compiling entry function '_Z8kernel_av' for 'sm_90a'",
        "ptxas info    : Function properties for _Z8kernel_av",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 128 registers, used 16 barriers",
        "ptxas info    : Compiling entry function '_Z8kernel_bv' for 'sm_90a'",
    ]
    if serialized_in is not None:
        lines.append("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized"
                     f" due to insufficient register resources for the function '{serialized_in}'")
    if setmaxnreg_ignored:
        lines.append("ptxas info    : (C7507) 'setmaxnreg' ignored to maintain minimum register requirements.")
    lines += [
        "ptxas info    : Function properties for _Z8kernel_bv",
        f"    {kernel_b_frame}",
        "ptxas info    : Used 96 registers",
        "ptxas info    : Compiling entry function '_Z8kernel_av' for 'sm_80'",
        "ptxas info    : Function properties for _Z8kernel_av",
        "    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads",
    ]
    return lines


def run(tmp_path, capsys, monkeypatch, lines):
    path = tmp_path / "build.log"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(sys, "argv", ["ptxas_report.py", str(path), "--arch", "sm_90a"])
    code = ptxas_report.main()
    return code, capsys.readouterr()


def test_clean_log_passes_and_other_archs_are_ignored(tmp_path, capsys, monkeypatch):
    code, out = run(tmp_path, capsys, monkeypatch, log())
    assert code == 0
    assert "2 sm_90a function(s), none spills, no wgmma serialized, setmaxnreg kept" in out.out


def test_spill_fails(tmp_path, capsys, monkeypatch):
    code, out = run(tmp_path, capsys, monkeypatch,
                    log("16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads"))
    assert code == 1 and "spill" in out.err and "kernel_b" in out.err


def test_serialized_wgmma_fails(tmp_path, capsys, monkeypatch):
    functions = ptxas_report.parse(log(serialized_in="_Z8kernel_bv"), "sm_90a")
    assert [f.serialized for f in sorted(functions, key=lambda f: f.name)] == [False, True]
    code, out = run(tmp_path, capsys, monkeypatch, log(serialized_in="_Z8kernel_bv"))
    assert code == 1 and "wgmma serialized" in out.err and "kernel_b" in out.err


def test_serialized_wgmma_in_a_called_function_fails(tmp_path, capsys, monkeypatch):
    # ptxas names the function whose products it serialized: a device function the kernel calls counts too
    functions = {f.name: f for f in ptxas_report.parse(log(serialized_in="_Z6devicev$83"), "sm_90a")}
    assert functions["_Z6devicev$83"].serialized and not functions["_Z6devicev$83"].entry
    assert not functions["_Z8kernel_bv"].serialized
    code, out = run(tmp_path, capsys, monkeypatch, log(serialized_in="_Z6devicev$83"))
    assert code == 1 and "wgmma serialized" in out.err


def test_dropped_setmaxnreg_fails(tmp_path, capsys, monkeypatch):
    code, out = run(tmp_path, capsys, monkeypatch, log(setmaxnreg_ignored=True))
    assert code == 1 and "setmaxnreg ignored" in out.err and "kernel_b" in out.err
