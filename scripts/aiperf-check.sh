#!/usr/bin/env bash
# The AIPerf acceptance check for profile exports (docs/PROFILE.md, "Acceptance"):
#
#   1. installs AIPerf and the `tokenizers` package into a venv under target/ (once;
#      several minutes and ~1 GB the first time),
#   2. trains a tiny HuggingFace tokenizer locally (AIPerf's default tokenizer would be
#      downloaded at run time, which fails offline),
#   3. starts `goodput sim` and `goodput serve` with `[profile] dir`, sends chat traffic
#      with shared prompt prefixes through the proxy, stops the proxy (files are fsynced
#      and closed),
#   4. exports the profile as Mooncake JSONL and checks the format rules,
#   5. runs `aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule` with the
#      exported file, unchanged, against the simulator, and checks that every request of
#      the trace was sent and answered.
#
# Usage: scripts/aiperf-check.sh        (exit 0 = accepted; work files in target/aiperf-check)
# Not part of `cargo test`: it is slow and needs PyPI.
#
# The tokenizer is handed to AIPerf as a hub id (`goodput/tiny-tokenizer`) served from a
# private HuggingFace cache under target/, not as a directory: AIPerf 0.13's prompt
# decoding workers force HF_HUB_OFFLINE=1 and then resolve `--tokenizer DIR` as a hub id
# (HFValidationError, BrokenProcessPool), while a cached hub id loads the same way in
# the main process and in the workers, with no network.
set -euo pipefail
unset HF_HUB_OFFLINE TRANSFORMERS_OFFLINE

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/target/aiperf-venv"
WORK="$ROOT/target/aiperf-check"
REQUESTS="${REQUESTS:-60}"
rm -rf "$WORK"
mkdir -p "$WORK/profiles"

say() { printf '\n== %s\n' "$*"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

say "python venv with aiperf + tokenizers ($VENV)"
if [ ! -x "$VENV/bin/aiperf" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet aiperf tokenizers
fi
PY="$VENV/bin/python"
"$VENV/bin/pip" show aiperf | grep -E '^(Name|Version)'

say "training a tiny tokenizer ($WORK/tokenizer)"
"$PY" - "$WORK/tokenizer" <<'EOF'
import json, os, random, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
random.seed(7)
words = ("the of and to in is you that it he was for on are as with his they at be this "
         "have from or one had by word but not what all were we when your can said there "
         "use an each which she do how their if will up other about out many then them "
         "these so some her would make like him into time has look two more write go see "
         "number no way could people my than first water been call who oil its now find "
         "long down day did get come made may part assistant question answer why because").split()
corpus = [" ".join(random.choice(words) for _ in range(40)) + "." for _ in range(3000)]
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["[UNK]", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
tok.save(os.path.join(out, "tokenizer.json"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000,
           "bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]"},
          open(os.path.join(out, "tokenizer_config.json"), "w"))
print("vocab", tok.get_vocab_size())
EOF
# The same files as a HuggingFace cache entry (see the header comment).
export HF_HOME="$WORK/hf"
REV=0123456789abcdef0123456789abcdef01234567
CACHED="$HF_HOME/hub/models--goodput--tiny-tokenizer"
mkdir -p "$CACHED/refs" "$CACHED/snapshots/$REV"
printf '%s' "$REV" >"$CACHED/refs/main"
cp "$WORK/tokenizer/"* "$CACHED/snapshots/$REV/"
TOKENIZER=goodput/tiny-tokenizer

say "building goodput"
cargo build --quiet --manifest-path "$ROOT/Cargo.toml"
GOODPUT="$ROOT/target/debug/goodput"

# Three distinct free ports: all bound before any is released, so none is handed out twice.
read -r SIM_PORT PROXY_PORT ADMIN_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
wait_port() { for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

say "starting the simulator on :$SIM_PORT and the proxy on :$PROXY_PORT"
"$GOODPUT" sim --listen "127.0.0.1:$SIM_PORT" --ttft lognormal:40,0.3 --itl normal:4,1 \
  --output-tokens lognormal:60,0.5 >"$WORK/sim.log" 2>&1 &
pids+=($!); SIM_PID=$!
cat >"$WORK/goodput.toml" <<EOF
[server]
listen = "127.0.0.1:$PROXY_PORT"
[admin]
listen = "127.0.0.1:$ADMIN_PORT"
[upstream]
url = "http://127.0.0.1:$SIM_PORT"
[profile]
dir = "$WORK/profiles"
instance = "aiperf_check"
[profile.contract]
engine = "goodput sim"
notes = "scripts/aiperf-check.sh"
EOF
"$GOODPUT" serve --config "$WORK/goodput.toml" >"$WORK/serve.log" 2>&1 &
pids+=($!); SERVE_PID=$!
wait_port "$SIM_PORT"; wait_port "$PROXY_PORT"

say "sending $REQUESTS chat requests with shared prefixes through the proxy"
"$PY" - "$PROXY_PORT" "$REQUESTS" <<'EOF'
import json, sys, threading, time, urllib.request
port, n = int(sys.argv[1]), int(sys.argv[2])
def one(i):
    system = ("You are assistant %d. " % (i % 3)) * (40 + 150 * (i % 3))
    body = {"model": "sim-model", "max_tokens": 256, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "question %d: %s" % (i, "why? " * (i % 7 * 30))}]}
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                 data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
threads = []
for i in range(n):
    t = threading.Thread(target=one, args=(i,)); t.start(); threads.append(t)
    time.sleep(0.02 + (i * 37 % 90) / 1000)
for t in threads:
    t.join()
print("sent", n)
EOF

say "stopping the proxy (profile files are fsynced and closed)"
kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || true
shopt -s nullglob
files=("$WORK"/profiles/*.jsonl)
if [ "${#files[@]}" -eq 0 ]; then
  echo "FAIL: goodput serve wrote no profile (see $WORK/serve.log)" >&2
  exit 1
fi
"$GOODPUT" profile summarize "${files[@]}"

say "exporting Mooncake JSONL"
TRACE="$WORK/trace.jsonl"
"$GOODPUT" profile export --format mooncake --model sim-model --url "http://127.0.0.1:$SIM_PORT" \
  --tokenizer "$TOKENIZER" -o "$TRACE" "${files[@]}"
"$PY" - "$TRACE" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows, "empty trace"
last = 0
for r in rows:
    assert set(r) == {"timestamp", "input_length", "output_length", "hash_ids"}, r
    assert isinstance(r["timestamp"], int) and r["timestamp"] >= last, r
    last = r["timestamp"]
    assert len(r["hash_ids"]) == math.ceil(r["input_length"] / 512), r
    assert all(isinstance(i, int) and i >= 0 for i in r["hash_ids"]), r
print("format rules hold for", len(rows), "rows")
EOF
EXPECTED=$(wc -l <"$TRACE")

say "aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule against the simulator"
set +e
# The command `goodput profile export` printed above, plus where to put the artifacts.
HF_HUB_OFFLINE=1 timeout 900 "$VENV/bin/aiperf" profile --model sim-model \
  --url "http://127.0.0.1:$SIM_PORT" --endpoint-type chat --streaming --input-file "$TRACE" \
  --custom-dataset-type mooncake_trace --fixed-schedule --tokenizer "$TOKENIZER" \
  --artifact-dir "$WORK/aiperf" --ui-type simple >"$WORK/aiperf.log" 2>&1
rc=$?
set -e
tail -40 "$WORK/aiperf.log"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: aiperf exited $rc (log: $WORK/aiperf.log)"
  exit 1
fi
"$PY" - "$WORK/aiperf" "$EXPECTED" <<'EOF'
import glob, json, sys
paths = glob.glob(sys.argv[1] + "/**/profile_export_aiperf.json", recursive=True)
assert paths, "no profile_export_aiperf.json under " + sys.argv[1]
data = json.load(open(paths[0]))
def metric(name):
    m = data.get(name) or data.get("records", {}).get(name) or {}
    return m.get("avg") if isinstance(m, dict) else m
count = metric("request_count")
errors = data.get("error_summary") or []
print("aiperf request_count:", count, "expected:", sys.argv[2], "errors:", errors)
assert count is not None and int(count) == int(sys.argv[2]), "AIPerf did not send every trace request"
assert not errors, "AIPerf reported errors"
EOF
echo "PASS: AIPerf accepted the exported Mooncake trace unchanged and replayed all $EXPECTED requests"
