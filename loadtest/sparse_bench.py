"""Where a SPLADE vector becomes sparse: in the graph (TopK) or in the gateway (non-zeros of the full row).

A random BERT masked LM with bert-base's vocabulary width (30,522) and a small encoder (hidden 128, 2
layers), its MLM bias shifted so that a text activates ~150 vocabulary entries (what trained SPLADE models
give for short texts), saved as a sentence-transformers SparseEncoder and built by the builder
(`--task sparse-embed --runtime python --device cpu`). Measured on one batch of 32 short texts:
- the model step in onnxruntime: the builder's graph (the full [rows, vocabulary] row) against the same graph
  with a TopK(k) appended (values and indices of the k largest, [rows, k] each);
- the gateway's share: the non-zeros of 32 full rows (gateway/service/sparse.py `from_row`), and the JSON;
- `/embed_sparse` end to end through a real tritonserver and the gateway (shared memory), median of N.
Bytes per text: what the step returns (full row: vocabulary x 4; TopK: k x 8) and the JSON answer.

    python -m loadtest sparse --out loadtest/results/local-2core-23-sparse
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.machine import describe_machine
from loadtest.ort_probe import medians_in_turns, open_session, providers

VOCAB = 30522
TEXTS = [f"the movie number {i} was really good and i would see it again with friends" for i in range(32)]


def make_splade(directory: Path, active: int = 150) -> Path:
    """The SparseEncoder folder, its MLM bias set so that a short text activates ~`active` entries."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from tests.fixtures.tiny_models import _save_tokenizer, write_tiny_splade

    write_tiny_splade(directory, "st6")  # the folder layout and the tokenizer; the weights are replaced below
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=512, max_position_embeddings=128)).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
        logits = model(**batch).logits[batch["attention_mask"].bool()]
        tokens = logits.shape[0] / len(TEXTS)
        threshold = torch.quantile(logits.flatten()[:2_000_000], 1 - active / (VOCAB * tokens))
        model.cls.predictions.bias -= threshold  # the decoder's bias: logits above the threshold stay positive
    model.save_pretrained(directory)
    _save_tokenizer(directory)
    return directory


def with_topk(source: Path, target: Path, k: int) -> None:
    """The builder's graph with TopK(k) on its row, as one output `topk` [rows, 2k]: the k largest values, then
    their indices (as floats: exact below 2^24), so that one Triton output carries both."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source))
    row = model.graph.output[0].name
    model.graph.initializer.append(helper.make_tensor("topk_k", TensorProto.INT64, [1], [k]))
    model.graph.node.extend([
        helper.make_node("TopK", [row, "topk_k"], ["topk_values", "topk_indices"], axis=-1),
        helper.make_node("Cast", ["topk_indices"], ["topk_indices_f"], to=TensorProto.FLOAT),
        helper.make_node("Concat", ["topk_values", "topk_indices_f"], ["topk"], axis=-1),
    ])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("topk", TensorProto.FLOAT, ["batch", 2 * k]))
    onnx.save(model, str(target))


def add_topk_step(repo: Path, k: int) -> str:
    """A copy of the sparse model step serving the TopK graph (`splade_topk`), next to the builder's."""
    import shutil

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    source, target = repo / "splade_onnx", repo / "splade_topk"
    shutil.copytree(source, target)
    with_topk(source / "1" / "model.onnx", target / "1" / "model.onnx", k)
    config = text_format.Parse((source / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = "splade_topk"
    del config.output[:]
    config.output.add(name="topk", data_type=mc.TYPE_FP32, dims=[2 * k])
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    return "splade_topk"


async def _interleaved_async(calls: list[Any], repeats: int) -> list[float]:
    for call in calls:
        await call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, times in zip(calls, samples):
            start = time.perf_counter()
            await call()
            times.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in samples]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest sparse", description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from devstack.tritonserver import TritonServer
    from gateway.service.sparse import from_rows
    from tests.fixtures.repository import PYTHON_CPU, build_repository
    from tests.gateway.conftest import running_gateway

    work = args.work or Path(tempfile.mkdtemp(prefix="sparse-bench-"))
    source = make_splade(work / "splade")
    repo = work / "repo"
    build_repository(repo, [{"model": str(source), "task": "sparse-embed", "name": "splade"}], **PYTHON_CPU,
                     max_batch_size=64)
    graph = repo / "splade_onnx" / "1" / "model.onnx"
    topk = repo / add_topk_step(repo, args.k) / "1" / "model.onnx"
    feed = {k: np.asarray(v, np.int32) for k, v in AutoTokenizer.from_pretrained(source)(
        TEXTS, padding=True, return_tensors="np", return_token_type_ids=True).items()}
    names = providers()
    full_session, topk_session = open_session(graph, names), open_session(topk, names)
    rows = full_session.run(None, feed)[0]
    nonzeros = [int(np.count_nonzero(r)) for r in rows]
    full_ms, topk_ms = (1e3 * s for s in medians_in_turns(
        [lambda: full_session.run(None, feed), lambda: topk_session.run(None, feed)], args.repeats))
    extract_ms = 1e3 * medians_in_turns([lambda: from_rows(rows)], args.repeats, warmup=3)[0]
    sparse = from_rows(rows)
    assert [len(a) for a, _ in sparse] == nonzeros
    body = json.dumps([[{"index": i, "value": v} for i, v in zip(a.tolist(), b.tolist())] for a, b in sparse])

    async def timed(call: Any) -> float:
        for _ in range(3):
            await call()
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e3

    async def through_triton() -> dict[str, float]:
        """/embed_sparse end to end, and each step alone through the gateway's Triton client (system shm)."""
        from gateway.settings import GatewaySettings
        from gateway.triton.client import Output, TritonClient

        tensors = {name: feed[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
        rows_, width = feed["input_ids"].shape
        with TritonServer(repository=repo, log_path=work / "triton.log") as server:
            client = TritonClient(GatewaySettings(triton_url=server.grpc_url, triton_http_url=server.http_address, shm_prefix="sparsebench_steps"))
            steps = (("splade_onnx", Output("sparse_embeddings", VOCAB, "bench")),
                     ("splade_topk", Output("topk", 2 * args.k, "bench")))
            for step, output in steps:
                await client.pools.ensure(step, {"input_ids": rows_ * width * 4, "attention_mask": rows_ * width * 4,
                                                "token_type_ids": rows_ * width * 4,
                                                output.name: rows_ * output.width * 4}, 2)
            medians = await _interleaved_async(
                [lambda s=step, o=output: client.infer_step(s, tensors, (rows_, o.width), o) for step, output in steps],
                args.repeats)
            times = dict(zip((step for step, _ in steps), medians))
            await client.close()
            async with running_gateway(server.grpc_url, repository=str(repo), shm_prefix="sparsebench") as (_, http):
                async def call() -> None:
                    response = await http.post("/embed_sparse", json={"model": "splade", "inputs": TEXTS})
                    assert response.status_code == 200, response.text
                times["embed_sparse"] = await timed(call)
        return times

    triton_ms = asyncio.run(through_triton())
    record = {
        "name": "sparse-bench", "machine": describe_machine().model_dump(), "onnxruntime": ort.__version__,
        "step_providers": names,
        "settings": {"vocabulary": VOCAB, "texts": len(TEXTS), "tokens_per_text": int(feed["attention_mask"].sum(1).max()),
                     "k": args.k, "repeats": args.repeats, "encoder": "BERT hidden 128, 2 layers"},
        "nonzeros_per_text": {"min": min(nonzeros), "median": statistics.median(nonzeros), "max": max(nonzeros)},
        "step_ms": {"full row": full_ms, f"TopK({args.k}) in the graph": topk_ms},
        "gateway_nonzero_extraction_ms_per_batch": extract_ms,
        "through_triton_ms": {"full row step (gateway client, shm)": triton_ms["splade_onnx"],
                              f"TopK({args.k}) step (gateway client, shm)": triton_ms["splade_topk"],
                              "/embed_sparse end to end (full row + gateway)": triton_ms["embed_sparse"]},
        "bytes_per_text": {"full row (shm)": VOCAB * 4, f"TopK({args.k}) values + int32 indices": args.k * 8,
                           "JSON answer": len(body) // len(TEXTS)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
