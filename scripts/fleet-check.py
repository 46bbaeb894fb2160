#!/usr/bin/env python3
"""A fleet against a real Prometheus: the fleet's numbers from the shipped rules against the
exact ones from the union of the replicas' records (docs/FLEET.md "Measured").

Starts three `goodput sim` with different latencies, three `goodput serve` replicas in front
of them, and two Prometheus (Debian's `prometheus` package) scraping the replicas with
deploy/prometheus/goodput-rules.yml: one with native histograms on (it scrapes the protobuf
exposition and keeps the native histograms), one without (it scrapes text: the classic
buckets only). Drives a warm-up until every replica has both met and missed requests
before Prometheus starts (so every series' first sample holds the whole warm-up and
`rate()` over the run counts the measured requests exactly; a series born mid-run would
have its first requests left out), then the measured requests, and fails unless:
- fleet attainment from `job:goodput_slo_attainment:ratio_rate5m` is within 0.5 %
  (relative) of Σmet/Σjudged over the measured records, in both Prometheus;
- fleet P50, P95 and P99 TTFT and TPOT from `class_model_quantile:...:histogram_quantile_rate5m`
  in the native-histogram Prometheus are within 2 % of the records' value at rank q·N
  (the rank `histogram_quantile` aims at);
- the classic buckets' share at or under each class threshold (TTFT and TPOT) equals the
  records' share exactly.
The classic-bucket quantiles (the same rules in the other Prometheus) are printed beside
the native ones, not checked: their error is the bucket layout's.

The replicas are stopped together before the rules are read. `rate()` scales each series
by its span plus its extrapolation to the window's end, which, while the replicas are
scraped, is the time since each one's last scrape (their scrapes are out of phase): the
replicas would weigh unequally. Once no scrape comes, every series ends at once and is
extrapolated by the same half interval. The measured request count (`--per`) keeps q·N
off whole numbers (see `main`).

Every wait polls a condition (a port, `/-/ready`, the scraped counts, a rule's evaluation
time) with a deadline; ports are free ones picked at start.
Usage: scripts/fleet-check.py [--goodput BIN] [--prometheus BIN] [--per N (157)]
Exit status: 0 when every check holds, 1 otherwise.
"""
import argparse, json, math, os, re, shutil, subprocess, sys, tempfile, time, urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ports import free_ports, wait_port

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "deploy", "prometheus", "goodput-rules.yml")
# Scrape and rule evaluation interval: short, so that a run of a few seconds holds dozens
# of samples per series.
INTERVAL = 0.2
TTFT_MS, TPOT_MS = 180, 16
# One SLO class whose TTFT threshold sits between the replicas' medians and whose TPOT
# threshold misses on the slowest replica's stream only sometimes.
CONFIG = f"""[log]
access_log = false
[measure]
recent_requests = 100000
[slo.default]
ttft_ms = {TTFT_MS}
tpot_ms = {TPOT_MS}
attainment = 0.9
"""
SIMS = [("lognormal:110,0.45", "normal:11,4"), ("lognormal:170,0.45", "normal:13,4"),
        ("lognormal:260,0.45", "normal:15,4")]
TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
ATTAINMENT_RULE = "job:goodput_slo_attainment:ratio_rate5m"
QUANTILES = (0.5, 0.95, 0.99)
ATTAINMENT_TOLERANCE = 0.005
QUANTILE_TOLERANCE = 0.02
BODY = json.dumps({"model": "fleet-model", "stream": True, "max_tokens": 16,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def poll(what, check, timeout=30):
    """Calls `check` until it returns something true, and returns that; fails after `timeout`."""
    deadline = time.time() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


class Prom:
    def __init__(self, name, port):
        self.name, self.url = name, f"http://127.0.0.1:{port}"

    def query(self, expr):
        res = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        return [(s["metric"], float(s["value"][1])) for s in res["data"]["result"]]

    def one(self, expr):
        got = self.query(expr)
        return got[0][1] if len(got) == 1 else None

    def ready(self):
        try:
            urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).read()
            return True
        except OSError:
            return False


class Replica:
    def __init__(self, sim, proxy, admin):
        self.sim, self.proxy, self.admin = sim, proxy, admin

    def send(self, _):
        req = urllib.request.Request(f"http://127.0.0.1:{self.proxy}/v1/chat/completions",
                                     data=BODY, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    def records(self):
        return get(f"http://127.0.0.1:{self.admin}/api/v1/requests?limit=100000")["requests"]


def prometheus_version(prom):
    try:
        out = subprocess.run([prom, "--version"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit(f"{prom} not found: install Debian's prometheus package")
    m = re.search(r"version (\d+)\.(\d+)", out)
    if not m:
        raise SystemExit(f"cannot read the version of {prom}: {out!r}")
    return int(m.group(1)), int(m.group(2))


def drive(replicas, per):
    with ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda i: replicas[i % len(replicas)].send(i), range(per * len(replicas))))


def records(replicas, n):
    """Every replica's records once it holds `n` (a record is written as its response ends,
    so the last may follow the client's read by a moment)."""
    return [poll("the replicas' records", lambda: (lambda x: len(x) == n and x)(r.records()))
            for r in replicas]


def scraped(prom, replicas, sent, native):
    """True once `prom` holds every replica's `sent` requests in its counter and in its
    TTFT histogram (native or classic)."""
    hist = f"histogram_count({TTFT})" if native else f"{TTFT}_count"
    for expr in (f"sum by (instance) (goodput_requests_total)", f"sum by (instance) ({hist})"):
        got = {m["instance"]: v for m, v in prom.query(expr)}
        for r, n in zip(replicas, sent):
            if got.get(f"127.0.0.1:{r.admin}") != n:
                return False
    return True


def exact(values, q):
    """The value at rank ⌈q·N⌉: the observation whose bucket histogram_quantile's rank q·N
    falls in."""
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def rule(prom, name, after, **labels):
    """The rule's value from an evaluation at or after `after` (seconds since the epoch)."""
    sel = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    poll(f"{prom.name}: {sel} evaluated", lambda: (prom.one(f"timestamp({sel})") or 0) >= after)
    return prom.one(sel)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goodput", default=os.path.join(HERE, "..", "target", "debug", "goodput"))
    ap.add_argument("--prometheus", default="prometheus")
    # 471 measured requests: q·N is 235.5, 447.45 and 466.29 at P50, P95 and P99, each away
    # from a whole number, so the slightly unequal weights `rate()` gives the replicas (their
    # spans differ by up to a scrape) cannot move histogram_quantile's rank onto the next
    # observation (at q·N = 456 of 480 they can: +1.9 % once at P95).
    ap.add_argument("--per", type=int, default=157, help="measured requests per replica")
    args = ap.parse_args()
    major, minor = prometheus_version(args.prometheus)
    if (major, minor) < (2, 40):
        raise SystemExit(f"Prometheus {major}.{minor} has no native histograms (2.40 or later)")

    tmp = tempfile.mkdtemp(prefix="goodput-fleet-")
    ports = free_ports(3 * len(SIMS) + 2)
    replicas = [Replica(*ports[3 * i:3 * i + 3]) for i in range(len(SIMS))]
    native, classic = Prom("native", ports[-2]), Prom("classic", ports[-1])
    procs, logs = [], []

    def start(name, argv):
        log = os.path.join(tmp, name + ".log")
        logs.append(log)
        procs.append(subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT))
        return procs[-1]

    try:
        with open(os.path.join(tmp, "goodput.toml"), "w") as f:
            f.write(CONFIG)
        serves = []
        for i, (r, (ttft, itl)) in enumerate(zip(replicas, SIMS)):
            sim = start(f"sim{i}", [args.goodput, "sim", "--listen", f"127.0.0.1:{r.sim}",
                                    "--ttft", ttft, "--itl", itl, "--seed", str(i + 1)])
            wait_port(r.sim, sim)
            serves.append(start(f"serve{i}", [
                args.goodput, "serve", "-c", os.path.join(tmp, "goodput.toml"),
                "--listen", f"127.0.0.1:{r.proxy}", "--admin", f"127.0.0.1:{r.admin}",
                "--upstream", f"http://127.0.0.1:{r.sim}"]))
        for r, serve in zip(replicas, serves):
            wait_port(r.proxy, serve)
            wait_port(r.admin, serve)
        # Warm-up: every series born (met and missed on each replica) before Prometheus
        # starts, so that each series' first sample holds all of the warm-up and `rate()`
        # over the run counts exactly the measured requests.
        warm = [[] for _ in replicas]
        for _ in range(40):
            if all({x["slo_met"] for x in w} >= {True, False} for w in warm):
                break
            drive(replicas, 4)
            warm = records(replicas, len(warm[0]) + 4)
        else:
            raise SystemExit("warm-up: a replica never both met and missed its SLO")

        targets = ", ".join(f'"127.0.0.1:{r.admin}"' for r in replicas)
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write(f"""global:
  scrape_interval: {int(INTERVAL * 1000)}ms
  scrape_timeout: {int(INTERVAL * 1000)}ms
  evaluation_interval: {int(INTERVAL * 1000)}ms
rule_files:
  - {os.path.abspath(RULES)}
scrape_configs:
  - job_name: goodput
    static_configs:
      - targets: [{targets}]
""")
        for p, flags in ((native, ["--enable-feature=native-histograms"]), (classic, [])):
            start(f"prometheus-{p.name}", [
                args.prometheus, f"--config.file={tmp}/prometheus.yml",
                f"--storage.tsdb.path={tmp}/data-{p.name}",
                f"--web.listen-address={p.url.removeprefix('http://')}"] + flags)
        for p in (native, classic):
            poll(f"{p.name} Prometheus ready", p.ready)
        for p in (native, classic):
            # histogram_count reads native histograms only: the native Prometheus must hold them.
            poll(f"the {p.name} Prometheus holding the warm-up in its {p.name} histograms",
                 lambda: scraped(p, replicas, [len(w) for w in warm], p is native))

        drive(replicas, args.per)
        final = records(replicas, len(warm[0]) + args.per)
        for p in (native, classic):
            poll(f"the {p.name} Prometheus holding the run",
                 lambda: scraped(p, replicas, [len(f) for f in final], p is native))
        # The cumulative series are read while they stand (stopped targets' series go stale).
        share_lines, failures = shares(native, classic, [x for f in final for x in f])
        # All at once: a replica's series end with its last scrape, and `rate()` weighs each
        # replica by its series' span, so the spans must end together.
        for s in serves:
            s.terminate()
        for s in serves:
            s.wait(timeout=20)
        after = time.time() + 2 * INTERVAL
    except BaseException:
        stop(procs)
        for log in logs:
            with open(log) as f:
                tail = f.read()[-2000:]
            print(f"--- {os.path.basename(log)}\n{tail}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    try:
        failures += compare(native, classic, warm, final, after)
        print("\n".join(share_lines))
        memory(final)
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("\nfleet check: all comparisons within bounds")


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def compare(native, classic, warm, final, after):
    failures = []
    warm_ids = {x["id"] for w in warm for x in w}
    every = [x for f in final for x in f]
    measured = [x for x in every if x["id"] not in warm_ids]
    judged = [x for x in measured if x["slo_met"] is not None]
    met = sum(1 for x in judged if x["slo_met"])
    want = met / len(judged)
    print(f"measured requests {len(measured)} (warm-up {len(warm_ids)}), judged {len(judged)}, "
          f"met {met}, missed {len(judged) - met}")

    print(f"attainment: records {want:.4f}", end="")
    for p in (native, classic):
        got = rule(p, ATTAINMENT_RULE, after, job="goodput")
        err = got / want - 1 if got is not None else math.inf
        print(f"  {p.name} rule {got or math.nan:.4f} ({err * 100:+.2f} %)", end="")
        if abs(err) > ATTAINMENT_TOLERANCE:
            failures.append(f"attainment from {ATTAINMENT_RULE} ({p.name}): {got} against {want:.4f}")
    print()

    for key, name in (("ttft_ms", TTFT), ("tpot_ms", TPOT)):
        values = [x[key] / 1000 for x in measured if x.get(key) is not None]
        print(f"{name} ({len(values)} values), the rule class_model_quantile:...:"
              "histogram_quantile_rate5m against the records:")
        for q in QUANTILES:
            want_q = exact(values, q)
            got = {p.name: rule(p, f"class_model_quantile:{name}:histogram_quantile_rate5m",
                                after, job="goodput", quantile=q) for p in (native, classic)}
            errs = {k: (v / want_q - 1 if v is not None else math.inf) for k, v in got.items()}
            print(f"  P{round(q * 100):<2} records {want_q * 1000:8.3f} ms  "
                  + "  ".join(f"{k} {(got[k] or math.nan) * 1000:8.3f} ms ({errs[k] * 100:+6.2f} %)"
                              for k in got))
            if abs(errs["native"]) > QUANTILE_TOLERANCE:
                failures.append(f"{name} P{round(q * 100)}: native {got['native']} against {want_q}")

    return failures


def memory(final):
    """The native buckets each replica's TTFT and TPOT series hold: one per distinct
    schema-6 bucket index among its values (16 bytes each in prometheus-client: an i32
    index and a u64 count, aligned)."""
    for key, name in (("ttft_ms", TTFT), ("tpot_ms", TPOT)):
        held = []
        for f in final:
            values = [x[key] / 1000 for x in f if x.get(key)]
            held.append(len({math.ceil(math.log2(v) * 64) for v in values}))
        print(f"{name} native buckets per replica: "
              + ", ".join(f"{n} ({n * 16} bytes)" for n in held))


def shares(native, classic, every):
    """The classic buckets' share at or under each class threshold against the records':
    every request ever served (warm-up too) against the cumulative buckets, exactly."""
    lines, failures = [], []
    for key, name, threshold in (("ttft_ms", TTFT, TTFT_MS), ("tpot_ms", TPOT, TPOT_MS)):
        values = [x[key] / 1000 for x in every if x.get(key) is not None]
        le = threshold / 1000
        under = sum(1 for v in values if v <= le)
        bucket = classic.one(f'sum({name}_bucket{{le="{le}"}})')
        count = classic.one(f"sum({name}_count)")
        frac = native.one(f"histogram_fraction(0, {le}, sum({name}))")
        lines.append(f"{name} share <= {threshold} ms: records {under}/{len(values)} = "
              f"{under / len(values):.4f}  classic bucket le={le} {bucket}/{count}  "
              f"native histogram_fraction {frac if frac is None else round(frac, 4)}")
        if bucket != under or count != len(values):
            failures.append(f"{name}: classic bucket le={le} holds {bucket} of {count}, "
                            f"the records {under} of {len(values)}")
    return lines, failures


if __name__ == "__main__":
    main()
