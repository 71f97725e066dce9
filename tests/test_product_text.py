"""Product code states reasons, not measurements: no benchmark results path, result folder name, pass number or
before/after figure in the product tree (gateway/, builder/, contract/, devstack/, docker/, monitoring/,
.env.example, their READMEs included). Measurements live in docs/benchmarks.md and the results table; a comment
or a setting's description says why, in a sentence."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("gateway", "builder", "contract", "devstack", "docker", "monitoring", ".env.example")
_MACHINE = r"(?:H100|H200|A100|L40S?|L4)"
# what each finding is -> the pattern that finds it (case-insensitive)
FINDINGS = {
    "a benchmark results path": r"loadtest/results",
    "a result folder's name": rf"\b{_MACHINE}-[a-z0-9]+-[a-z0-9-]*[a-z0-9]|\blocal-\d+core-[a-z0-9-]*[a-z0-9]",
    "a pass number": r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
                     r"|\w+teenth|twentieth|twenty-\w+|thirtieth|\d+(?:st|nd|rd|th)|nth) pass\b"
                     r"|\bpass (?:no\. ?)?\d+\b|\bissue \d+\b",
    "a before/after figure": r"\d[\d.,]*\s*(?:us|µs|ms|s|x|%|mb|gb)?\s*(?:->|→)\s*\d",
    "a measurement on a named machine": rf"\b(?:measured|seen|served|took)\b[^.\n]{{0,60}}\b{_MACHINE}\b"
                                        rf"|\bon (?:the|an?) {_MACHINE}\b",
    "a ratio range": r"\b\d+(?:\.\d+)?-\d+(?:\.\d+)?x\b",
    "a ratio against a run": r"\b\d+(?:\.\d+)?x (?:the|faster|slower|less|more)\b",
    "a time against a run": r"\b\d+(?:\.\d+)? ?(?:us|µs|ms) (?:more|less|against|instead|faster|slower)\b",
    "a throughput figure": r"\b\d[\d,.]*\s*(?:texts|requests|calls)/s\b",
}
PATTERN = re.compile("|".join(f"(?P<f{k}>{p})" for k, p in enumerate(FINDINGS.values())), re.IGNORECASE)


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line number, what was found, the words) of every finding in `text`."""
    names = list(FINDINGS)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATTERN.finditer(line):
            kind = next(int(k[1:]) for k, v in match.groupdict().items() if v is not None)
            found.append((number, names[kind], match.group(0)))
    return found


def product_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *PRODUCT], cwd=REPO, capture_output=True, check=True)
    return [name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


@pytest.mark.parametrize("text", [
    "measured best on the H100 (loadtest/results/h100-20-tuning)",
    "local-2core-20ai-tokenizer-pool-cpu-bound: 2 CPUs",
    "h200-20ad-final",
    "So `auto` was one thread per worker until the twenty-second pass of issue 20.",
    "issue 20's ninth pass",
    "the runner's Python for it 80 -> 10 us",
    "served 1.03-1.05x the texts/s",
    "a median 1.09x the single texts of 8",
    "the stack served them at 9,000 texts/s",
    "0.99999998 -> 0.99633",
    "math.prod: 0.2 us against np.prod's 3.6",
    "builds a view per tensor, 3 us more per step call",
    "a boolean mask: ~12x faster than np.flatnonzero",
])
def test_the_patterns_find_citations_and_figures(text: str) -> None:
    assert findings(text), text


@pytest.mark.parametrize("text", [
    "            pass  # not registered: fine",
    "every check passes; the row passed; pass --formats to choose; a bypass",
    "GATEWAY_* variables of this environment pass through",
    "padding stays under 1.25x + this",
    "within 80% of its remaining deadline",
    'the GPU as this process sees it (e.g. "NVIDIA H100 80GB HBM3 (device 0)")',
    "def run(self) -> int:",
    "upstream: triton-inference-server/server#8870",
])
def test_the_patterns_leave_code_and_rules_alone(text: str) -> None:
    assert not findings(text), findings(text)


def test_product_files_cite_no_measurements() -> None:
    """Every finding as file:line, so that each can be rewritten as the reason it stood for."""
    files = product_files()
    assert "gateway/settings.py" in files and ".env.example" in files  # the listing is the product tree
    found = [f"{name}:{number}: {kind}: {words!r}" for name in files
             for number, kind, words in findings((REPO / name).read_text(errors="replace"))]
    assert not found, "product text cites measurements; say why instead:\n" + "\n".join(found)
