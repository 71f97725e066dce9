"""The local stack launcher (`python -m devstack`'s code): real uvicorn workers, openai client, clean exit."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest

from devstack.stack import LocalStack
from gateway.settings import gateway_cpus
from tests.gateway.conftest import shm_segments
from devstack.fake_repository import EMBED_DIM, fake_vector


def unit(text: str) -> np.ndarray:
    v = fake_vector(text, EMBED_DIM)
    return v / np.linalg.norm(v)


def test_two_workers_openai_client_metrics_and_no_leak(
    fake_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = "gwstack"
    temp = tmp_path / "tmp"  # the gateway's TMPDIR: where its multiprocess metrics directory goes
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # as the builder leaves it: GATEWAY_TOKENIZER_THREADS decides
    stack = LocalStack(fake_repository, gateway_settings={"workers": "2", "shm_prefix": prefix}, log_dir=tmp_path)
    with stack:
        assert [p.name for p in temp.iterdir()][0].startswith("gateway-metrics-")
        assert stack.gateway is not None
        url = stack.gateway.url
        deadline = time.monotonic() + 20  # /healthz answered as soon as the first worker was up
        while len(shm_segments(prefix)) < 2 * 3 * 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(shm_segments(prefix)) == 2 * 3 * 16  # workers x ensembles x pool size
        assert stack.gateway.process is not None
        children = psutil.Process(stack.gateway.process.pid).children()  # the workers (and multiprocessing's helper)
        assert len(children) >= 2
        for worker in children:  # 2 workers on this host's share of CPUs: each tokenizes on one thread, no pool
            assert worker.environ().get("TOKENIZERS_PARALLELISM") == ("false" if gateway_cpus() // 2 <= 1 else "true")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        inputs = ["first text", "second one", "third"]
        floats = client.embeddings.create(model="fakeemb", input=inputs, encoding_format="float")
        default = client.embeddings.create(model="fakeemb", input=inputs)  # the client asks for base64
        single = client.embeddings.create(model="fakeemb", input="only one", encoding_format="base64")
        for result in (floats, default):
            assert [d.index for d in result.data] == [0, 1, 2]
            np.testing.assert_allclose(np.array([d.embedding for d in result.data]), [unit(t) for t in inputs], rtol=1e-5)
            assert result.usage.prompt_tokens == result.usage.total_tokens == 4 + 4 + 3
        raw = single.data[0].embedding  # asked for base64 explicitly: the client hands the string back
        assert isinstance(raw, str)
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw), "<f4"), unit("only one"), rtol=1e-5)
        assert {m.id for m in client.models.list()} == {"fakecls", "fakeemb"}
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="missing", input="x")

        with httpx.Client(base_url=url) as http:
            for _ in range(20):
                assert http.post("/classify", json={"inputs": ["a"]}).status_code == 200
            metrics = http.get("/metrics").text
        # 20 requests spread over two workers: the multiprocess collector sums them.
        line = next(ln for ln in metrics.splitlines() if ln.startswith('gateway_requests_total{model="fakecls"'))
        assert float(line.rsplit(" ", 1)[1]) == 20.0
        assert "gateway_shm_regions 96.0" in metrics
        gateway = stack.gateway
        gateway.stop()  # gracefully, as LocalStack would; Triton's graceful stop is not this test's subject
        assert stack.triton is not None
        stack.triton.stop(kill=True)
    assert gateway.process is not None and gateway.process.returncode == 0
    assert shm_segments(prefix) == []  # every worker unlinked its regions
    assert list(temp.iterdir()) == []  # nor is its metrics directory left behind
    log = (tmp_path / "gateway.log").read_text()
    assert '"request_id"' in log and '"level":"info"' in log  # structured JSON access log
