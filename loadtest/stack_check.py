"""The stack's answers under load against PyTorch fp32, on both gateway pipelines, and what each hop of a
lone short text costs (issue 20).

    python -m loadtest stack-check --repository DIR --model DIR [--texts 256] [--concurrency 64] --out DIR

On a built repository (e.g. the one benchmark 7 built: `--work W` leaves W/repository and W/model):
1. Answers under load: `--texts` corpus texts sent at once, `--concurrency` at a time, one text per
   request, through the gateway with GATEWAY_PIPELINE=scheduler and =ensemble; then `--lone-texts` of
   them one at a time (scheduler: one-row runs, which a GPU step replays as CUDA graphs); every
   embedding is compared with the model's own PyTorch fp32 mean pooling (min cosine; the gate is 0.9999).
2. Hops of one short text, sequential, median of `--repeats`: the step's graph alone (onnxruntime,
   the stub's environment), the model step through Triton (gRPC, a packed or padded request as the
   gateway sends it), the same config with a model.py that computes nothing (loadtest/echo_step: what
   Triton and the python backend's round trip cost alone), the ensemble through Triton (tokenizer +
   step), and the gateway's /embed.
Writes results.json and summary.md under --out/<name>-stack-check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.bench7 import SHORT_TEXT, step_alone_ms
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.http_client import Connection
from loadtest.machine import describe_machine
from loadtest.results_table import RunContext, add_table_argument, record_rows


def reference(model_dir: Path, texts: list[str], max_len: int) -> np.ndarray:
    """PyTorch fp32 mean pooling of `texts` cut at `max_len` tokens (the builder's pooling), on the GPU when
    there is one."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), 32):
            enc = tokenizer(texts[start:start + 32], padding=True, truncation=True, max_length=max_len,
                            return_tensors="pt").to(device)
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            out.append(((hidden * mask).sum(1) / mask.sum(1)).cpu().numpy())
    return np.concatenate(out)


async def embed_all(url: str, model: str, texts: list[str], concurrency: int) -> np.ndarray:
    """Every text's embedding, one text per request, `concurrency` requests at a time."""
    results: list[np.ndarray | None] = [None] * len(texts)
    queue = iter(range(len(texts)))
    connections = [Connection(url) for _ in range(concurrency)]

    async def worker(connection: Connection) -> None:
        for i in queue:
            body = orjson.dumps({"model": model, "inputs": texts[i], "normalize": False})
            status, _, data = await connection.post("/embed", body)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
            results[i] = np.asarray(orjson.loads(data)["embeddings"][0], dtype=np.float32)

    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    return np.stack(results)  # type: ignore[arg-type]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


ECHO_MODEL_PY = Path(__file__).parent / "echo_step" / "model.py"  # a model step's model.py that computes nothing


def echo_repository(repository: Path, step: str, into: Path) -> str:
    """A repository at `into` holding only `{step}_echo`: `step`'s config (batching, instances, parameters; no
    warm-up) with loadtest/echo_step/model.py, which answers zeros. Its name."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse((repository / step / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = f"{step}_echo"
    del config.model_warmup[:]
    (into / config.name / "1").mkdir(parents=True, exist_ok=True)
    (into / config.name / "config.pbtxt").write_text(text_format.MessageToString(config))
    shutil.copy(ECHO_MODEL_PY, into / config.name / "1" / "model.py")
    return config.name


def triton_ms(grpc_url: str, step: str, ensemble: str | None, ids: list[int], repeats: int,
              label: str = "triton step (gRPC)") -> dict[str, float]:
    """Median ms of one short text through the step (as the gateway sends it) and through the ensemble."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import model_config_pb2 as mc

    client = grpcclient.InferenceServerClient(grpc_url)
    config: mc.ModelConfig = client.get_model_config(step).config
    packed = config.parameters["layout"].string_value == "packed" if "layout" in config.parameters else False
    n = len(ids)
    if packed:
        tensors = {"input_ids": np.array([ids], np.int32), "token_type_ids": np.zeros((1, n), np.int32),
                   "cu_seqlens": np.array([[0, n]], np.int32)}
    else:
        tensors = {"input_ids": np.array([ids], np.int32), "attention_mask": np.ones((1, n), np.int32),
                   "token_type_ids": np.zeros((1, n), np.int32)}

    def step_call() -> None:
        inputs = []
        for name, array in tensors.items():
            inp = grpcclient.InferInput(name, list(array.shape), "INT32")
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        client.infer(step, inputs, outputs=[grpcclient.InferRequestedOutput("embeddings")])

    def ensemble_call() -> None:
        inp = grpcclient.InferInput("text", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[SHORT_TEXT.encode()]], dtype=np.object_))
        client.infer(ensemble, [inp], outputs=[grpcclient.InferRequestedOutput("embeddings")])

    out = {}
    calls = [(label, step_call)] + ([("triton ensemble (gRPC)", ensemble_call)] if ensemble else [])
    for label, call in calls:
        for _ in range(20):
            call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        out[label] = statistics.median(times) * 1e3
    return out


async def gateway_ms(url: str, model: str, repeats: int) -> float:
    connection = Connection(url)
    body = orjson.dumps({"model": model, "inputs": SHORT_TEXT, "normalize": False})
    try:
        for _ in range(20):
            await connection.post("/embed", body)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            status, _, _ = await connection.post("/embed", body)
            times.append(time.perf_counter() - start)
            assert status == 200, status
    finally:
        await connection.close()
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest stack-check", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True, help="the model directory the repository was built from")
    p.add_argument("--name", default="local")
    p.add_argument("--served", default="bench", help="the served model NAME")
    p.add_argument("--texts", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--lone-texts", type=int, default=64, help="corpus texts also sent one at a time (scheduler)")
    p.add_argument("--out", type=Path, required=True)
    add_table_argument(p)
    args = p.parse_args(argv)
    texts = make_corpus(CorpusSpec(size=args.texts))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = tokenizer(SHORT_TEXT)["input_ids"]
    machine = describe_machine()
    record: dict[str, object] = {"machine": machine.model_dump(mode="json"), "settings": vars(args) | {
        "repository": str(args.repository), "model": str(args.model), "out": str(args.out)}}
    args.out.mkdir(parents=True, exist_ok=True)  # the logs go there
    answers: dict[str, float] = {}
    hops: dict[str, float] = {"graph alone (onnxruntime)": float(step_alone_ms(args.repository, len(ids),
                                                                               args.repeats, len(tokenizer))["median_ms"])}
    with TritonServer(repository=args.repository, log_path=args.out / "triton.log", startup_timeout_s=300) as triton:
        import tritonclient.grpc as grpcclient

        ensemble = grpcclient.InferenceServerClient(triton.grpc_url).get_model_config(f"{args.served}_onnx_ensemble")
        expected = reference(args.model, texts, int(ensemble.config.parameters["max_seq_len"].string_value))
        hops.update(triton_ms(triton.grpc_url, f"{args.served}_onnx", f"{args.served}_onnx_ensemble", ids,
                              args.repeats))
        with tempfile.TemporaryDirectory() as echo_dir:
            echo = echo_repository(args.repository, f"{args.served}_onnx", Path(echo_dir))
            with TritonServer(repository=Path(echo_dir), log_path=args.out / "triton-echo.log") as echo_triton:
                hops.update(triton_ms(echo_triton.grpc_url, echo, None, ids, args.repeats,
                                      "triton step computing nothing (gRPC, python backend round trip)"))
        for pipeline in ("scheduler", "ensemble"):
            settings = {"pipeline": pipeline, "repository": str(args.repository)}  # shipped log level: info
            with GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings=settings, log_path=args.out / f"gateway-{pipeline}.log") as gw:
                got = asyncio.run(embed_all(gw.url, args.served, texts, args.concurrency))
                answers[pipeline] = min_cosine(got, expected)
                if pipeline == "scheduler":  # lone texts: one-row runs (on a GPU, replayed CUDA graphs)
                    alone = asyncio.run(embed_all(gw.url, args.served, texts[:args.lone_texts], 1))
                    answers["scheduler, one at a time"] = min_cosine(alone, expected[:args.lone_texts])
                hops[f"gateway /embed ({pipeline})"] = asyncio.run(gateway_ms(gw.url, args.served, args.repeats))
    record.update(answers=answers, hops_ms=hops)
    lines = [f"# {args.name}-stack-check", "", f"{args.texts} corpus texts, one per request, {args.concurrency} at a "
             "time, against PyTorch fp32 mean pooling (gate 0.9999):", "",
             "| pipeline | min cosine |", "| --- | ---: |",
             *(f"| {k} | {v:.7f} |" for k, v in answers.items()), "",
             f"One short text ('{SHORT_TEXT}', {len(ids)} tokens), sequential, median of {args.repeats}:", "",
             "| path | ms |", "| --- | ---: |", *(f"| {k} | {v:.2f} |" for k, v in hops.items())]
    out = args.out / f"{args.name}-stack-check"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    context = RunContext.of(machine, args.name, out)
    under_load = f"{args.texts} texts c={args.concurrency}"
    record_rows([*(context.row("stack-check", k, under_load, "min cosine vs PyTorch fp32", v, "cosine")
                   for k, v in answers.items()),
                 *(context.row("stack-check", k, "short text c=1", "median", v, "ms") for k, v in hops.items())],
                args.table)
    return 0 if all(v >= 0.9999 for v in answers.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
