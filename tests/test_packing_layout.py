"""contract/packing.py: the packed layout on the host (what the gateway, the python runner and the builder's
parity make and check), and the errors a request that breaks it gets."""

from __future__ import annotations

import numpy as np
import pytest

import contract
from contract import packing
from contract.packing import (
    PackedRows,
    PackingError,
    check_ids,
    concat,
    cu_seqlens_of,
    cut_runs,
    fill_sizes,
    filled_tokens,
    from_rows,
    pack_padded,
    packed_request,
)


def test_names_agree_with_the_contract() -> None:
    assert packing.GRAPH_INPUTS == (contract.INPUT_IDS, contract.TOKEN_TYPE_IDS, contract.CU_SEQLENS,
                                    contract.TOKEN_OFFSET, contract.POSITION_IDS, contract.TOKEN_ROWS,
                                    contract.ROW_IDS)


def _padded() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array([[2, 10, 11, 3], [2, 3, 0, 0], [2, 0, 0, 0]], np.int32)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], np.int32)
    types = np.array([[0, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], np.int32)
    return ids, mask, types


def test_padded_rows_pack_back_to_back() -> None:
    rows = pack_padded(*_padded())
    assert rows.input_ids.tolist() == [2, 10, 11, 3, 2, 3, 2]
    assert rows.token_type_ids.tolist() == [0, 0, 1, 1, 0, 1, 0]
    assert rows.cu_seqlens.tolist() == [0, 4, 6, 7] and rows.cu_seqlens.dtype == np.int32
    feed = rows.feed()
    assert sorted(feed) == sorted(packing.GRAPH_INPUTS)
    assert feed[contract.POSITION_IDS].tolist() == [0, 1, 2, 3, 0, 1, 0]
    assert feed[contract.TOKEN_ROWS].tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert feed[contract.ROW_IDS].tolist() == [0, 1, 2]
    # rows of 4, 2 and 1 tokens in [3, 4] slots: real slots in packed order, then the padding slots
    assert feed[contract.TOKEN_OFFSET].tolist() == [[0, 1, 2, 3], [4, 5, 8, 6], [7, 9, 10, 11]]
    assert all(v.dtype == np.int32 for v in feed.values())
    assert sorted(rows.feed([contract.INPUT_IDS, contract.CU_SEQLENS])) == [contract.CU_SEQLENS, contract.INPUT_IDS]
    again = packed_request(rows.input_ids[None], rows.token_type_ids[None], rows.cu_seqlens[None])
    assert again.cu_seqlens.tolist() == rows.cu_seqlens.tolist()


@pytest.mark.parametrize(("change", "message"), [
    (lambda ids, mask, types: (ids, mask * 0, types), "row 0 has no token"),
    (lambda ids, mask, types: (ids, mask[:, ::-1].copy(), types), "right padding"),
    (lambda ids, mask, types: (ids, np.where(mask == 1, 2, 0), types), "right padding"),
    (lambda ids, mask, types: (ids, mask, types[:, :3]), "of one shape"),
    (lambda ids, mask, types: (ids[0], mask[0], types[0]), "of one shape"),
])
def test_padded_requests_that_break_the_layout(change, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PackingError, match=message):
        pack_padded(*change(*_padded()))


def test_rows_longer_than_max_seq_len_are_refused() -> None:
    with pytest.raises(PackingError, match="row 0 has 4 tokens, more than max_seq_len 3"):
        pack_padded(*_padded(), max_row=3)
    pack_padded(*_padded(), max_row=4)


@pytest.mark.parametrize(("cu", "message"), [
    ([[1, 4, 7]], "must start at 0"),
    ([[0, 4, 6]], "must end at the token count 7"),
    ([[0, 4, 4, 7]], "strictly increasing .* row 1 has 0"),
    ([[0, 5, 4, 7]], "strictly increasing .* row 1 has -1"),
    ([[0]], "rows \\+ 1 >= 2 values"),
    ([0, 7], "batch 1"),
    ([[0, 7], [0, 7]], "batch 1"),
])
def test_packed_requests_with_bad_cu_seqlens(cu: list, message: str) -> None:  # type: ignore[type-arg]
    ids = np.arange(7, dtype=np.int32)[None]
    with pytest.raises(PackingError, match=message):
        packed_request(ids, np.zeros_like(ids), np.array(cu, np.int32))


def test_error_messages_stay_short() -> None:
    cu = np.arange(0, 100_001, dtype=np.int32)[None]
    ids = np.zeros((1, 99_999), np.int32)
    with pytest.raises(PackingError) as error:
        packed_request(ids, ids, cu)
    assert len(str(error.value)) < 200 and "100001 values" in str(error.value)


def test_rows_of_token_ids_pack_like_padded_rows() -> None:
    ids, mask, types = _padded()
    rows = from_rows([r[m == 1] for r, m in zip(ids, mask)], [t[m == 1] for t, m in zip(types, mask)])
    expected = pack_padded(ids, mask, types)
    for name in ("input_ids", "token_type_ids", "cu_seqlens"):
        assert getattr(rows, name).tolist() == getattr(expected, name).tolist()
    assert from_rows([[5, 6], [7]]).token_type_ids.tolist() == [0, 0, 0]
    with pytest.raises(PackingError, match="at least one token"):
        from_rows([[5], []])
    with pytest.raises(PackingError, match="token_type_ids hold 2 tokens"):
        from_rows([[5, 6], [7]], [[0, 0]])


def test_ids_outside_the_embedding_tables_are_refused() -> None:
    rows = pack_padded(*_padded())
    check_ids(rows, vocab_size=12, type_vocab_size=2)
    check_ids(rows)  # no sizes: nothing to check
    with pytest.raises(PackingError, match=r"input_ids must be in 0..10: found \[11\]"):
        check_ids(rows, vocab_size=11, type_vocab_size=2)
    with pytest.raises(PackingError, match="token_type_ids must be in 0..0"):
        check_ids(rows, vocab_size=12, type_vocab_size=1)
    negative = PackedRows(np.array([-1, 3], np.int32), np.zeros(2, np.int32), cu_seqlens_of([2]))
    with pytest.raises(PackingError, match=r"found \[-1\]"):
        check_ids(negative, vocab_size=12)


def test_token_types_must_match_the_ids() -> None:
    ids = np.zeros((1, 5), np.int32)
    with pytest.raises(PackingError, match="token_type_ids"):
        packed_request(ids, np.zeros((1, 4), np.int32), np.array([[0, 5]], np.int32))


def test_concat_and_slices_keep_every_row() -> None:
    a, b = pack_padded(*_padded()), PackedRows(np.array([7, 8], np.int32), np.zeros(2, np.int32),
                                                cu_seqlens_of([1, 1]))
    merged = concat([a, b])
    assert merged.cu_seqlens.tolist() == [0, 4, 6, 7, 8, 9] and merged.rows == 5 and merged.tokens == 9
    tail = merged.slice_rows(2, 5)
    assert tail.input_ids.tolist() == [2, 7, 8] and tail.cu_seqlens.tolist() == [0, 1, 2, 3]


def test_runs_hold_at_most_the_budget_in_arrival_order() -> None:
    lengths = [5, 3, 9, 1, 1, 12, 4]
    runs = cut_runs(lengths, max_tokens=10)
    assert runs == [(0, 2), (2, 4), (4, 5), (5, 6), (6, 7)]  # 12 > 10: a run of its own
    assert [i for start, stop in runs for i in range(start, stop)] == list(range(len(lengths)))
    assert cut_runs(lengths, max_tokens=100) == [(0, 7)]
    assert cut_runs([], max_tokens=10) == []
    # rows x tokens bounded too (the mean pooling's [rows, tokens] matrix): 1-token rows
    assert cut_runs([1] * 10, max_tokens=100, max_cells=16) == [(0, 4), (4, 8), (8, 10)]


def test_filled_token_counts_are_few_and_close_above_the_real_count() -> None:
    """Every count from 1 to the budget fills to one of a few sizes (the GEMM shapes cuBLAS meets again), at most
    1/32 more (none below 64 tokens), never past the budget nor below the real count."""
    limit = 16384
    sizes = fill_sizes(limit)
    assert len(sizes) == len(set(sizes)) <= 360 and sizes == sorted(sizes) and sizes[-1] == limit
    for tokens in range(1, limit + 1):
        filled = filled_tokens(tokens, limit)
        assert tokens <= filled <= limit and filled in sizes
        assert filled - tokens <= tokens / 32 and (tokens >= 64 or filled == tokens), tokens
    assert filled_tokens(20000, limit) == 20000  # a row longer than the budget runs alone, unfilled


def test_filler_rows_follow_the_real_rows_and_keep_the_widest_row() -> None:
    rows = from_rows([[2, 10, 3], [2, 11, 12, 13, 14, 3]], [[0, 0, 0], [0, 0, 1, 1, 1, 1]])
    filled = rows.filled(40, max_row=64)
    assert filled.tokens == 40 and filled.input_ids[:9].tolist() == rows.input_ids.tolist()
    assert filled.token_type_ids[:9].tolist() == rows.token_type_ids.tolist()
    assert filled.cu_seqlens[:3].tolist() == rows.cu_seqlens.tolist()
    assert filled.lengths.tolist() == [3, 6, 8, 8, 8, 7]  # filler rows no wider than the widest row (at least 8)
    assert not filled.input_ids[9:].any() and not filled.token_type_ids[9:].any()
    assert rows.filled(9, max_row=64) is rows
    only = PackedRows(np.zeros(0, np.int32), np.zeros(0, np.int32), cu_seqlens_of([])).filled(150, max_row=64)
    assert only.lengths.tolist() == [64, 64, 22]  # a warm-up run: filler rows of max_seq_len
