"""The command lines describe themselves: ``ninfer --version`` and a help line for every subcommand and argument
of ``ninfer`` and ``ninfer-perf``."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninfer import cli

REPO = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        want = tomllib.load(f)["project"]["version"]
    with pytest.raises(SystemExit) as ei:
        cli.main(["--version"])
    assert ei.value.code == 0
    assert capsys.readouterr().out.strip() == f"ninfer {want}"
    import ninfer

    assert ninfer.__version__ == want


def _undocumented(p: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                if not helps.get(name):
                    yield f"{path} {name}"
                yield from _undocumented(sub, f"{path} {name}")
        elif not isinstance(a, argparse._HelpAction | argparse._VersionAction) and not (a.help or "").strip():
            yield f"{path} {'/'.join(a.option_strings) or a.dest}"


def test_every_argument_has_a_help_line() -> None:
    from ninfer.perf.cli import _parser as perf_parser

    missing = [*_undocumented(cli._parser(), "ninfer"), *_undocumented(perf_parser(), "ninfer-perf")]
    assert not missing, f"no help line: {missing}"
