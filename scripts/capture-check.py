#!/usr/bin/env python3
"""How far goodput's recorded TTFT is from the TTFT seen on the wire.

Starts `goodput sim` and `goodput serve` on loopback ports, captures loopback traffic with
tcpdump (nanosecond stamps), and drives streaming chat requests at a fixed concurrency
through the proxy. For every request it takes, from the capture:
  - the arrival: the first packet of the request on the client's connection to the proxy
    (found by its x-request-id),
  - the first token: the packet from the simulator that completes the first
    content-bearing event (a non-empty `content` delta; the role-only first chunk is no
    token) on the upstream connection that carried this request (the proxy forwards
    x-request-id upstream),
and compares `first token - arrival` with the record's `ttft_ms` (docs/DESIGN.md, "Timestamps").
Prints P50/P90/P99 of |recorded - packet| and of the signed difference, per record
`clock` (`kernel` or `user`; a build without the field counts as `user`).

Usage: scripts/capture-check.py [--goodput BIN] [--n 200] [--concurrency 4]
       [--max-tokens 16] [--busy 0] [--require-kernel] [--max-kernel-p99-ms MS]
Needs tcpdump and the right to capture on `lo` (root or CAP_NET_RAW); exits 77 (skipped)
with a message otherwise. `--busy N` runs N busy-looping processes beside it, to measure
on busy cores.
"""
import argparse, json, os, re, shutil, struct, subprocess, sys, tempfile, threading, time
import urllib.request, uuid

from ports import free_ports, wait_port

SKIP = 77
CONTENT = re.compile(rb'"content":"[^"]')


def read_pcap(path):
    """(timestamp_ns, src_port, dst_port, tcp payload) of each TCP/IPv4 packet on lo."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0xA1B23C4D:
        scale = 1
    elif magic == 0xA1B2C3D4:
        scale = 1000
    else:
        raise SystemExit(f"unexpected pcap magic {magic:#x}")
    linktype = struct.unpack("<I", data[20:24])[0]
    link_len = {1: 14, 0: 4, 113: 16, 276: 20}.get(linktype)
    if link_len is None:
        raise SystemExit(f"unexpected link type {linktype}")
    off, out = 24, []
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack("<IIII", data[off:off + 16])
        pkt = data[off + 16:off + 16 + incl]
        off += 16 + incl
        ip = pkt[link_len:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport = struct.unpack(">HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            out.append((sec * 1_000_000_000 + frac * scale, sport, dport, bytes(payload)))
    return out


def packet_ttfts(packets, proxy_port, sim_port):
    """{request id: packet-level TTFT in ms}."""
    arrival = {}
    flow_req = {}  # upstream flow (proxy's port) -> request id it carries now
    flow_buf = {}
    first = {}
    rid_re = re.compile(rb"x-request-id: *([0-9a-f-]{36})", re.I)
    for ts, sport, dport, payload in packets:
        if dport == proxy_port:
            m = rid_re.search(payload)
            if m and m.group(1).decode() not in arrival:
                arrival[m.group(1).decode()] = ts
        elif dport == sim_port:
            m = rid_re.search(payload)
            if m:
                flow_req[sport] = m.group(1).decode()
                flow_buf[sport] = b""
        elif sport == sim_port and dport in flow_req:
            rid = flow_req[dport]
            if rid in first:
                continue
            buf = flow_buf[dport] + payload
            # Complete events only: up to the last blank line.
            done = buf.rfind(b"\n\n")
            if done >= 0 and CONTENT.search(buf[:done]):
                first[rid] = ts
            flow_buf[dport] = buf
    return {rid: (first[rid] - arrival[rid]) / 1e6 for rid in first if rid in arrival}


def chat(proxy_port, rid, max_tokens):
    body = {"model": "m", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}]}
    req = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "x-request-id": rid})
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--goodput", default="target/debug/goodput")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--user-clock", action="store_true",
                    help="leave measure.kernel_timestamps off (the process clock), for comparison")
    ap.add_argument("--require-kernel", action="store_true",
                    help="fail unless most requests were timed by kernel receive stamps")
    ap.add_argument("--max-kernel-p99-ms", type=float,
                    help="fail if P99 of |d| of the kernel-clock requests exceeds this")
    a = ap.parse_args()
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        print("skipped: tcpdump is not installed (apt-get install tcpdump)")
        sys.exit(SKIP)
    work = tempfile.mkdtemp(prefix="capture-check-")
    pcap = os.path.join(work, "lo.pcap")
    sim_port, proxy_port, admin_port = free_ports(3)
    procs = []
    try:
        sim = subprocess.Popen([a.goodput, "sim", "--listen", f"127.0.0.1:{sim_port}",
                                "--ttft", "normal:20,5", "--itl", "normal:5,1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(sim)
        cfg = os.path.join(work, "goodput.toml")
        with open(cfg, "w") as f:
            f.write("[measure]\nkernel_timestamps = %s\n" % ("false" if a.user_clock else "true"))
        serve = subprocess.Popen([a.goodput, "serve", "--config", cfg,
                                  "--listen", f"127.0.0.1:{proxy_port}",
                                  "--admin", f"127.0.0.1:{admin_port}",
                                  "--upstream", f"http://127.0.0.1:{sim_port}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(serve)
        wait_port(sim_port, sim)
        wait_port(proxy_port, serve)
        dump = subprocess.Popen([tcpdump, "-i", "lo", "-w", pcap, "-U", "-s", "2048",
                                 "--time-stamp-precision=nano",
                                 f"tcp port {proxy_port} or tcp port {sim_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(dump)
        # tcpdump says "listening on" once the capture runs.
        line = dump.stderr.readline()
        if b"listening" not in line:
            dump.wait(timeout=5)
            print(f"skipped: tcpdump cannot capture on lo: {line.decode().strip()}")
            sys.exit(SKIP)
        threading.Thread(target=dump.stderr.read, daemon=True).start()
        for _ in range(a.busy):
            p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            procs.append(p)
        ids = [str(uuid.uuid4()) for _ in range(a.n)]
        queue = list(ids)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not queue:
                        return
                    rid = queue.pop()
                chat(proxy_port, rid, a.max_tokens)

        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        recs = {}
        for _ in range(100):
            got = json.load(urllib.request.urlopen(
                f"http://127.0.0.1:{admin_port}/api/v1/requests?limit=100000"))["requests"]
            recs = {r["id"]: r for r in got}
            if all(i in recs for i in ids):
                break
            time.sleep(0.1)
        time.sleep(0.5)  # the last packets reach the file (-U writes per packet)
        dump.terminate()
        dump.wait(timeout=10)
        wire = packet_ttfts(read_pcap(pcap), proxy_port, sim_port)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    by_clock = {}
    for rid in ids:
        r = recs.get(rid)
        if r is None or r.get("ttft_ms") is None or rid not in wire:
            continue
        by_clock.setdefault(r.get("clock", "user"), []).append(r["ttft_ms"] - wire[rid])
    matched = sum(len(v) for v in by_clock.values())
    print(f"{matched} of {a.n} requests matched in the capture "
          f"(concurrency {a.concurrency}, {a.busy} busy processes, {os.cpu_count()} cores)")
    print(f"{'clock':<8}{'n':>6}{'|d| P50':>10}{'|d| P90':>10}{'|d| P99':>10}"
          f"{'d P50':>10}{'d P99':>10}   (ms; d = recorded - packet TTFT)")
    for clock, d in sorted(by_clock.items()):
        ad = [abs(x) for x in d]
        print(f"{clock:<8}{len(d):>6}{pct(ad, .5):>10.3f}{pct(ad, .9):>10.3f}"
              f"{pct(ad, .99):>10.3f}{pct(d, .5):>10.3f}{pct(d, .99):>10.3f}")
    shutil.rmtree(work, ignore_errors=True)
    if matched < a.n * 0.9:
        raise SystemExit("fewer than 90% of the requests were found in the capture")
    kernel = [abs(x) for x in by_clock.get("kernel", [])]
    if a.require_kernel and len(kernel) < matched * 0.9:
        raise SystemExit(f"only {len(kernel)} of {matched} requests have clock=kernel")
    if a.max_kernel_p99_ms is not None and kernel and pct(kernel, .99) > a.max_kernel_p99_ms:
        raise SystemExit(f"kernel-clock P99 {pct(kernel, .99):.3f} ms is over "
                         f"{a.max_kernel_p99_ms} ms")


if __name__ == "__main__":
    main()
