#!/usr/bin/env bash
# Validates goodput's Prometheus rules and Grafana dashboard; the project's CI runs it.
#   1. promtool check rules   goodput-rules.yml goodput-alerts.yml
#   2. promtool test rules    tests/*.yml
#   3. the dashboard: valid JSON, importable shape, every PromQL expression parses and
#      references only goodput metrics or recorded series (deploy/grafana/check_dashboard.py)
# Installs promtool from Debian's `prometheus` package when it is missing (needs root or
# passwordless sudo). Prints nothing on success; on failure prints what failed and exits 1.
# Tests are written for promtool 2.42 (Debian bookworm); set PROMTOOL to use another binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deploy="$(dirname "$here")"

fail() {
  echo "deploy/prometheus/check.sh: $*" >&2
  exit 1
}

install_promtool() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      fail "promtool not found and not root: install Debian's 'prometheus' package (or set PROMTOOL)"
    fi
  fi
  command -v apt-get >/dev/null 2>&1 ||
    fail "promtool not found and no apt-get: install promtool 2.x (or set PROMTOOL)"
  local log
  log="$(mktemp)"
  if ! { "${sudo[@]}" apt-get update -qq &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends prometheus; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    fail "could not install promtool (apt-get install prometheus)"
  fi
  rm -f "$log"
}

promtool="${PROMTOOL:-}"
if [ -z "$promtool" ]; then
  command -v promtool >/dev/null 2>&1 || install_promtool
  promtool="$(command -v promtool)" || fail "promtool still not found after installing 'prometheus'"
fi

# Runs a command; shows its output only when it fails.
run() {
  local out
  if ! out="$("$@" 2>&1)"; then
    printf '%s\n' "$out" >&2
    fail "failed: $* (promtool: $("$promtool" --version 2>&1 | head -n 1))"
  fi
}

run "$promtool" check rules "$here/goodput-rules.yml" "$here/goodput-alerts.yml"
# promtool resolves rule_files relative to each test file.
run "$promtool" test rules "$here"/tests/*.yml

command -v python3 >/dev/null 2>&1 || fail "python3 is needed to check the Grafana dashboard"
run python3 "$deploy/grafana/check_dashboard.py" \
  "$deploy/grafana/goodput-dashboard.json" "$here/goodput-rules.yml" --promtool "$promtool"
