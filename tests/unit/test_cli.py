"""The command line: ``python -m functional_mesh show ...`` and the ``functional-mesh`` script."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import functional_mesh as fm
from functional_mesh.__main__ import main, use_color


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_show_prints_the_same_picture_as_visualize(capsys):
    out = run(capsys, "show", "dp=2,cp=2,tp=2", "--axis", "tp")
    assert out == fm.visualize(fm.make_mesh((2, 2, 2), ("dp", "cp", "tp")), axis="tp") + "\n"


@pytest.mark.parametrize("argv, expected", [
    (["--select", "tp,dp"], lambda m: m["tp", "dp"]),
    (["--select", "tp"], lambda m: m["tp"]),
    (["--flatten", "dp,cp:dp_cp"], lambda m: m.flatten(("dp", "cp"), name="dp_cp")),
    (["--flatten", "cp,dp"], lambda m: m.flatten(("cp", "dp"))),
    (["--transpose", "tp,dp,cp"], lambda m: m.transpose("tp", "dp", "cp")),
    (["--rename", "dp=data,tp=dp"], lambda m: m.rename({"dp": "data", "tp": "dp"})),
    (["--take", "dp=1"], lambda m: m.take(dp=1)),
    (["--take", "dp=-2"], lambda m: m.take(dp=0)),
    (["--take", "cp=1,0"], lambda m: m.take(cp=[1, 0])),
    (["--take", "cp=1,"], lambda m: m.take(cp=[1])),
    (["--take", "tp=::-1"], lambda m: m.take(tp=slice(None, None, -1))),
    (["--take", "tp=1:"], lambda m: m.take(tp=slice(1, None))),
    # transformations apply in command-line order
    (["--flatten", "dp,cp:x", "--unflatten", "x:a=2,b=2", "--select", "b,tp"],
     lambda m: m.flatten(("dp", "cp"), name="x").unflatten("x", {"a": 2, "b": 2})["b", "tp"]),
    (["--select", "tp", "--take", "tp=1", "--take", "dp=0"], None),  # tp taken: no axis dp to take
])
def test_transformations_match_the_library(capsys, argv, expected):
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    if expected is None:
        with pytest.raises(SystemExit):
            main(["show", "dp=2,cp=2,tp=2", *argv])
        assert "`Mesh.take` requires an axis name of the mesh, but got axis='dp'" in capsys.readouterr().err
        return
    assert run(capsys, "show", "dp=2,cp=2,tp=2", *argv) == fm.visualize(expected(mesh)) + "\n"


def test_take_shows_the_kept_ranks(capsys):
    assert run(capsys, "show", "pp=4,tp=2", "--take", "pp=0,3").splitlines()[:4] == [
        "Mesh(pp=2, tp=2; devices [0, 1, 6, 7]): 4 devices",
        "      tp=0  tp=1",
        "pp=0  0     1",
        "pp=1  6     7",
    ]


def test_devices_ranges_and_lists(capsys):
    out = run(capsys, "show", "dp=2,tp=4", "--devices", "8-11,20,21-23")
    mesh = fm.make_mesh((2, 4), ("dp", "tp"), devices=[8, 9, 10, 11, 20, 21, 22, 23])
    assert out == fm.visualize(mesh) + "\n"


def test_megatron_order_string(capsys):
    out = run(capsys, "show", "tp=2,cp=2,dp=2,pp=2", "--order", "tp-cp-dp-pp")
    assert out == fm.visualize(fm.mesh_from_order("tp-cp-dp-pp", tp=2, cp=2, dp=2, pp=2)) + "\n"


def test_host_span_and_sharding_sections(capsys):
    out = run(capsys, "show", "dp=2,cp=2,tp=2", "--ranks-per-host", "4", "--spec", "('dp','cp'),None",
              "--shape", "5,6")
    _, hosts, sharding = out.rstrip("\n").split("\n\n")
    assert hosts.splitlines() == ["host span (4 ranks per host):", "  dp  cross-host", "  cp  intra-host",
                                  "  tp  intra-host"]
    mesh = fm.make_mesh((2, 2, 2), ("dp", "cp", "tp"))
    assert sharding == fm.visualize_sharding(fm.NamedSharding(mesh, fm.P(("dp", "cp"), None)), (5, 6))
    # bare names work as well as Python literals
    assert run(capsys, "show", "dp=2,cp=2,tp=2", "--spec", "(dp,cp),None", "--shape", "5,6").endswith(
        sharding + "\n")


def test_color_always_auto_never(capsys):
    assert "\x1b[" in run(capsys, "show", "a=2,b=2", "--axis", "a", "--color", "always")
    assert "\x1b[" not in run(capsys, "show", "a=2,b=2", "--axis", "a")  # auto: captured output is no tty
    assert "\x1b[" not in run(capsys, "show", "a=2,b=2", "--axis", "a", "--color", "never")


@pytest.mark.parametrize("choice, isatty, env, expected", [
    ("auto", True, {}, True), ("auto", False, {}, False), ("auto", True, {"NO_COLOR": "1"}, False),
    ("auto", True, {"NO_COLOR": ""}, True), ("always", False, {"NO_COLOR": "1"}, True), ("never", True, {}, False),
])
def test_auto_color_means_a_terminal_without_no_color(choice, isatty, env, expected):
    assert use_color(choice, isatty, env) is expected


@pytest.mark.parametrize("argv, message", [
    (["show", "dp=2,tpp=2", "--select", "tp"], r"axis='tp'; valid: \('dp', 'tpp'\); did you mean 'tpp'\?"),
    (["show", "dp=x"], r"'dp=x'"),
    (["show", "dp=2,dp=2"], r"'dp' twice"),
    (["show", "dp=0"], r"axis_sizes\['dp'\]=0"),
    (["show", "dp=2", "--devices", "3-1"], r"'3-1'"),
    (["show", "dp=2", "--devices", "a"], r"'a'"),
    (["show", "dp=2", "--devices", "0-2"], r"len\(devices\)=3"),
    (["show", "dp=2", "--spec", "dp"], r"--spec and --shape go together"),
    (["show", "dp=2", "--spec", "(dp", "--shape", "4"], r"'\(dp'"),
    (["show", "dp=2", "--spec", "dq", "--shape", "4"], r"'dq'"),
    (["show", "dp=2", "--spec", "dp", "--shape", "4,x"], r"'4,x'"),
    (["show", "dp=4", "--unflatten", "dp:a=3,b=2"], r"dp"),
    (["show", "dp=4", "--unflatten", "dp"], r"AXIS:a=2,b=4, but got 'dp'"),
    (["show", "dp=2,tp=2", "--transpose", "tp"], r"tp"),
    (["show", "dp=2", "--rename", "dp"], r"OLD=NEW"),
    (["show", "dp=2", "--take", "dp"], r"--take requires AXIS=INDEX like .*, but got 'dp'"),
    (["show", "dp=2", "--take", "dp=x"], r"comma-separated ints after AXIS=, but got 'x' in 'dp=x'"),
    (["show", "dp=2", "--take", "dp=0,,1"], r"but got '0,,1'"),
    (["show", "dp=2", "--take", "dp=2"], r"`Mesh.take` requires a position of axis 'dp' \(size 2\), but got dp=2"),
    (["show", "dp=2", "--take", "dp=1:1"], r"non-empty selection of axis 'dp'"),
    (["show", "dp=2", "--flatten", ","], r"','"),
    (["show", "dp=2", "--ranks-per-host", "0"], r"'0'"),
    (["show", "dp=2", "--axis", "tp"], r"axis='tp'"),
    (["show", "tp=2", "--order", "tp-dp"], r"no size for \['dp'\]"),
    (["shw", "dp=2"], r"invalid choice: 'shw'"),
    (["show"], r"the following arguments are required: mesh"),
])
def test_bad_arguments_exit_2_naming_the_value(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_help_lists_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["show", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert 'functional-mesh show "dp=2,cp=2,tp=2" --spec' in out and "--ranks-per-host" in out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(fm.__file__).parent.parent), "NO_COLOR": "1"}


def test_python_dash_m_and_the_console_script_run_without_torch():
    argv = ["show", "dp=2,tp=2", "--ranks-per-host", "2"]
    expected = subprocess.run([sys.executable, "-c",
                               "import sys; from functional_mesh.__main__ import main, use_color; main(sys.argv[1:]); "
                               "assert 'torch' not in sys.modules, 'the CLI imported torch'", *argv],
                              capture_output=True, text=True, env=_env(), timeout=60)
    assert expected.returncode == 0, expected.stderr
    by_module = subprocess.run([sys.executable, "-m", "functional_mesh", *argv], capture_output=True, text=True,
                               env=_env(), timeout=60)
    assert (by_module.returncode, by_module.stdout) == (0, expected.stdout)
    script = Path(sys.executable).parent / "functional-mesh"
    assert script.exists(), "pip install -e . installs the functional-mesh console script"
    by_script = subprocess.run([str(script), *argv], capture_output=True, text=True, env=_env(), timeout=60)
    assert (by_script.returncode, by_script.stdout) == (0, expected.stdout)
    bad = subprocess.run([str(script), "show", "dp=2", "--select", "tp"], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert bad.returncode == 2 and "axis='tp'" in bad.stderr


def test_a_reader_that_closes_the_pipe_first_ends_the_program_quietly():
    script = str(Path(sys.executable).parent / "functional-mesh")
    # `| head -n 1` through a real shell pipe, on a picture (~68 kB) larger than the pipe's buffer:
    # head leaves after one line, and the program's next write finds no reader.
    big = ["show", "dp=64,tp=64", "--max-side", "64"]
    piped = subprocess.run(["sh", "-c", 'exec 2>&1; "$0" "$@" | head -n 1', script, *big], capture_output=True,
                           text=True, env=_env(), timeout=60)
    assert piped.stdout == "Mesh(dp=64, tp=64): 4096 devices\n", piped.stdout[-2000:]
    # A pipe whose read end is closed before the program writes: every write fails, the small
    # picture's too (it would fail only in the interpreter's last flush), so the status is certain.
    for argv in (big, ["show", "dp=2,tp=2"]):
        read, write = os.pipe()
        proc = subprocess.Popen([script, *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=_env())
        os.close(write)
        os.close(read)
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (141, ""), argv


DOCS = Path(__file__).resolve().parents[2] / "docs"
SESSION = re.compile(r"^```\n\$ (functional-mesh [^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_command_line_sessions_in_the_docs_print_what_they_show(capsys):
    sessions = [m for page in sorted(DOCS.glob("*.md")) for m in SESSION.finditer(page.read_text())]
    assert sessions, "docs show at least one functional-mesh session"
    for m in sessions:
        argv = shlex.split(m[1])[1:]
        assert run(capsys, *argv, "--color", "never") == m[2], m[1]


def test_the_examples_of_the_command_line_module_run():
    # pytest's --doctest-modules leaves __main__.py out (it would run the program), so run them here
    import doctest

    import functional_mesh.__main__ as cli

    result = doctest.testmod(cli, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 1 and result.failed == 0
