"""`python -m loadtest` is the one command line: every benchmark is a command that answers --help, every command
the docs give exists, and every module of loadtest/ is in its README (or docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from devstack.tritonserver import REPO_ROOT
from loadtest.cli import BENCHMARKS, main

LOADTEST = REPO_ROOT / "loadtest"
SWEEPS = ("gateway", "triton", "corpus")
# where commands are given to people (loadtest/results/latest/ holds records of what ran then, left as they are)
DOCS = sorted({REPO_ROOT / "README.md", *REPO_ROOT.glob("docs/*.md"), *REPO_ROOT.glob("*/README.md"),
               LOADTEST / "device" / "README.md"})
COMMAND = re.compile(r"-m loadtest(?:\.(?P<module>[\w.]+)| (?P<command>[a-z][\w-]*))")


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in (*SWEEPS, *BENCHMARKS)), out


@pytest.mark.parametrize("name", [*SWEEPS, *BENCHMARKS])
def test_every_command_answers_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m loadtest {name} ")


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["gpu"])
    assert exit_.value.code == 2
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is gone too
        return False


def test_every_command_in_the_docs_exists() -> None:
    found, stale = 0, []
    for doc in DOCS:
        for match in COMMAND.finditer(doc.read_text()):
            module, command = (match["module"] or "").rstrip("."), match["command"]
            if module and not module.islower():
                continue  # a placeholder: loadtest.MODULE
            found += 1
            exists = _module_exists(f"loadtest.{module}") if module else command in (*SWEEPS, *BENCHMARKS)
            if not exists:
                stale.append(f"{doc.relative_to(REPO_ROOT)}: {match[0]}")
    assert found > 20 and not stale, stale


def test_every_module_is_documented() -> None:
    readme = (LOADTEST / "README.md").read_text() + (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    modules = [p.relative_to(LOADTEST).as_posix() for p in LOADTEST.rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 20
    assert [m for m in modules if f"`{m}`" not in readme] == []
    assert [name for name in BENCHMARKS if f"`{name}`" not in readme] == []
