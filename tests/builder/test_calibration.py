"""int8/uint8 calibration at build: the ranges a build stores are the [min; max] per component, at every width, of
sentence-transformers' own vectors of the calibration set (bare and with each prompt, cut to the width and
normalized as the gateway serves them), from `--calibration-texts` or the builder's default multilingual set; each
version directory keeps its build's copy, which `builder serve` puts back."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from tritonclient.grpc import model_config_pb2 as mc
from transformers import AutoTokenizer

from builder.calibration import DEFAULT_TEXTS, calibrate, read_texts, texts_digest
from builder.errors import UsageError
from builder.manifest import read_manifest
from builder.versions import set_version_ranges
from contract import QUANTIZATION_RANGES_FILE, Param, ensemble_model, step_model
from contract.ranges import decode_ranges, encode_ranges
from tests.fixtures.repository import CALIBRATION_TEXTS, stored_ranges

PROMPTS = {"query": "query: ", "passage": "passage: "}
# Scripts the default set must cover: Latin with accents, Cyrillic, Arabic, Devanagari, Han, kana, Hangul.
SCRIPTS = {"latin": "[éèàçñöüß]", "cyrillic": "[\u0400-\u04ff]", "arabic": "[\u0600-\u06ff]",
           "devanagari": "[\u0900-\u097f]", "han": "[\u4e00-\u9fff]", "kana": "[\u3040-\u30ff]",
           "hangul": "[\uac00-\ud7af]"}


def oracle_ranges(model: SentenceTransformer, texts: list[str], widths: list[int], prompts: dict[str, str],
                  normalize: bool) -> dict[int, np.ndarray]:
    """sentence-transformers' vectors of `texts`, bare and with each prompt, cut to each width (and normalized, as
    its `truncate_dim` and `normalize_embeddings` do): [min; max] per component."""
    pooled = np.concatenate([model.encode(texts, prompt=p) for p in [None, *prompts.values()]])
    ranges = {}
    for width in widths:
        vectors = pooled[:, :width]
        if normalize:
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        ranges[width] = np.vstack((vectors.min(axis=0), vectors.max(axis=0)))
    return ranges


def test_the_default_set_is_small_and_multilingual() -> None:
    path = Path(__file__).resolve().parents[2] / "builder" / DEFAULT_TEXTS
    texts = read_texts(None)
    assert path.stat().st_size < 60_000 and len(texts) >= 250
    assert texts == [line for line in path.read_text().splitlines() if line.strip()]
    missing = [name for name, pattern in SCRIPTS.items() if not any(re.search(pattern, t) for t in texts)]
    assert not missing


def test_a_build_stores_the_ranges_of_its_calibration_texts(python_repository: Path, tiny_embedder_dir: Path) -> None:
    """`tinyemb` (no Normalize module: served as pooled) was built with --calibration-texts (tests/fixtures/
    repository.py's set)."""
    texts = read_texts(str(CALIBRATION_TEXTS))
    ranges = stored_ranges(python_repository, "tinyemb")
    want = oracle_ranges(SentenceTransformer(str(tiny_embedder_dir), device="cpu"), texts, [32], {}, normalize=False)
    assert sorted(ranges) == [32] and ranges[32].dtype == np.float32 and ranges[32].shape == (2, 32)
    np.testing.assert_allclose(ranges[32], want[32], atol=1e-5)
    entry = python_repository / ensemble_model("tinyemb", "onnx")
    manifest = read_manifest(entry)
    assert manifest is not None and manifest.settings.calibration_sha256 == texts_digest(texts)
    copy = decode_ranges((entry / str(manifest.version) / QUANTIZATION_RANGES_FILE).read_text())
    assert copy[32].tobytes() == ranges[32].tobytes()  # the version's own copy
    classifier = (python_repository / ensemble_model("tinycls", "onnx") / "config.pbtxt").read_text()
    assert Param.QUANTIZATION_RANGES not in classifier


@pytest.mark.parametrize("texts", ["default", "file"])
def test_calibration_covers_every_width_and_prompt(python_repository: Path, tiny_embedder_dir: Path, tmp_path: Path,
                                                   texts: str) -> None:
    """The published graph of `tinyemb`, calibrated on the builder's default set as built, and on a file as a
    normalized matryoshka model with prompts would be."""
    step = python_repository / step_model("tinyemb", "onnx")
    manifest = read_manifest(step)
    assert manifest is not None
    if texts == "default":
        widths, prompts, normalize, path = [32], {}, False, ""  # "": the default set
    else:
        widths, prompts, normalize, path = [8, 16, 32], PROMPTS, True, str(CALIBRATION_TEXTS)
    settings = manifest.settings.model_copy(update={"calibration_texts": path, "prompts": prompts,
                                                    "normalize": normalize, "matryoshka_dims": widths})
    tokenizer = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    ranges = calibrate(settings, tokenizer, step / str(manifest.version) / "model.onnx", True, 32, tmp_path,
                       lambda _message: None)
    want = oracle_ranges(SentenceTransformer(str(tiny_embedder_dir), device="cpu"), read_texts(path or None), widths,
                         prompts, normalize)
    assert sorted(ranges) == widths
    for width in widths:
        np.testing.assert_allclose(ranges[width], want[width], atol=1e-5)


def test_a_calibration_file_without_text_is_refused(tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    with pytest.raises(UsageError, match="no text in it"):
        read_texts(str(blank))


def test_serving_a_version_puts_back_its_own_ranges(tmp_path: Path) -> None:
    entry = tmp_path / "e_onnx_ensemble"
    ranges = {4: np.array([[-1, -0.5, 0, 0.25], [1, 0.5, 0.125, 0.75]], np.float32)}
    for version in (1, 2):
        (entry / str(version)).mkdir(parents=True)
    (entry / "2" / QUANTIZATION_RANGES_FILE).write_text(encode_ranges(ranges))
    config = mc.ModelConfig(name=entry.name, platform="ensemble")
    set_version_ranges(config, entry, None)  # the newest: version 2's
    assert decode_ranges(config.parameters[Param.QUANTIZATION_RANGES].string_value)[4].tobytes() == ranges[4].tobytes()
    set_version_ranges(config, entry, 1)  # built without ranges: none
    assert Param.QUANTIZATION_RANGES not in config.parameters
