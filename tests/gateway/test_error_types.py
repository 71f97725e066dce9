"""The one error vocabulary (gateway/errors.py's ErrorType): every type documented with its status, every kind
answered with a status and mapped to TEI's errors, and no type string written anywhere else in the gateway."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gateway.api.errors import STATUS, status_of
from gateway.api.tei_errors import _BY_KIND, tei_status
from gateway.errors import ErrorKind, ErrorType

REPO = Path(__file__).resolve().parents[2]


def documented() -> dict[str, set[int]]:
    """gateway/README.md's error table: type -> the statuses its rows give it."""
    text = (REPO / "gateway" / "README.md").read_text()
    table = text.split("| status | type | when |", 1)[1].split("\n\n", 1)[0]
    found: dict[str, set[int]] = {}
    for row in table.splitlines()[2:]:
        status, types, _ = row.strip("|").split("|", 2)
        for name in re.findall(r"`([a-z_]+)`", types):
            found.setdefault(name, set()).add(int(status))
    return found


def test_the_readme_table_documents_every_error_type_with_its_status() -> None:
    table = documented()
    assert set(table) == {t.value for t in ErrorType}, set(table) ^ {t.value for t in ErrorType}
    for name, statuses in table.items():
        assert statuses == {status_of(ErrorType(name))}, (name, statuses)


def test_every_kind_has_a_status_and_a_tei_answer() -> None:
    assert set(STATUS) == set(ErrorKind) and set(_BY_KIND) == set(ErrorKind)
    assert tei_status(ErrorType.EMPTY_INPUT) == (400, "Empty")
    assert tei_status(ErrorType.TOKENIZER_UNAVAILABLE) == (501, "Tokenizer")
    assert tei_status(ErrorType.PIPELINE_UNSUPPORTED) == (501, "Backend")  # by its kind


def test_no_error_type_is_written_as_a_string_in_the_gateway() -> None:
    """Raising and comparing go through ErrorType members: no string literal in gateway/ (but errors.py, where
    the members are defined) equals a type's value where code compares or passes it."""
    values = {t.value for t in ErrorType}
    literals = []
    for path in (REPO / "gateway").rglob("*.py"):
        if path == REPO / "gateway" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values:
                literals.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not literals, literals
