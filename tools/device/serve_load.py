#!/usr/bin/env python3
"""Drives a running `ossrt serve` the way a user would (streamed /v1/completions with token-id
prompts, ignore_eos so output lengths hold) and prints one JSON line per measurement.

  serve_load.py PORT prompts 1024,8192,32768,100000      one request per prompt length, alone
  serve_load.py PORT streams 256 1024 1024                N concurrent streams of IN tokens in, OUT out
  serve_load.py PORT chat 64 256 [SCHEMA_FILE]            N concurrent streamed chat completions of OUT
                                                          tokens (temperature 1, seed i, no reasoning:
                                                          thinking_token_budget 0), constrained by the JSON
                                                          Schema in SCHEMA_FILE when given (issue 18's
                                                          64 constrained vs unconstrained)

Standard library only (the GPU machine has no package registry)."""
import http.client
import json
import random
import sys
import threading
import time


def stream_completion(port, prompt_ids, max_tokens, timeout=1800, path="/v1/completions", body=None):
    """One streamed completion; returns status, ttft, e2e, output tokens (from usage), error text."""
    if body is None:
        body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
    body = json.dumps(body)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    res = conn.getresponse()
    if res.status != 200:
        return {"status": res.status, "error": res.read()[:500].decode("utf-8", "replace")}
    ttft, tokens, chunks = None, 0, 0
    for raw in res:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            return {"status": 200, "error": json.dumps(ev["error"])[:500]}
        if ev.get("choices"):
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - t0
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    e2e = time.perf_counter() - t0
    conn.close()
    return {"status": 200, "ttft": ttft, "e2e": e2e, "tokens": tokens, "chunks": chunks}


def random_ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1000, 199000) for _ in range(n)]


def main():
    port, mode = int(sys.argv[1]), sys.argv[2]
    if mode == "prompts":
        for n in [int(x) for x in sys.argv[3].split(",")]:
            r = stream_completion(port, random_ids(n, n), 16)
            r.update(mode="prompt", input_tokens=n)
            print(json.dumps(r), flush=True)
    elif mode in ("streams", "chat"):
        schema = None
        if mode == "streams":
            count, n_in, n_out = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        else:  # chat N OUT [SCHEMA_FILE]: the prompt is a short user message
            count, n_in, n_out = int(sys.argv[3]), 0, int(sys.argv[4])
            schema = json.load(open(sys.argv[5])) if len(sys.argv) > 5 else None
        results = [None] * count
        def request(i):
            if mode == "streams":
                return stream_completion(port, random_ids(n_in, 10_000 + i), n_out)
            body = {"messages": [{"role": "user", "content": f"Describe person {i} as JSON."}],
                    "max_tokens": n_out, "temperature": 1.0, "seed": i, "ignore_eos": True,
                    "thinking_token_budget": 0, "stream": True, "stream_options": {"include_usage": True}}
            if schema is not None:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "person", "schema": schema, "strict": True}}
            return stream_completion(port, None, n_out, path="/v1/chat/completions", body=body)
        def worker(i):
            try:
                results[i] = request(i)
            except Exception as e:  # a dropped connection is a result too
                results[i] = {"status": -1, "error": repr(e)}
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        ok = [r for r in results if r.get("status") == 200 and "error" not in r]
        full = [r for r in ok if r["tokens"] == n_out]
        ttfts = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
        tpots = sorted((r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1)
        pct = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None
        print(json.dumps({"mode": mode, "constrained": schema is not None, "streams": count, "input_tokens": n_in, "output_tokens": n_out,
                          "ok": len(ok), "full_length": len(full), "wall_s": wall,
                          "output_tok_per_s": sum(r["tokens"] for r in ok) / wall,
                          "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
                          "tpot_p50": pct(tpots, 0.5), "tpot_p99": pct(tpots, 0.99),
                          "errors": [r for r in results if r not in ok][:5]}), flush=True)


if __name__ == "__main__":
    main()
