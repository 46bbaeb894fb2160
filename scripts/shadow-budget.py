#!/usr/bin/env python3
"""What a large, slow shadow candidate costs the primary's own measurement.

Starts `goodput sim` (the primary), a candidate written here that streams a large answer
slowly (by default 10 MB of OpenAI chat-completion events over about 8 s, without usage,
so the answer's text is counted too), and `goodput serve` in front of the primary, then
sends streamed chat requests at a fixed pace (default 60, one every 250 ms) twice: without
a `[shadow]` and with one mirroring every request to the candidate (`share = 1.0`).

For each run it reports
  - how long after its request ended (the client read the last byte) each primary record
    appeared in `/api/v1/requests` (polled every 20 ms): the largest lag and how many
    took over 1 s;
  - goodput's peak resident memory (VmHWM) and CPU seconds;
  - with the shadow: copies taken, shadow records written and drops by reason (the sum
    must match), read once `goodput_shadow_in_flight_requests` is back at 0.
and the ratio of the two peaks. Exits 1 when a primary record lagged 1 s or more, the
peak ratio is over 1.5, or the shadow's copies do not add up.

Usage: scripts/shadow-budget.py [--goodput BIN] [--n 60] [--every-ms 250]
       [--answer-mb 10] [--answer-s 8] [--extra-shadow KEY=VALUE ...]
"""
import argparse, http.client, json, os, re, subprocess, sys, tempfile, threading, time
import urllib.request, uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ports import free_ports, wait_port


def candidate(answer_bytes, answer_s):
    """A streaming OpenAI-compatible server answering `answer_bytes` of events over
    `answer_s` seconds, on a free port; returns (server, port)."""
    piece = 64 * 1024
    events = max(1, answer_bytes // piece)
    pause = answer_s / events
    # Words, as a model writes them (a text without spaces is one word to the tokenizer).
    words = "the answer is measured as it streams and then counted once it ends ".split()
    text = " ".join(words[i % len(words)] for i in range(piece // 6))[: piece - 120]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for i in range(events):
                    delta = {"content": text} if i else {"role": "assistant", "content": ""}
                    ev = {"id": "c", "object": "chat.completion.chunk", "model": "big",
                          "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                    self._chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    time.sleep(pause)
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _chunk(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(admin_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text, name, labels=None):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)", line)
        if not m or m.group(1) != name:
            continue
        if labels and any(f'{k}="{v}"' not in (m.group(2) or "") for k, v in labels.items()):
            continue
        total += float(m.group(3))
    return total


def one_run(a, shadow_url, work):
    sim_port, proxy_port, admin_port = free_ports(3)
    cfg = os.path.join(work, "shadow.toml" if shadow_url else "plain.toml")
    with open(cfg, "w") as f:
        f.write("[measure]\nrecent_requests = 10000\n")
        if shadow_url:
            f.write(f'[shadow]\nurl = "{shadow_url}"\nshare = 1.0\nmax_in_flight = 128\n'
                    'timeout = "60s"\n')
            for kv in a.extra_shadow:
                k, v = kv.split("=", 1)
                f.write(f"{k} = {v}\n")
    sim = subprocess.Popen([a.goodput, "sim", "--listen", f"127.0.0.1:{sim_port}",
                            "--ttft", "fixed:30", "--itl", "fixed:5"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    serve = subprocess.Popen([a.goodput, "serve", "--config", cfg,
                              "--listen", f"127.0.0.1:{proxy_port}",
                              "--admin", f"127.0.0.1:{admin_port}",
                              "--upstream", f"http://127.0.0.1:{sim_port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(sim_port, sim)
        wait_port(proxy_port, serve)
        wait_port(admin_port, serve)
        cpu0 = cpu_seconds(serve.pid)
        ended, seen, lock = {}, {}, threading.Lock()
        body = json.dumps({"model": "m", "stream": True, "max_tokens": 32,
                           "messages": [{"role": "user", "content": "hello"}]})

        def request(rid):
            c = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=60)
            c.request("POST", "/v1/chat/completions", body,
                      {"content-type": "application/json", "x-request-id": rid})
            r = c.getresponse()
            r.read()
            t = time.time()
            c.close()
            with lock:
                ended[rid] = t

        stop = threading.Event()

        def watch():
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{admin_port}/api/v1/requests?limit=10000",
                            timeout=5) as r:
                        doc = json.load(r)
                    t = time.time()
                    for rec in doc["requests"]:
                        if rec.get("target", "primary") == "primary":
                            seen.setdefault(rec["id"], t)
                except OSError:
                    pass
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ids, threads = [], []
        for i in range(a.n):
            rid = str(uuid.uuid4())
            ids.append(rid)
            th = threading.Thread(target=request, args=(rid,))
            th.start()
            threads.append(th)
            time.sleep(a.every_ms / 1000)
        for th in threads:
            th.join()
        deadline = time.time() + 30
        while time.time() < deadline and not all(r in seen for r in ids):
            time.sleep(0.05)
        stop.set()
        watcher.join()
        lags = [seen[r] - ended[r] if r in seen else float("inf") for r in ids]
        out = {"requests": a.n,
               "max_lag_s": round(max(lags), 3),
               "over_1s": sum(1 for x in lags if x >= 1.0)}
        if shadow_url:
            deadline = time.time() + 120
            while time.time() < deadline:
                if metric(metrics(admin_port), "goodput_shadow_in_flight_requests") == 0:
                    break
                time.sleep(0.2)
            text = metrics(admin_port)
            written = metric(text, "goodput_shadow_requests_total")
            drops = {}
            for line in text.splitlines():
                m = re.match(r'goodput_shadow_dropped_total\{reason="([a-z_]+)"\} ([0-9.]+)', line)
                if m:
                    drops[m.group(1)] = float(m.group(2))
            taken = a.n - drops.get("in_flight", 0)
            out["shadow"] = {"copies_taken": taken, "records_written": written,
                             "dropped": drops,
                             "adds_up": written + sum(v for k, v in drops.items()
                                                      if k not in ("in_flight", "too_large", "timeout"))
                             == taken}
        out["cpu_s"] = round(cpu_seconds(serve.pid) - cpu0, 2)
        out["rss_peak_mb"] = round(proc_status(serve.pid, "VmHWM") / 1024, 1)
        return out
    finally:
        for p in (serve, sim):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goodput", default="target/release/goodput")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--every-ms", type=int, default=250)
    ap.add_argument("--answer-mb", type=float, default=10)
    ap.add_argument("--answer-s", type=float, default=8)
    ap.add_argument("--extra-shadow", action="append", default=[],
                    help="another [shadow] key, as KEY=TOML_VALUE (repeatable)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shadow-budget-")
    server, port = candidate(int(a.answer_mb * 1e6), a.answer_s)
    plain = one_run(a, None, work)
    print("without a shadow:", json.dumps(plain))
    shadowed = one_run(a, f"http://127.0.0.1:{port}", work)
    print("with the shadow: ", json.dumps(shadowed))
    server.shutdown()
    ratio = shadowed["rss_peak_mb"] / max(plain["rss_peak_mb"], 1e-9)
    print(f"RSS peak ratio {ratio:.2f}; primary records over 1 s late: "
          f"{shadowed['over_1s']} of {a.n} (max lag {shadowed['max_lag_s']} s)")
    ok = shadowed["over_1s"] == 0 and ratio <= 1.5 and shadowed["shadow"]["adds_up"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
