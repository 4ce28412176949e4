"""Vectors on the wire: vLLM's /v1/embeddings answered as JSON floats against base64 float32 (what RemoteEngine
asks for), per 1,000 all-MiniLM-L6-v2 vectors (384 dimensions) of short queries (5-12 words): response bytes, the
client's time (request to numpy array) and the decode time alone, the median of ``--repeats`` rounds. Starts its
own server on loopback unless ``--url`` names one serving the model.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/wire_format.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")  # vllm-rbln's platform needs rebel-compiler (see run.py)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import numpy as np
from models import minilm_path, queries

VECTORS = 1000
BATCH = 64  # RemoteEngine's default batch size
FORMATS = {
    "json": {"encoding_format": "float"},
    "base64": {"encoding_format": "base64", "embed_dtype": "float32", "endianness": "little"},
}


def decode(rows: list[dict], fmt: str) -> np.ndarray:
    if fmt == "json":
        return np.asarray([row["embedding"] for row in rows], dtype=np.float32)
    return np.stack([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in rows])


def one_round(client: httpx.Client, url: str, model: str, texts: list[str], fmt: str) -> dict[str, float]:
    """Bytes, client seconds and decode seconds for ``texts``, sent in batches as RemoteEngine sends them."""
    size = client_s = decode_s = 0.0
    vectors = []
    for i in range(0, len(texts), BATCH):
        started = time.perf_counter()
        response = client.post(
            url + "/v1/embeddings",
            json={"model": model, "input": texts[i : i + BATCH], "truncate_prompt_tokens": 256, **FORMATS[fmt]},
        )
        if response.status_code != 200:
            raise SystemExit(f"the server answered {response.status_code}: {response.text[:300]}")
        decoding = time.perf_counter()
        vectors.append(decode(sorted(response.json()["data"], key=lambda row: row["index"]), fmt))
        done = time.perf_counter()
        size += len(response.content)
        client_s += done - started
        decode_s += done - decoding  # JSON parsing of the body included: it is the format's cost
    return {"bytes": size, "client_s": client_s, "decode_s": decode_s, "vectors": np.concatenate(vectors)}


def serve(model: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys; from rbln_retrieval.server.serve import serve; "
        "sys.exit(serve(sys.argv[1], port=int(sys.argv[2]), device='cpu', dtype='float32'))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(model), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        time.sleep(1)
    raise SystemExit("the server did not start in 600 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server of all-MiniLM-L6-v2 (default: start one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "wire_format.json")
    args = parser.parse_args()
    model = minilm_path()
    process, url = (None, args.url) if args.url else serve(model)
    texts = queries(VECTORS)  # short texts: the server's compute stays small beside what the formats cost
    try:
        with httpx.Client(timeout=120) as client:
            model_name = client.get(url + "/v1/models").json()["data"][0]["id"]
            one_round(client, url, model_name, texts[:BATCH], "json")  # warm-up
            rounds = {fmt: [] for fmt in FORMATS}
            for _ in range(args.repeats):
                for fmt in FORMATS:  # alternating, so both see the same load
                    rounds[fmt].append(one_round(client, url, model_name, texts, fmt))
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=60)
    # Both formats carry float32 exactly; two calls may batch differently, which moves the last bits.
    np.testing.assert_allclose(rounds["json"][0]["vectors"], rounds["base64"][0]["vectors"], atol=1e-6)
    figures = {
        fmt: {
            "bytes_per_1000_vectors": int(statistics.median(r["bytes"] for r in runs)),
            "client_ms_per_1000_vectors": round(1000 * statistics.median(r["client_s"] for r in runs), 1),
            "decode_ms_per_1000_vectors": round(1000 * statistics.median(r["decode_s"] for r in runs), 1),
        }
        for fmt, runs in rounds.items()
    }
    result = {"model": "all-MiniLM-L6-v2 (384 dims, float32)", "batch": BATCH, "repeats": args.repeats, **figures}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
