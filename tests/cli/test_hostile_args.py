"""Hostile arguments: an empty, blank or whitespace-only path is a usage error (exit 2, one
line) for every command and writes nothing (taken as is it would be the current directory);
every numeric option refuses what it cannot represent with exit 2 and one line, never a
traceback."""

import os

import pytest

from chainrows.cli import COMMANDS, main

# Each command's arguments, "P" where a path goes (positional or an option's value).
PATHS = {"reassemble": ["P", "P"], "synth": ["P", "--rollouts", "3"], "import-jsonl": ["P"] * 4,
         "stats": ["P"], "import-gym": ["P", "P"], "export-gym": ["P"] * 4, "import-calls": ["P"] * 3,
         "explain": ["P", "r1"], "inspect": ["P", "--data", "P", "--html", "P"],
         "pack": ["P", "P", "--max-tokens", "10"]}
BLANKS = ["", " ", "\t", " \n "]


def test_every_command_is_covered():
    assert set(PATHS) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(PATHS))
@pytest.mark.parametrize("blank", BLANKS)
def test_blank_path_is_a_usage_error(command, blank, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    args = PATHS[command]
    for k in [i for i, a in enumerate(args) if a == "P"]:
        argv = [command] + [(blank if i == k else f"p{i}") if a == "P" else a for i, a in enumerate(args)]
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and "empty or blank path" in err[0], (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_check_destination_refuses_a_blank_path(tmp_path):
    from chainrows.errors import InputError
    from chainrows.outdir.atomic import check_destination

    for out, inputs in ((" ", ()), (tmp_path / "o", ["", tmp_path])):
        with pytest.raises(InputError, match="empty or blank"):
            check_destination(out, inputs=inputs)


@pytest.mark.parametrize("argv", [
    ["reassemble", "d", "o", "--memory-budget", v] for v in ("1e400", "1e400GiB", "1e300TiB", "2e18", ".", "e",
                                                              "nan", "inf", "-1GiB", "0")
] + [["import-gym", "d", "o", "--memory-budget", "1e400GiB"], ["import-calls", "c", "r", "o", "--memory-budget", "1e400"],
     ["stats", "d", "--memory-budget", "1e400"]] + [
    ["reassemble", "d", "o", opt, v] for opt in ("--threads", "--buckets", "--steps")
    for v in ("0", "-1", str(1 << 63), "1" * 5000, "1.5", "nan")
] + [["synth", "o", opt, v] for opt in ("--rollouts", "--seed", "--group-size", "--mean-gen-tokens", "--workers")
     for v in ("-1", str(1 << 64), "1e3", "nan", "")] + [
    ["synth", "o", "--mean-gen-tokens", str(1 << 31)], ["synth", "o", "--corrupt-rate", "1e400"],
    ["synth", "o", "--fork-rate", "-inf"],
] + [["inspect", "o", "--html", "f.html", "--sample", v] for v in ("0", "-1", str(1 << 64), "1e400", "nan")] + [
    ["pack", "o", "p", "--max-tokens", v] for v in ("0", "-1", str(1 << 64), "1e400", "nan")
] + [["pack", "o", "p", "--max-tokens", "100", opt, v] for opt in ("--world-size", "--seed")
     for v in ("-1", str(1 << 64), "1e400", "nan")])
def test_numeric_option_it_cannot_represent_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("chainrows: error: argument"), err
