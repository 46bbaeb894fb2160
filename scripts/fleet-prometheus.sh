#!/usr/bin/env bash
# A fleet against a real Prometheus: three `goodput sim` with different latencies, three
# `goodput serve` replicas in front of them, and Prometheus (Debian's `prometheus`
# package; native histograms on) scraping the replicas every second with the shipped
# rules, and a second Prometheus without native histograms (text scrapes: the classic
# buckets only) beside it. Drives requests through the replicas, then prints the fleet's numbers from the
# rules beside the exact ones from the union of the replicas' records: attainment, the
# TTFT and TPOT quantiles from the native histograms and from the classic buckets, and the
# classic-bucket share under the class threshold (docs/FLEET.md "Measured").
# Usage: scripts/fleet-prometheus.sh [requests per replica, default 160]
# Env: GOODPUT (binary, default target/debug/goodput), PROMETHEUS (default prometheus),
#      PORT_BASE (default 19100: uses PORT_BASE..PORT_BASE+10).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${GOODPUT:-$here/target/debug/goodput}"
prom="${PROMETHEUS:-prometheus}"
per="${1:-160}"
base="${PORT_BASE:-19100}"
command -v "$prom" >/dev/null || { echo "prometheus not found (apt-get install prometheus)" >&2; exit 1; }
[ -x "$bin" ] || { echo "goodput not found at $bin (cargo build)" >&2; exit 1; }

tmp="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

# One class with a TTFT threshold between the replicas' medians; TPOT bounded too.
cat >"$tmp/goodput.toml" <<TOML
[log]
access_log = false
[measure]
recent_requests = 100000
[slo.default]
ttft_ms = 180
tpot_ms = 22
attainment = 0.9
TOML

ttfts=("lognormal:80,0.4" "lognormal:150,0.5" "lognormal:260,0.4")
targets=""
for i in 0 1 2; do
  "$bin" sim --listen "127.0.0.1:$((base + i))" --ttft "${ttfts[$i]}" --itl "normal:12,4" \
    --seed "$((i + 1))" >"$tmp/sim$i.log" 2>&1 &
  pids+=($!)
  "$bin" serve -c "$tmp/goodput.toml" --listen "127.0.0.1:$((base + 3 + i))" \
    --upstream "http://127.0.0.1:$((base + i))" --admin "127.0.0.1:$((base + 6 + i))" \
    >"$tmp/serve$i.log" 2>&1 &
  pids+=($!)
  targets="$targets\"127.0.0.1:$((base + 6 + i))\","
done

cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $here/deploy/prometheus/goodput-rules.yml
scrape_configs:
  - job_name: goodput
    static_configs:
      - targets: [${targets%,}]
YML
"$prom" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$((base + 9))" --enable-feature=native-histograms \
  >"$tmp/prometheus.log" 2>&1 &
pids+=($!)
"$prom" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data-classic" \
  --web.listen-address="127.0.0.1:$((base + 10))" >"$tmp/prometheus-classic.log" 2>&1 &
pids+=($!)

python3 - "$base" "$per" <<'PY'
import json, math, sys, time, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor

base, per = int(sys.argv[1]), int(sys.argv[2])
prom = f"http://127.0.0.1:{base + 9}"
classic = f"http://127.0.0.1:{base + 10}"

def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)

def wait_up(url, what):
    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"{what} did not come up")

for i in range(3):
    wait_up(f"http://127.0.0.1:{base + 6 + i}/readyz", f"replica {i}")
wait_up(f"{prom}/-/ready", "prometheus")
wait_up(f"{classic}/-/ready", "prometheus (classic)")

body = json.dumps({"model": "m", "stream": True, "max_tokens": 16,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
def send(i):
    req = urllib.request.Request(f"http://127.0.0.1:{base + 3 + i % 3}/v1/chat/completions",
                                 data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
with ThreadPoolExecutor(24) as pool:
    list(pool.map(send, range(3 * per)))
# Let every replica be scraped and every rule evaluated after the last request.
time.sleep(6)

records = []
for i in range(3):
    records += get(f"http://127.0.0.1:{base + 6 + i}/api/v1/requests?limit=100000")["requests"]
judged = [r for r in records if r["slo_met"] is not None]
met = sum(1 for r in judged if r["slo_met"])

def q(query, server=prom):
    at = time.time()
    res = get(f"{server}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": at}))
    return [(s["metric"], float(s["value"][1])) for s in res["data"]["result"]]

def one(query, server=prom):
    r = q(query, server)
    return r[0][1] if r else float("nan")

def exact(values, p):
    # The value at rank ceil(p * N), the rank histogram_quantile aims at.
    v = sorted(values)
    return v[max(0, math.ceil(p * len(v)) - 1)]

# The series are read as they stand (cumulative since each replica started), not through
# increase() or rate(): a series is born with its first request, so its first scrape
# already counts some, and increase() over a run this short would leave them out. The
# rules (rate5m) read the same histograms; printed last.
print(f"requests {len(records)}, judged {len(judged)}, met {met}, missed {len(judged) - met}")
att = one("sum(goodput_requests_total{slo='met'}) / sum(goodput_requests_total{slo=~'met|missed'})")
print(f"attainment: prometheus {att:.4f}  records {met / len(judged):.4f}")
for key, name in [("ttft_ms", "gen_ai_server_time_to_first_token_seconds"),
                  ("tpot_ms", "gen_ai_server_time_per_output_token_seconds")]:
    vals = [r[key] / 1000 for r in records if r.get(key) is not None]
    print(f"{key}: {len(vals)} values")
    for p in (0.5, 0.95, 0.99):
        e = exact(vals, p)
        nat = one(f"histogram_quantile({p}, sum({name}))")
        kept = one(f"count(sum by (le) ({name}_bucket))")
        cla = one(f"histogram_quantile({p}, sum by (le) ({name}_bucket))", classic)
        print(f"  P{round(p * 100)}: records {e * 1000:8.2f} ms  native {nat * 1000:8.2f} ms ({(nat / e - 1) * 100:+.2f} %)"
              f"  classic {cla * 1000:8.2f} ms ({(cla / e - 1) * 100:+.2f} %)")
    print(f"  classic buckets kept by the native-histogram Prometheus: {'none' if kept != kept else int(kept)}")
ttft = [r["ttft_ms"] / 1000 for r in records if r.get("ttft_ms") is not None]
share = sum(1 for v in ttft if v <= 0.18) / len(ttft)
frac = one("histogram_fraction(0, 0.18, sum(gen_ai_server_time_to_first_token_seconds))")
cfrac = one("sum(gen_ai_server_time_to_first_token_seconds_bucket{le='0.18'}) / sum(gen_ai_server_time_to_first_token_seconds_count)", classic)
print(f"TTFT share <= 180 ms: records {share:.4f}  native histogram_fraction {frac:.4f}  classic bucket le=0.18 {cfrac:.4f}")
rules = q("class_model_quantile:gen_ai_server_time_to_first_token_seconds:histogram_quantile_rate5m")
for labels, v in sorted(rules, key=lambda s: s[0].get("quantile", "")):
    print(f"rule class_model_quantile TTFT q={labels.get('quantile')}: {v * 1000:.2f} ms")
PY
