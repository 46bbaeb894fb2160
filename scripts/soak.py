#!/usr/bin/env python3
"""Soak: mixed, partly hostile traffic through `goodput serve` for a bounded time, then a
check that nothing was lost or leaked.

Starts `goodput sim` (with HTTP 500s and mid-stream resets) and `goodput serve` in front
of it, all on 127.0.0.1, and runs --concurrency workers for --duration seconds (or until
--max-requests), each picking one of: a streamed chat completion on a kept-alive
connection, a non-streaming one, a client that aborts mid-stream (RST or FIN), a client
that leaves before the first token, a slow reader with a small receive window, and a
request that is not HTTP at all (refused by the server, so not expected in the records).

Prints at start and end the proxy's open fds, its CLOSE_WAIT sockets and its RSS, then the
records (`goodput_requests_total`) against the requests sent. Exits 1 if they differ, if
a measurement was dropped or is still in flight, or if fds or CLOSE_WAIT sockets grew.

  cargo build --release && scripts/soak.py                  # 10 minutes
  scripts/soak.py --duration 30 --bin target/debug/goodput  # a quick check
"""
import argparse, json, os, random, re, socket, struct, subprocess, sys, tempfile, threading, time
import http.client
from ports import free_ports, wait_port

SCENARIOS = {  # name: weight
    "stream": 40,
    "non_stream": 15,
    "abort_mid_stream": 15,
    "abort_before_first_token": 8,
    "slow_reader": 12,
    "not_http": 5,
}
# Upstream misbehaviour, applied by the simulator to any request.
SIM_ERROR_RATE, SIM_RESET_RATE = 0.05, 0.05
# Idle upstream connections are dropped this soon, so the end count of fds can be compared
# with the start.
CONFIG = """
[server]
header_read_timeout = "5s"
drain_timeout = "5s"
[upstream]
url = "http://127.0.0.1:{sim}"
pool_idle_timeout = "2s"
[log]
access_log = false
"""
IO_TIMEOUT = 10  # seconds, every socket operation of a worker


def body(stream, max_tokens, i):
    return json.dumps({
        "model": "soak-model", "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"soak request {i}"}],
    }).encode()


def raw_request(stream, max_tokens, i):
    b = body(stream, max_tokens, i)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(b), b))


class Worker(threading.Thread):
    def __init__(self, n, port, stop_at, budget, seed):
        super().__init__(daemon=True)
        self.port, self.stop_at, self.budget = port, stop_at, budget
        self.rng = random.Random(seed + n)
        self.sent = 0  # requests whose head and body were written whole (expected records)
        self.by_scenario = {name: 0 for name in SCENARIOS}
        self.errors = 0  # client-side failures (resets, 500s, cut streams): expected, counted
        self.conn = None

    def run(self):
        names, weights = list(SCENARIOS), list(SCENARIOS.values())
        while time.time() < self.stop_at and self.budget.take():
            name = self.rng.choices(names, weights)[0]
            self.by_scenario[name] += 1
            try:
                getattr(self, name)()
            except (OSError, http.client.HTTPException):
                self.errors += 1
                self.drop_conn()
        self.drop_conn()

    def drop_conn(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def keepalive_request(self, stream):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=IO_TIMEOUT)
        self.conn.request("POST", "/v1/chat/completions",
                          body=body(stream, self.rng.randint(4, 48), self.sent),
                          headers={"content-type": "application/json"})
        self.sent += 1
        resp = self.conn.getresponse()
        resp.read()
        if resp.status != 200:
            self.errors += 1
        if resp.will_close:
            self.drop_conn()

    def stream(self):
        self.keepalive_request(True)

    def non_stream(self):
        self.keepalive_request(False)

    def abort_mid_stream(self):
        s = self.connect()
        try:
            s.sendall(raw_request(True, 64, self.sent))
            self.sent += 1
            got = b""
            while b"data:" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    return
                got += chunk
        finally:
            if self.rng.random() < 0.5:  # a reset rather than a close
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def abort_before_first_token(self):
        s = self.connect()
        s.sendall(raw_request(True, 16, self.sent))
        self.sent += 1
        # A FIN after the request: the server has the request before it sees the close.
        time.sleep(0.005)
        s.close()

    def slow_reader(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(IO_TIMEOUT)
        s.connect(("127.0.0.1", self.port))
        try:
            s.sendall(raw_request(True, 400, self.sent))
            self.sent += 1
            give_up = time.time() + 3
            while time.time() < give_up:
                chunk = s.recv(256)
                if not chunk:
                    return
                time.sleep(0.02)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            s.close()

    def not_http(self):
        s = self.connect()
        try:
            s.sendall(b"\x16\x03\x01 this is not HTTP\r\n\r\n")
            while s.recv(4096):
                pass
        finally:
            s.close()


class Budget:
    """At most `n` requests in all, shared by the workers."""

    def __init__(self, n):
        self.left, self.lock = n, threading.Lock()

    def take(self):
        with self.lock:
            self.left -= 1
            return self.left >= 0


def socket_inodes(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    return inodes


def snapshot(pid):
    """Open fds, CLOSE_WAIT sockets (state 08 in /proc/net/tcp*) and RSS of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    inodes = socket_inodes(pid)
    close_wait = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "08" and f[9] in inodes:
                close_wait += 1
    rss = next((line.split(None, 1)[1].strip() for line in open(f"/proc/{pid}/status")
                if line.startswith("VmRSS:")), "?")
    return {"fds": fds, "close_wait": close_wait, "rss": rss}


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(admin):
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {
        "records": int(metric_sum(text, "goodput_requests_total")),
        "in_flight": int(metric_sum(text, "goodput_in_flight_requests")),
        "dropped": int(metric_sum(text, "goodput_measurement_dropped_total")),
    }


def show(label, snap):
    print(f"{label}: fds {snap['fds']}, CLOSE_WAIT {snap['close_wait']}, RSS {snap['rss']}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds of traffic (default 600)")
    ap.add_argument("--concurrency", type=int, default=16, help="client workers (default 16)")
    ap.add_argument("--max-requests", type=int, default=500_000, help="stop after this many")
    ap.add_argument("--bin", default=None,
                    help="goodput binary (default target/release/goodput, else target/debug/goodput)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    binary = args.bin or next((b for b in ("target/release/goodput", "target/debug/goodput")
                               if os.path.exists(b)), None)
    if binary is None:
        raise SystemExit("no goodput binary: cargo build --release, or pass --bin")

    sim_port, proxy_port, admin_port = free_ports(3)
    tmp = tempfile.mkdtemp(prefix="goodput-soak-")
    config = os.path.join(tmp, "soak.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(sim=sim_port))
    log = open(os.path.join(tmp, "serve.log"), "w")
    procs = [
        subprocess.Popen([binary, "sim", "--listen", f"127.0.0.1:{sim_port}", "--ttft", "fixed:30",
                          "--itl", "fixed:2", "--error-rate", str(SIM_ERROR_RATE),
                          "--reset-rate", str(SIM_RESET_RATE), "--seed", str(args.seed)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([binary, "serve", "-c", config, "--listen", f"127.0.0.1:{proxy_port}",
                          "--admin", f"127.0.0.1:{admin_port}"], stdout=log, stderr=log),
    ]
    proxy = procs[1]
    try:
        wait_port(sim_port, procs[0])
        wait_port(proxy_port, proxy)
        wait_port(admin_port, proxy)
        time.sleep(0.5)  # the probes' connections are closed on both sides by now
        start = snapshot(proxy.pid)
        show("start", start)
        began = time.time()
        budget = Budget(args.max_requests)
        workers = [Worker(i, proxy_port, began + args.duration, budget, args.seed)
                   for i in range(args.concurrency)]
        for w in workers:
            w.start()
        next_report = began + 30
        while any(w.is_alive() for w in workers):
            time.sleep(0.5)
            if time.time() >= next_report:
                next_report += 30
                print(f"  {time.time() - began:4.0f} s: {sum(w.sent for w in workers)} sent, "
                      f"{snapshot(proxy.pid)['fds']} fds", flush=True)
            if proxy.poll() is not None:
                raise SystemExit(f"goodput serve exited with {proxy.returncode} (log: {log.name})")
        for w in workers:
            w.join()
        elapsed = time.time() - began
        sent = sum(w.sent for w in workers)
        mix = {k: sum(w.by_scenario[k] for w in workers) for k in SCENARIOS}
        print(f"traffic: {elapsed:.0f} s, {sent} requests sent ({sent / elapsed:.0f}/s), "
              f"{sum(w.errors for w in workers)} client-side errors; mix {mix}", flush=True)

        # Records are finished off the data path, and idle upstream connections leave the
        # pool within pool_idle_timeout plus a sweep: wait for both, a bounded time.
        deadline = time.time() + 15
        while True:
            # The snapshot first: the scrape's own connection is briefly in CLOSE_WAIT.
            end, m = snapshot(proxy.pid), scrape(admin_port)
            settled = (m["records"] >= sent and m["in_flight"] == 0
                       and end["fds"] <= start["fds"] and end["close_wait"] <= start["close_wait"])
            if settled or time.time() >= deadline:
                break
            time.sleep(0.5)
        show("end", end)
        print(f"records: {m['records']} of {sent} sent; in flight {m['in_flight']}, "
              f"dropped {m['dropped']}")
        problems = []
        if m["records"] != sent:
            problems.append(f"{m['records']} records for {sent} requests")
        if m["in_flight"] != 0 or m["dropped"] != 0:
            problems.append(f"in flight {m['in_flight']}, dropped {m['dropped']}")
        if end["fds"] > start["fds"]:
            problems.append(f"fds grew from {start['fds']} to {end['fds']}")
        if end["close_wait"] > start["close_wait"]:
            problems.append(f"CLOSE_WAIT grew from {start['close_wait']} to {end['close_wait']}")
        if problems:
            print("soak: FAILED: " + "; ".join(problems) + f" (proxy log: {log.name})")
            return 1
        print("soak: ok")
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
