#!/usr/bin/env python3
"""How far each fallback source of a stream's output count is from the engine's own count.

Runs `goodput serve` in front of a real OpenAI-compatible engine (127.0.0.1 only) and, for
each of N prompts, streams a chat completion twice with greedy decoding (temperature 0,
fixed seed, so both runs generate the same tokens):
  - through goodput without `stream_options.include_usage`, with no tokenizer configured:
    the record carries `output_tokens` from the fallback goodput chose, `output_tokens_source`
    and `events` (content events);
  - straight to the engine, not streamed: its `usage.completion_tokens` is the truth.
Prints, per source, the mean and largest error against the truth: the content-event count,
and the count the record chose (with its source).

Usage: scripts/token-sources.py --engine http://127.0.0.1:8001 [--goodput BIN] [--n 40]
       [--max-tokens 32] [--model NAME] [--config FILE]
Checked with llama-cpp-python's server (docs/METRICS.md, "Counting without usage", has the figures).
"""
import argparse, json, subprocess, time, urllib.request, uuid

from ports import free_ports, wait_port


def stream_chat(base, body, request_id=None):
    """POSTs a streaming chat request; returns the list of decoded `data:` payloads."""
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    if request_id:
        req.add_header("x-request-id", request_id)
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            line = line.strip()
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                events.append(json.loads(data))
    return events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--goodput", default="target/release/goodput")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="m")
    ap.add_argument("--config", help="a goodput config file (e.g. one naming a tokenizer)")
    a = ap.parse_args()
    proxy, admin = free_ports(2)
    config = ["--config", a.config] if a.config else []
    serve = subprocess.Popen([a.goodput, "serve", *config, "--listen", f"127.0.0.1:{proxy}",
                              "--admin", f"127.0.0.1:{admin}", "--upstream", a.engine],
                             stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(proxy)
        for i in range(a.n):
            body = {"model": a.model, "stream": True, "max_tokens": a.max_tokens,
                    "temperature": 0, "seed": 7,
                    "messages": [{"role": "user", "content": f"Write about topic number {i}."}]}
            # A UUID: llama-cpp-python's server answers 400 to any other request id.
            rid = str(uuid.uuid4())
            via = stream_chat(f"http://127.0.0.1:{proxy}", body, request_id=rid)
            # The same request unstreamed, for the engine's usage (llama-cpp-python's
            # streams carry none even when asked).
            req = urllib.request.Request(f"{a.engine}/v1/chat/completions",
                                         data=json.dumps({**body, "stream": False}).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                direct = json.load(resp)
            usage = direct.get("usage")
            if not usage:
                raise SystemExit("the engine reported no usage")
            text_via = "".join((c.get("delta") or {}).get("content") or ""
                               for e in via for c in e.get("choices", []))
            text_direct = direct["choices"][0]["message"]["content"] or ""
            rows.append({"id": rid, "truth": usage["completion_tokens"],
                         "same_text": text_via == text_direct})
        recs = {}
        for _ in range(100):
            got = json.load(urllib.request.urlopen(
                f"http://127.0.0.1:{admin}/api/v1/requests?limit=100000"))["requests"]
            recs = {r["id"]: r for r in got}
            if all(r["id"] in recs for r in rows):
                break
            time.sleep(0.1)
    finally:
        serve.terminate()
        serve.wait(timeout=10)
    errors = {}
    for row in rows:
        r = recs.get(row["id"])
        if r is None or not row["same_text"]:
            continue
        errors.setdefault("events", []).append(r["events"] - row["truth"])
        errors.setdefault(f"record ({r['output_tokens_source']})", []).append(
            r["output_tokens"] - row["truth"])
    kept = len(errors.get("events", []))
    print(f"{kept} of {len(rows)} prompts generated the same text twice; truth = engine usage")
    print(f"{'source':<24}{'mean |err|':>12}{'max |err|':>11}{'mean err %':>12}  exact")
    truths = [row["truth"] for row in rows if row["same_text"] and row["id"] in recs]
    for source, errs in sorted(errors.items()):
        if not errs:
            continue
        absd = [abs(e) for e in errs]
        pct = sum(abs(e) / t for e, t in zip(errs, truths) if t) / len(errs) * 100
        exact = sum(1 for e in errs if e == 0)
        print(f"{source:<24}{sum(absd) / len(absd):>12.2f}{max(absd):>11}{pct:>11.1f}%  {exact}/{len(errs)}")


if __name__ == "__main__":
    main()
