"""The model-repository contract: the names builder, Triton models, gateway and loadtest agree on.

docs/contract.md explains it; this module is its only definition in code. The python-backend
model files that run inside Triton (builder/triton_models) cannot import it and read the same
names from their config instead; tests check that they agree with this module.
"""

from __future__ import annotations

from typing import Literal, get_args

# sparse-embed: a SPLADE model (sentence-transformers SparseEncoder): one vocabulary-wide weight row per text.
Task = Literal["classify", "embed", "rerank", "sparse-embed"]
TASKS: tuple[Task, ...] = get_args(Task)
# Which end of a text too long for max_seq_len is cut off (Hugging Face's `truncation_side`).
TruncationDirection = Literal["right", "left"]

# Backends as the repository names them (ensemble parameter `backend`, entry suffix) and as the
# HTTP API names them (`"backend": "onnx" | "trt"`).
RepoBackend = Literal["onnx", "trt_fp16"]
ApiBackend = Literal["onnx", "trt"]
API_BACKEND: dict[str, ApiBackend] = {"onnx": "onnx", "trt_fp16": "trt", "trt": "trt"}
REPO_BACKEND: dict[ApiBackend, RepoBackend] = {"onnx": "onnx", "trt": "trt_fp16"}
BACKEND_PREFERENCE: tuple[ApiBackend, ...] = ("trt", "onnx")  # TensorRT first when both are built
# How Triton's onnxruntime backend runs the `onnx` step on a GPU (ensemble parameter `onnx_accelerator`,
# builder option --onnx-accelerator; builder/accelerators.py writes the config block):
# `tensorrt` = ONNX Runtime's TensorRT execution provider (engines compiled by Triton at load, cached),
# `cuda` = its CUDA provider with tuned options, `none` = no accelerator settings (CPU builds, the python
# runtime, and repositories built before the parameter existed).
OnnxAccelerator = Literal["tensorrt", "cuda", "none"]
ONNX_ACCELERATORS: tuple[OnnxAccelerator, ...] = get_args(OnnxAccelerator)

# Tensors.
TEXT = "text"
TEXT_PAIR = "text_pair"  # second text of a pair (models built with pairs: rerank, pair classifiers)
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
TOKEN_INPUTS: tuple[str, str, str] = (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS)
NUM_TOKENS = "num_tokens"
# The packed layout (docs/contract.md "Packed model steps"): a request to a step whose config says
# `layout: packed` may carry its rows back to back, with no padding: input_ids and token_type_ids
# [1, total tokens] and CU_SEQLENS [1, rows + 1] (0, end of row 0, ..., total tokens; every row at
# least one token), and gets its output rows [rows, width]. Padded requests ([rows, width] ids and
# attention_mask, as the ensembles send them) are served by the same step.
CU_SEQLENS = "cu_seqlens"
# Inputs of the packed graph itself that the runner derives from cu_seqlens on the host (contract/packing.py):
TOKEN_OFFSET = "token_offset"  # [rows, longest row] int32: onnxruntime's RemovePadding layout
POSITION_IDS = "position_ids"  # [T] int32: each token's position in its row
TOKEN_ROWS = "token_rows"  # [T] int32: each token's row (mean pooling)
ROW_IDS = "row_ids"  # [rows] int32: 0 .. rows-1 (mean pooling)
Layout = Literal["padded", "packed"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
OUTPUTS: dict[Task, str] = {"classify": "logits", "embed": "embeddings", "rerank": "logits",
                            "sparse-embed": "sparse_embeddings"}
# Per-token outputs of a model step, next to the pooled one (scheduler pipeline only; docs/contract.md):
# FP32 [rows, tokens, dim] or, for TOKEN_WEIGHTS, [rows, tokens]; row i's first len_i tokens are its own.
TOKEN_EMBEDDINGS = "token_embeddings"  # embed: the encoder's last hidden state, every token (TEI's /embed_all)
TOKEN_WEIGHTS = "token_weights"  # embed, bge-m3 heads: relu(sparse_linear(hidden)) per token (lexical weights)
COLBERT_VECTORS = "colbert_vectors"  # embed, bge-m3 heads: normalize(colbert_linear(hidden)) per token
PER_TOKEN_OUTPUTS: tuple[str, ...] = (TOKEN_EMBEDDINGS, TOKEN_WEIGHTS, COLBERT_VECTORS)
# Request parameter of an ensemble call that the tokenizer reads (Triton forwards an ensemble's
# request parameters to its steps): `right` (default) or `left`.
TRUNCATION_PARAMETER = "truncation_direction"
# Triton's own request parameter of a request's timeout in microseconds (KServe v2 over HTTP; gRPC has a field),
# which a model's queue policy acts on.
TIMEOUT_PARAMETER = "timeout"

# Files.
TOKENIZER_FILE = "tokenizer.json"
TOKENIZATION_MODULE = "tokenization.py"  # contract/tokenization.py, copied next to the tokenizer's model.py
BATCHING_MODULE = "batching.py"  # contract/batching.py, copied next to the python runner's model.py
PACKING_MODULE = "packing.py"  # contract/packing.py, copied next to the python runner's model.py
LABELS_FILE = "labels.txt"
# In each version directory of an embedder's ensembles: that build's Param.QUANTIZATION_RANGES value.
QUANTIZATION_RANGES_FILE = "quantization_ranges.json"


# What the python runner's onnxruntime CUDA sessions run with, and so the builder's parity of its builds:
# TF32 off, since onnxruntime's CUDA provider computes fp32 GEMMs in TF32 (10-bit mantissa) by default and an
# fp32 build is then not fp32: a deep model drifts past the parity gate.
# builder/triton_models/onnx_runner.py keeps a copy (it runs inside Triton, without this package);
# tests/builder/test_runner_options.py checks that they agree.
CUDA_PROVIDER_OPTIONS: dict[str, str] = {"use_tf32": "0"}


class Param:
    """Keys of the string `parameters` of the repository's model configs."""

    # ensembles (what the gateway discovers models by)
    TASK = "task"
    MODEL_NAME = "model_name"
    BACKEND = "backend"
    MAX_SEQ_LEN = "max_seq_len"
    LABELS = "labels"
    EMBEDDING_DIM = "embedding_dim"
    POOLING = "pooling"
    SOURCE = "source"
    PAIRS = "pairs"  # "true": the model takes text pairs (rerank, pair classifiers); TEXT_PAIR is an input
    NORMALIZE = "normalize"  # embed: "true"/"false", what the model was trained with (sentence-transformers Normalize)
    PROMPTS = "prompts"  # embed: JSON object prompt name -> text prepended to the input
    DEFAULT_PROMPT = "default_prompt_name"  # embed: the prompt used when a request names none
    MATRYOSHKA_DIMS = "matryoshka_dims"  # embed: comma list of the dimensions a request may truncate to
    # embed: int8/uint8 ranges per width, calibrated at build (contract/ranges.py); absent = not calibrated
    QUANTIZATION_RANGES = "quantization_ranges"
    SCORE_LABEL = "score_label"  # rerank: index of the logit that scores relevance
    ONNX_ACCELERATOR = "onnx_accelerator"  # onnx ensembles: an OnnxAccelerator (absent = "none")
    # embed with bge-m3 heads: token ids whose lexical weight is dropped (FlagEmbedding: cls, eos, pad, unk)
    SPARSE_SKIP_IDS = "sparse_skip_ids"
    # tokenizer model
    LENGTH_BUCKETS = "length_buckets"
    PAD_TOKEN_ID = "pad_token_id"
    TOKENIZER_SHA256 = "tokenizer_sha256"
    # model steps
    PRECISION = "precision"
    MAX_BATCH_TOKENS = "max_batch_tokens"
    BATCH_WIDTHS = "batch_widths"  # the padded widths batches take (contract/batching.py), comma list
    BATCH_ROWS = "batch_rows"  # the row counts batches take, comma list
    INTRA_OP_THREADS = "intra_op_num_threads"
    LAYOUT = "layout"  # a Layout: "packed" = the step also takes packed requests (absent = "padded")
    # layout packed: the ids the embedding tables hold; the runner refuses a request with others
    VOCAB_SIZE = "vocab_size"
    TYPE_VOCAB_SIZE = "type_vocab_size"
    # layout packed: "true"/"false", whether runs are filled up to a few token counts (contract/packing.py,
    # filled_tokens); absent = on a GPU instance only
    FILL_TOKENS = "fill_tokens"
    # layout packed, GPU: "false" turns off the CUDA graphs of lone short texts (the python runner's
    # GRAPH_MAX_TOKENS); absent = on
    CUDA_GRAPHS = "cuda_graphs"


def output_name(task: Task) -> str:
    """The model output of a task: `logits` or `embeddings`."""
    return OUTPUTS[task]


def tokenizer_model(name: str) -> str:
    """Repository entry of a model's tokenizer."""
    return f"{name}_tokenizer"


def step_model(name: str, backend: RepoBackend) -> str:
    """Repository entry of a model step: NAME_onnx or NAME_trt_fp16."""
    return f"{name}_{backend}"


def ensemble_model(name: str, backend: RepoBackend) -> str:
    """Repository entry of the text -> output ensemble of one backend."""
    return f"{step_model(name, backend)}_ensemble"


def entry_names(name: str) -> tuple[str, ...]:
    """Every entry a model NAME can own in a repository."""
    steps = [step_model(name, b) for b in get_args(RepoBackend)]
    return (tokenizer_model(name), *steps, *(f"{s}_ensemble" for s in steps))


def family_of(entry: str) -> str | None:
    """The model NAME a repository entry belongs to (`entry_names` read backwards), or None."""
    suffixes = ["_tokenizer", *(f"_{b}_ensemble" for b in get_args(RepoBackend)), *(f"_{b}" for b in get_args(RepoBackend))]
    for suffix in suffixes:
        if entry.endswith(suffix) and len(entry) > len(suffix):
            return entry[: -len(suffix)]
    return None
