#!/usr/bin/env bash
# Builds every fuzz target, seeds each corpus from the decoder fixtures
# (src/decode/fixtures) and runs each target for a bounded time, two at a time; exits
# non-zero if any target finds a crash (its input is kept under fuzz/artifacts/<target>/).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 20 s, every target)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); works on the pinned stable
# toolchain because no sanitizer is asked for (`-s none`: the code is `forbid(unsafe_code)`,
# so a panic is what there is to find). FUZZ_JOBS sets how many targets run at once.
set -euo pipefail
cd "$(dirname "$0")"

secs="${1:-20}"
shift || true
jobs="${FUZZ_JOBS:-2}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi

# cargo fuzz has no --locked; this fails instead if fuzz/Cargo.lock is out of date.
cargo fetch --locked --target x86_64-unknown-linux-gnu
# Its own target directory (FUZZ_TARGET_DIR), whatever CARGO_TARGET_DIR the main build
# uses: the instrumented artifacts share nothing with it. 16 codegen units rather than
# cargo-fuzz's 1 for a shorter build.
target_dir="${FUZZ_TARGET_DIR:-$PWD/target}"
cargo fuzz build -s none --codegen-units 16 --target-dir "$target_dir" >&2
bin_dir="$target_dir/x86_64-unknown-linux-gnu/release"

fixtures=../src/decode/fixtures
# The fixtures each target starts from.
fixtures_for() {
  case "$1" in
    sse | usage_filter | openai_scan) echo "$fixtures"/*.sse ;;
    ndjson) echo "$fixtures"/*.ndjson ;;
    openai) echo "$fixtures"/openai_chat_* ;;
    responses) echo "$fixtures"/openai_responses_* ;;
    anthropic) echo "$fixtures"/anthropic_* ;;
    tgi) echo "$fixtures"/tgi_* ;;
    llamacpp) echo "$fixtures"/llamacpp_* ;;
    ollama) echo "$fixtures"/ollama_* ;;
  esac
}

# Request bodies for the request-side targets (there are no request fixtures).
request_seeds=(
  '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
  '{"model":"m","stream":true,"stream_options":{"include_usage":false},"prompt":"hi"}'
  '{"model":"m","stream":true,"stream_options":{},"messages":[],"tools":[{"type":"function"}]}'
  '{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}'
  '{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}'
  '{"model":"m","system":[{"type":"text","text":"s"}],"messages":[],"max_tokens":1}'
  '{"inputs":"hi","parameters":{"max_new_tokens":4,"details":true}}'
  '{"prompt":[1,2,3],"n_predict":-1,"stream":true}'
  '{"model":"m","system":"s","prompt":"p","options":{"num_predict":4}}'
)

# Exchanges for `http_exchange` and `h1_server`: client bytes, the separator, upstream bytes
# (fuzz/src/http1.rs). printf %b expands the escapes.
sep='\n--upstream--\n'
chat='{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
post="POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
post_cl="${post}content-length: ${#chat}\r\n\r\n$chat"
ok="HTTP/1.1 200 OK\r\n"
sse="${ok}content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
sse+='16\r\ndata: {"choices":[]}\n\n\r\n'
sse+='e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n'
json='{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}'
exchange_seeds=(
  "$post_cl$sep$sse"
  "$post_cl$sep${ok}content-type: application/json\r\ncontent-length: ${#json}\r\n\r\n$json"
  "$post_cl$sep${ok}content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n2\r\n:1\r\n1\r\n}\r\n0\r\n\r\n"
  "$post_cl$sep${ok}transfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n"
  "$post_cl$sep${ok}content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
  "${post}content-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n$sep${ok}content-length: 2\r\n\r\nok"
  "${post}transfer-encoding: chunked\r\n\r\n$(printf %x ${#chat})\r\n$chat\r\n0\r\n\r\n$sep$sse"
  "$post_cl$sep${ok}content-type: text/event-stream\r\n\r\ndata: {}\n\ndata: [DONE]\n\n"
  "$post_cl$sep${ok}content-length: 100\r\n\r\ncut short"
  "GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\nHEAD /v1/models HTTP/1.1\r\nhost: t\r\n\r\n$sep${ok}content-length: 2\r\n\r\n{}"
  "${post}expect: 100-continue\r\ncontent-length: ${#chat}\r\n\r\n$chat$sep$sse"
  "GET /ws HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nping${sep}HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\npong"
  "$post_cl$sep"
  "$post_cl${sep}HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
)

# Response bodies for `framing`, after its header byte (fuzz/fuzz_targets/framing.rs):
# 0x00 chunked and whole, 0x03 and three knob bytes in small reads, 0xc0 a length, 0xe0
# the close.
framing_seeds=(
  '\x0016\r\ndata: {"choices":[]}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n'
  '\x03\x01\x05\x02A;name=v\r\n0123456789\r\n1 \t\r\nz\r\n0\r\nx-usage: 3\r\n\r\n'
  '\x005\r\nhelloX\r\n'
  '\x005\r\nhel'
  '\xc0{"choices":[{"message":{"content":"hi"}}]}'
  '\xe0data: {}\n\ndata: [DONE]\n\n'
)

# Seeds: request-side targets take the body as is, openai_scan the fixture as is (it
# checks every line); the others read a header byte first
# (fuzz/src/lib.rs): 0x00 feeds the fixture whole, 0x11 0x07 in 7-byte chunks with the
# small size cap.
seed() {
  local target=$1 dir=corpus/$1 f i
  mkdir -p "$dir"
  case "$target" in
    request | usage_inject)
      for i in "${!request_seeds[@]}"; do
        printf '%s' "${request_seeds[$i]}" >"$dir/seed-$i"
      done
      ;;
    http_exchange | h1_server)
      for i in "${!exchange_seeds[@]}"; do
        printf '%b' "${exchange_seeds[$i]}" >"$dir/seed-$i"
      done
      # Inputs that once showed a fault (artifacts-found/README.md) are run first; the
      # own server gets hyper's too.
      for f in artifacts-found/http_exchange-* artifacts-found/h1_server-*; do
        [ -e "$f" ] || continue
        cp "$f" "$dir/found-$(basename "$f")"
      done
      # A real stream, unframed (it runs to the close).
      { printf '%b' "$post_cl$sep${ok}content-type: text/event-stream\r\n\r\n"
        cat "$fixtures/openai_chat_stream.sse"; } >"$dir/seed-openai-stream"
      ;;
    framing)
      for i in "${!framing_seeds[@]}"; do
        printf '%b' "${framing_seeds[$i]}" >"$dir/seed-$i"
      done
      ;;
    openai_scan)
      for f in $(fixtures_for "$target"); do
        cp "$f" "$dir/seed-$(basename "$f")"
      done
      ;;
    *)
      for f in $(fixtures_for "$target"); do
        { printf '\x00'; cat "$f"; } >"$dir/seed-whole-$(basename "$f")"
        { printf '\x11\x07'; cat "$f"; } >"$dir/seed-chunked-$(basename "$f")"
      done
      ;;
  esac
}

run_one() {
  local target=$1 log=logs/$1.log
  mkdir -p "artifacts/$target"
  if "$bin_dir/$target" "corpus/$target" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="artifacts/$target/" \
    >"$log" 2>&1; then
    echo "fuzz $target: ok, $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" \
      | grep -o '[0-9]*$') runs in ${secs}s"
  else
    echo "fuzz $target: FAILED (log fuzz/$log; input under fuzz/artifacts/$target/)" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

mkdir -p logs
for t in "${targets[@]}"; do
  seed "$t"
done
export -f run_one
export bin_dir secs
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}
