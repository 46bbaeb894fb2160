#!/usr/bin/env bash
# Validates the deployment kit offline; the project's CI runs it.
#   1. Kubernetes: base and overlays rendered (kustomize, or `kubectl kustomize`, or
#      kubernetes/render.py where neither exists; both when they do, and they must agree),
#      then every resource validated against the Kubernetes schemas (kubernetes-validate,
#      PyPI, --strict). The ServiceMonitor is a CRD without a schema there: checked here.
#   2. Every goodput.toml of the kit passes `goodput check-config`.
#   3. systemd/goodput.service passes `systemd-analyze verify` (Debian package systemd).
#   4. Prometheus rules and the dashboard (prometheus/check.sh).
# Usage: deploy/check.sh [path to the goodput binary]. The container image is not built
# here (no Docker daemon in CI): deploy/README.md says what that leaves unchecked.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$here/../target/debug/goodput}"
fail() { echo "deploy/check.sh: $*" >&2; exit 1; }
[ -x "$bin" ] || fail "goodput binary not found at $bin (cargo build first, or pass its path)"

python3 -c 'import yaml, kubernetes_validate' 2>/dev/null ||
  python3 -m pip install -q pyyaml kubernetes-validate >/dev/null 2>&1 ||
  fail "cannot install pyyaml and kubernetes-validate (pip)"

kustomize=()
if command -v kustomize >/dev/null 2>&1; then kustomize=(kustomize build)
elif command -v kubectl >/dev/null 2>&1; then kustomize=(kubectl kustomize); fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
k8s="$here/kubernetes"
for dir in base overlays/standalone overlays/sidecar; do
  out="$tmp/${dir//\//-}.yaml"
  python3 "$k8s/render.py" "$k8s/$dir" >"$out" || fail "render.py failed on $dir"
  if [ ${#kustomize[@]} -gt 0 ]; then
    "${kustomize[@]}" "$k8s/$dir" >"$out.kustomize" || fail "${kustomize[*]} failed on $dir"
    python3 - "$out" "$out.kustomize" <<'PY' || fail "render.py and ${kustomize[*]} disagree on $dir"
import sys, yaml
key = lambda d: (d["kind"], d["metadata"]["name"])
a, b = (sorted(yaml.safe_load_all(open(p)), key=key) for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)
PY
    out="$out.kustomize"
  fi
  log="$(kubernetes-validate --strict --quiet "$out" 2>&1)" || { echo "$log" >&2; fail "invalid resources in $dir"; }
  # The ServiceMonitor: selects the Service's labels and scrapes its admin port.
  python3 - "$out" <<'PY' || fail "ServiceMonitor check failed in $dir"
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
sm = [d for d in docs if d["kind"] == "ServiceMonitor"]
svc = [d for d in docs if d["kind"] == "Service"]
assert len(sm) == 1 and sm[0]["apiVersion"] == "monitoring.coreos.com/v1", "one ServiceMonitor"
spec = sm[0]["spec"]
sel = spec["selector"]["matchLabels"]
match = [s for s in svc if sel.items() <= s["metadata"].get("labels", {}).items()]
assert match, f"no Service carries {sel}"
ports = {p["name"] for s in match for p in s["spec"]["ports"]}
for e in spec["endpoints"]:
    assert e["port"] in ports, f"endpoint port {e['port']} not on the Service"
    assert e.get("path", "/metrics") == "/metrics"
labels = match[0]["metadata"]["labels"]
assert labels.get(spec["jobLabel"]) == "goodput", "job label must be goodput (alerts match it)"
PY
done

for cfg in "$k8s"/base/goodput.toml "$k8s"/overlays/*/goodput.toml; do
  "$bin" check-config "$cfg" >/dev/null 2>&1 || { "$bin" check-config "$cfg" || true; fail "$cfg"; }
done

if ! command -v systemd-analyze >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd; } >/dev/null 2>&1 ||
      fail "cannot install systemd (for systemd-analyze)"
  else
    fail "systemd-analyze not found: install Debian's systemd package"
  fi
fi
# verify checks that ExecStart is executable: point it at the built binary.
sed "s#/usr/local/bin/goodput#$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")#" \
  "$here/systemd/goodput.service" >"$tmp/goodput.service"
log="$(systemd-analyze verify "$tmp/goodput.service" 2>&1)" || { echo "$log" >&2; fail "systemd-analyze verify"; }
[ -z "$log" ] || { echo "$log" >&2; fail "systemd-analyze verify warned"; }

bash "$here/prometheus/check.sh"
