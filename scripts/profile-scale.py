#!/usr/bin/env python3
"""Profile tools at fleet scale: time and peak memory of `goodput profile` commands.

Generates synthetic profiles in the recorded format (docs/PROFILE.md, version 1) and runs
summarize, diff, export (mooncake and parquet), merge and sample on them under
`/usr/bin/time -v`, printing wall and CPU (user + system) time, maximum RSS and the
output's size (in all and per request) per command. Results are recorded in
docs/PERFORMANCE.md ("Profile tools at scale").

    scripts/profile-scale.py                        # 1,000,000 requests, release build
    scripts/profile-scale.py --requests 250000      # check that time grows linearly
    scripts/profile-scale.py --goodput /tmp/old-goodput --keep

The profiles go to a temporary directory (`--dir` to choose it; about 395 bytes per
request, plus as much again for the two halves merged) and are deleted afterwards unless
`--keep` (and with `--keep`, profiles already in `--dir` are reused). Lines are written as the recorder writes them: in the order requests
*finished* (arrival + e2e), `blocks` lines just before the first request using their
ids, ids numbered per file in order of first appearance.

The traffic: Poisson arrivals at 60/s with bursts, three models, four APIs, log-normal
input (median 900 tokens) and output (median 180) lengths, a few outcomes and SLO
misses, and prompts that start with one of 40 shared system prompts (1-6 blocks, shared
by both halves through equal keys) followed by blocks of their own.
"""

import argparse
import heapq
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

MODELS = [("llama-3.1-70b", 0.6), ("qwen2.5-32b", 0.3), ("mistral-7b", 0.1)]
APIS = [("chat_completions", 0.7), ("responses", 0.1), ("messages", 0.15), ("completions", 0.05)]
OUTCOMES = [("ok", 0.95), ("client_abort", 0.02), ("upstream_error", 0.015), ("timeout", 0.015)]
SALT_ID = "5e87738cb5239d75"
START_MS = 1_796_220_000_000  # 2026-12-02T13:20:00Z
BLOCK_BYTES = 2048
BYTES_PER_TOKEN = 4


def pick(rng, table):
    x = rng.random()
    for name, p in table:
        x -= p
        if x < 0:
            return name
    return table[-1][0]


def header(started_ms):
    t = time.gmtime(started_ms // 1000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", t) + ".%03dZ" % (started_ms % 1000)
    return (
        '{"type":"header","format":"goodput-profile","version":1,"started_at":"%s",'
        '"salt_id":"%s","goodput_version":"0.1.0","block":{"unit":"bytes","size":2048},'
        '"contract":{"engine":"vllm","engine_version":"0.11.0","hardware":"1x H100 80GB"}}'
        % (stamp, SALT_ID)
    )


def requests(n, seed, start_ms):
    """Yields (arrival_ms, fields..., keys) in arrival order."""
    rng = random.Random(seed)
    t = float(start_ms)
    for i in range(n):
        # Poisson at 60/s, with one request in 200 opening a burst of ten times the rate.
        rate = 600.0 if (i // 50) % 200 == 0 else 60.0
        t += rng.expovariate(rate / 1000.0)
        inp = max(1, int(rng.lognormvariate(math.log(900), 0.8)))
        out = max(1, int(rng.lognormvariate(math.log(180), 0.6)))
        outcome = pick(rng, OUTCOMES)
        ttft = round(rng.lognormvariate(math.log(150), 0.5), 1)
        tpot = round(rng.lognormvariate(math.log(25), 0.3), 1)
        e2e = round(ttft + tpot * out, 1)
        if outcome == "client_abort":
            out = rng.randint(0, out)
            e2e = round(ttft + tpot * out, 1)
        system = rng.randrange(40)
        shared = 1 + system % 6
        total = max(1, math.ceil(inp * BYTES_PER_TOKEN / BLOCK_BYTES))
        keys = ["%08x%08x" % (system + 1, b) for b in range(min(shared, total))]
        keys += ["%016x" % rng.getrandbits(64) for _ in range(total - len(keys))]
        slo_met = None if outcome == "client_abort" else (outcome == "ok" and ttft < 300)
        yield (int(t), pick(rng, MODELS), pick(rng, APIS), rng.random() < 0.85, inp, out,
               outcome, slo_met, ttft, tpot, e2e, "%016x" % rng.randrange(50), keys)


def write_profile(path, n, seed, start_ms):
    """Writes `n` requests in finish order; returns the file's size."""
    ids = {}
    in_flight = []  # (finish_ms, seq, request)
    seq = 0

    with open(path, "w") as f:
        f.write(header(start_ms) + "\n")

        def emit(r):
            (at, model, api, stream, inp, out, outcome, slo_met, ttft, tpot, e2e, tenant,
             keys) = r
            fresh_first = None
            fresh = []
            hash_ids = []
            for k in keys:
                i = ids.get(k)
                if i is None:
                    i = ids[k] = len(ids)
                    if fresh_first is None:
                        fresh_first = i
                    fresh.append(k)
                hash_ids.append(i)
            if fresh:
                f.write('{"type":"blocks","first_id":%d,"keys":["%s"]}\n'
                        % (fresh_first, '","'.join(fresh)))
            status = {"ok": 200, "client_abort": "null", "upstream_error": 502,
                      "timeout": 504}[outcome]
            f.write(
                '{"t_ms":%d,"model":"%s","api":"%s","stream":%s,"input_tokens":%d,'
                '"input_tokens_source":"usage","output_tokens":%d,"output_tokens_source":"usage",'
                '"max_tokens":2048,"outcome":"%s","status":%s,"slo_class":"interactive",'
                '"slo_met":%s,"ttft_ms":%s,"tpot_ms":%s,"e2e_ms":%s,"tenant":"%s","hash_ids":[%s]}\n'
                % (at - start_ms, model, api, "true" if stream else "false", inp, out, outcome,
                   status, "null" if slo_met is None else ("true" if slo_met else "false"),
                   ttft, tpot, e2e, tenant, ",".join(map(str, hash_ids))))

        for r in requests(n, seed, start_ms):
            while in_flight and in_flight[0][0] <= r[0]:
                emit(heapq.heappop(in_flight)[2])
            heapq.heappush(in_flight, (r[0] + r[10], seq, r))
            seq += 1
        while in_flight:
            emit(heapq.heappop(in_flight)[2])
    return os.path.getsize(path)


def measure(goodput, args, out_path):
    cmd = ["/usr/bin/time", "-v", goodput, "profile"] + args
    with open(out_path, "wb") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1):  # diff exits 1 on drift
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr))
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", p.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    cpu = sum(float(re.search(r"%s time \(seconds\): ([\d.]+)" % k, p.stderr).group(1))
              for k in ("User", "System"))
    h, m, s = wall.groups()
    seconds = int(h or 0) * 3600 + int(m) * 60 + float(s)
    return seconds, cpu, int(rss.group(1)) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--goodput", default="target/release/goodput")
    ap.add_argument("--dir", help="where the profiles go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the generated profiles")
    ap.add_argument("--only", help="comma-separated commands to run")
    a = ap.parse_args()

    work = a.dir or tempfile.mkdtemp(prefix="goodput-profile-scale-")
    os.makedirs(work, exist_ok=True)
    full, half_a, half_b = (os.path.join(work, x) for x in
                            ("full.jsonl", "gw1.jsonl", "gw2.jsonl"))
    try:
        t0 = time.time()
        if a.keep and all(os.path.exists(p) for p in (full, half_a, half_b)):
            print("reusing the profiles in %s" % work, file=sys.stderr)
        else:
            size = write_profile(full, a.requests, 1, START_MS)
            # Two instances behind one balancer: each half of the traffic, same salt.
            write_profile(half_a, a.requests // 2, 2, START_MS)
            write_profile(half_b, a.requests - a.requests // 2, 3, START_MS + 7)
            print("generated %d requests (%.0f MB) and two halves in %.0f s"
                  % (a.requests, size / 1e6, time.time() - t0), file=sys.stderr)
        sink = os.path.join(work, "out")
        commands = [
            ("summarize", ["summarize", full]),
            ("diff", ["diff", full, half_a]),
            ("export --format mooncake", ["export", "--format", "mooncake", full]),
            ("export --format parquet", ["export", "--format", "parquet", full]),
            ("merge (two halves)", ["merge", half_a, half_b]),
            ("sample --k 5", ["sample", "--k", "5", full]),
        ]
        only = set(a.only.split(",")) if a.only else None
        print("| command | requests | wall time (s) | CPU time (s) | max RSS (MB) | output (MB) "
              "| output bytes a request |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, args in commands:
            if only and name.split()[0] not in only:
                continue
            seconds, cpu, mb = measure(a.goodput, args, sink)
            out = os.path.getsize(sink)
            print("| `%s` | %d | %.1f | %.1f | %.0f | %.1f | %.1f |"
                  % (name, a.requests, seconds, cpu, mb, out / 1e6, out / a.requests),
                  flush=True)
            os.remove(sink)
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(work, ignore_errors=True)
        elif not a.keep:
            for p in (full, half_a, half_b):
                if os.path.exists(p):
                    os.remove(p)


if __name__ == "__main__":
    main()
