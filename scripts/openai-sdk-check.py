#!/usr/bin/env python3
"""Acceptance check: the stock OpenAI Python SDK streaming through `goodput serve` gets
byte-identical responses to a direct connection, goodput's records agree with the
simulator's own accounting, and streams the SDK reads to `[DONE]` are complete (`ok`) even
though the upstream behind the proxy ends each body 400 ms after `[DONE]` (as
llama-cpp-python's server does) and the SDK has closed the connection by then.

Starts two simulators with the same seed (one behind goodput, one direct), sends the same
sequence of requests to both, and compares the raw streamed bytes (with the `created`
timestamps, wall-clock seconds, normalised). Usage: scripts/openai-sdk-check.py [BINARY]
(default target/release/goodput). Needs `pip install openai`.
"""
import json, re, subprocess, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from ports import free_ports, wait_port

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/goodput"


def normalise(raw: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', raw)


def records_by_prefix(admin, prefix, n):
    """Waits (up to 10 s) for `n` records whose id starts with `prefix`."""
    found = []
    for _ in range(200):
        recs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{admin}/api/v1/requests?limit=100000"))["requests"]
        found = [r for r in recs if r["id"].startswith(prefix)]
        if len(found) >= n:
            break
        time.sleep(0.05)
    return found


def check_complete_streams(via, admin, n=40):
    """The SDK reads each stream to `[DONE]` and closes it while the upstream still holds
    the body open: every one is a complete stream."""
    def one(i):
        for kind in ("usage", "plain"):
            extra = {"stream_options": {"include_usage": True}} if kind == "usage" else {}
            stream = via.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": f"complete {i}"}],
                max_tokens=8, stream=True, extra_headers={"x-request-id": f"complete-{kind}-{i}"}, **extra)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert text, f"stream {i} ({kind}) brought no text"
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(n // 2)))
    recs = records_by_prefix(admin, "complete-", n)
    assert len(recs) == n, f"{len(recs)} of {n} complete streams recorded"
    bad = [r for r in recs if r["outcome"] != "ok" or r["terminal_event"] is not True]
    assert not bad, f"{len(bad)} of {n} complete streams not recorded as ok: {bad[:2]}"
    slowest = max(r["e2e_ms"] for r in recs)
    print(f"complete streams: {n} of {n} ok with terminal_event (slowest e2e {slowest:.1f} ms)")


def main():
    ports = dict(zip(("sim_a", "sim_b", "proxy", "admin"), free_ports(4)))
    sim = ["--ttft", "fixed:20", "--itl", "fixed:2", "--seed", "7"]
    procs = [
        subprocess.Popen([BIN, "sim", "--listen", f"127.0.0.1:{ports['sim_a']}", *sim,
                          "--pause-after-done", "400"]),
        subprocess.Popen([BIN, "sim", "--listen", f"127.0.0.1:{ports['sim_b']}", *sim]),
        subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{ports['proxy']}",
                          "--admin", f"127.0.0.1:{ports['admin']}",
                          "--upstream", f"http://127.0.0.1:{ports['sim_a']}"],
                         stderr=subprocess.DEVNULL),
    ]
    try:
        for p in ports.values():
            wait_port(p)
        # A port that opened is only ours if every process is still running (another
        # program may have taken one between picking and binding).
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"{' '.join(p.args[:2])} exited with {p.returncode} at start")
        via = OpenAI(base_url=f"http://127.0.0.1:{ports['proxy']}/v1", api_key="sk-test")
        direct = OpenAI(base_url=f"http://127.0.0.1:{ports['sim_b']}/v1", api_key="sk-test")
        cases = [
            dict(stream=True, stream_options={"include_usage": True}, max_tokens=40),
            dict(stream=True, max_tokens=17),
            dict(stream=False, max_tokens=9),
        ]
        for i, extra in enumerate(cases):
            args = dict(model="sim-model", messages=[{"role": "user", "content": f"case {i}"}], **extra)
            bodies = []
            for client in (via, direct):
                with client.chat.completions.with_streaming_response.create(**args) as resp:
                    bodies.append(b"".join(resp.iter_bytes()))
            if normalise(bodies[0]) != normalise(bodies[1]):
                raise SystemExit(f"case {i}: bytes differ\nvia proxy: {bodies[0][:300]!r}\ndirect: {bodies[1][:300]!r}")
            print(f"case {i}: {len(bodies[0])} bytes identical")
        # The SDK's own parsing, through the proxy.
        stream = via.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "x"}],
                                             max_tokens=12, stream=True, stream_options={"include_usage": True},
                                             extra_headers={"x-request-id": "sdk-check"})
        text, usage = "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage:
                usage = chunk.usage
        assert usage is not None and usage.completion_tokens == 12, usage
        # Records are finished off the data path (some after token counting): poll by id.
        last = None
        for _ in range(100):
            recs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{ports['admin']}/api/v1/requests"))["requests"]
            last = next((r for r in recs if r["id"] == "sdk-check"), None)
            if last:
                break
            time.sleep(0.05)
        assert last is not None, "the SDK request was not recorded"
        assert last["output_tokens"] == 12 and last["output_tokens_source"] == "usage", last
        assert last["outcome"] == "ok" and last["ttft_ms"] >= 20, last
        print(f"SDK stream: {usage.completion_tokens} tokens; record ttft {last['ttft_ms']:.2f} ms, tpot {last['tpot_ms']:.2f} ms")
        check_complete_streams(via, ports["admin"])
        print("openai-sdk-check: ok")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
