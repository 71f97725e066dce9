"""The packed runner's one-row graph path (builder/triton_models/packed_runner.py, `OneRowGraphs`) on the CPU provider.

onnxruntime captures CUDA graphs only on a GPU, but the rest is the same code on the CPU: buffers bound once per
token count, and refilled only with the inputs of a call that differ from what they hold. Texts of one token count
one after another (ids changing, token types changing, a text repeated) must each get session.run's answer: a
buffer left stale would give an earlier text's."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest

from contract import output_name
from contract.packing import PackedRows, cu_seqlens_of
from devstack.tritonserver import find_tritonserver_home
from tests.builder.conftest import PackedGraphs
from tests.fixtures.python_backend import STUB_CLASSES, Request

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def packed_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """packed_runner.py as the stub imports it: beside its copy of contract/packing.py, with the python backend's
    triton_python_backend_utils on the path."""
    shutil.copy(REPO / "contract" / "packing.py", tmp_path / "packing.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(find_tritonserver_home() / "backends" / "python"))
    monkeypatch.delitem(sys.modules, "packing", raising=False)
    spec = importlib.util.spec_from_file_location("packed_runner_under_test",
                                                  REPO / "builder" / "triton_models" / "packed_runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("packing", None)


def _row(ids: list[int], types: list[int]) -> PackedRows:
    return PackedRows(np.asarray(ids, np.int32), np.asarray(types, np.int32), cu_seqlens_of([len(ids)]))


def test_each_text_gets_its_own_answer(packed_runner: ModuleType, packed_graphs: PackedGraphs) -> None:
    case = packed_graphs.get("bert-rerank", "rerank")  # a pair model: its token types change between texts
    session = ort.InferenceSession(case.cpu_form.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = frozenset(i.name for i in session.get_inputs())
    output = output_name("rerank")
    graphs = packed_runner.OneRowGraphs(session, output, max_tokens=12, device_type="cpu")
    sample = session.run([output], _row([2], [0]).feed(inputs))[0]
    assert graphs.warm_up(inputs, sample, max_row=64) == 12  # one per token count up to max_tokens
    rng = np.random.default_rng(0)

    def text(n: int, second: int | None = None) -> PackedRows:
        ids = [2, *rng.integers(5, case.vocab, n - 2).tolist(), 3]
        return _row(ids, [0] * n if second is None else [0] * second + [1] * (n - second))

    first = text(7)
    rows = [first, text(7), text(7, second=3), text(7, second=5), first, first, text(4), text(7), text(12, second=6)]
    answers = []
    for row in rows:
        assert graphs.covers(row, [output])
        got = graphs(graphs.feed(row.input_ids, row.token_type_ids, inputs), row.tokens)
        want = session.run([output], row.feed(inputs))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        answers.append(got)
    assert not np.allclose(answers[0], answers[1])  # the texts differ, so a stale buffer would show
    np.testing.assert_allclose(answers[4], answers[0], rtol=1e-5, atol=1e-6)


def test_a_call_feeds_only_the_token_ids_and_types(packed_runner: ModuleType, packed_graphs: PackedGraphs) -> None:
    """The index tensors of a one-row run are its token count's own, bound at capture; a call computes none."""
    case = packed_graphs.get("bert", "embed", "mean")
    session = ort.InferenceSession(case.cpu_form.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = frozenset(i.name for i in session.get_inputs())
    graphs = packed_runner.OneRowGraphs(session, output_name("embed"), max_tokens=4, device_type="cpu")
    assert len(inputs) > 2
    row = _row([2, 9, 3], [0, 0, 0])
    assert set(graphs.feed(row.input_ids, row.token_type_ids, inputs)) == {"input_ids", "token_type_ids"} & inputs


def _packed(row: PackedRows) -> Request:
    return Request(input_ids=row.input_ids[None], token_type_ids=row.token_type_ids[None],
                    cu_seqlens=row.cu_seqlens[None])


def test_a_lone_text_takes_the_short_path_and_refusals_keep_their_reasons(
        packed_runner: ModuleType, packed_graphs: PackedGraphs, monkeypatch: pytest.MonkeyPatch) -> None:
    """An execute() of one packed request of one row the graphs cover is answered without merging or cutting runs,
    with session.run's answer; a lone request that breaks the contract gets the general path's reason."""
    utils = sys.modules["triton_python_backend_utils"]  # the stub gives it these classes; here plain stand-ins
    for name, value in STUB_CLASSES.items():
        monkeypatch.setattr(utils, name, value, raising=False)
    case = packed_graphs.get("bert", "embed", "mean")
    session = ort.InferenceSession(case.cpu_form.SerializeToString(), providers=["CPUExecutionProvider"])
    output = output_name("embed")
    steps = packed_runner.PackedSteps(session, [output], max_tokens=64, max_seq_len=16, vocab_sizes=(case.vocab, 2),
                                      graph_session=session, device_type="cpu")
    assert "16 CUDA graphs captured" in steps.warm_up(gpu=False)
    inputs = frozenset(i.name for i in session.get_inputs())
    rng = np.random.default_rng(1)
    texts = [_row([2, *rng.integers(5, case.vocab, n - 2).tolist(), 3], [0] * n) for n in (5, 5, 16, 9, 2)]
    other = _packed(_row([2, 7, 8, 3], [0] * 4))

    def fail(*args: object) -> None:
        raise AssertionError("a lone text of one row went through the merged path")

    with monkeypatch.context() as lone:
        lone.setattr(packed_runner, "cut_runs", fail)
        answers = [steps([_packed(text)])[0] for text in texts]
    for text, answer in zip(texts, answers):
        assert answer.error is None and [t.name for t in answer.output_tensors] == [output]
        got = answer.output_tensors[0].array
        assert got.shape == (1, session.get_outputs()[0].shape[-1]) and got.dtype == np.float32
        np.testing.assert_allclose(got, session.run([output], text.feed(inputs))[0], rtol=1e-5, atol=1e-6)
        merged = steps([_packed(text), other])[0].output_tensors[0].array  # the general path, for the same text
        np.testing.assert_allclose(got, merged, rtol=1e-5, atol=1e-6)
    assert not np.allclose(answers[0].output_tensors[0].array, answers[1].output_tensors[0].array)

    refused = {
        "input_ids must be in 0..": _packed(_row([2, case.vocab + 5, 3], [0, 0, 0])),
        "token_type_ids must be in 0..1": _packed(_row([2, 9, 3], [0, 2, 0])),
        "more than max_seq_len 16": _packed(_row([2] * 17, [0] * 17)),
        "must end at the token count 3": Request(input_ids=[[2, 9, 3]], token_type_ids=[[0, 0, 0]],
                                                  cu_seqlens=[[0, 4]]),
        "must be strictly increasing": Request(input_ids=np.zeros((1, 0)), token_type_ids=np.zeros((1, 0)),
                                                cu_seqlens=[[0, 0]]),
        "exactly one of attention_mask": Request(input_ids=[[2, 9, 3]], token_type_ids=[[0, 0, 0]],
                                                  cu_seqlens=[[0, 3]], attention_mask=[[1, 1, 1]]),
    }
    for reason, request in refused.items():
        (response,) = steps([request])
        assert response.error is not None and reason in response.error.message, (reason, response.error)
    padded = steps([Request(input_ids=[[2, 9, 3, 0]], token_type_ids=[[0] * 4], attention_mask=[[1, 1, 1, 0]])])[0]
    np.testing.assert_allclose(padded.output_tensors[0].array,
                               session.run([output], _row([2, 9, 3], [0, 0, 0]).feed(inputs))[0], rtol=1e-5, atol=1e-6)
