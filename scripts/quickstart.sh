#!/usr/bin/env bash
# Builds Bridgehead, makes a fresh PKI, starts a demo target, a server and an agent on
# loopback, and prints a ready-to-paste `curl -p` command and the EgressSelectorConfiguration
# for this setup. Runs until Ctrl-C, then stops everything it started.
#
#   scripts/quickstart.sh            # state in ./demo
#   DEMO_DIR=/tmp/bh scripts/quickstart.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
demo="${DEMO_DIR:-$root/demo}"
cd "$root"

echo "==> building (release)" >&2
cargo build --release --quiet --bin bridgehead-server --bin bridgehead-agent --bin bridgehead-certs
bin="$root/target/release"

rm -rf "$demo"
mkdir -p "$demo/site" "$demo/pki"
"$bin/bridgehead-certs" init --dir "$demo/pki" >/dev/null
echo "<h1>Hello through Bridgehead</h1>" > "$demo/site/index.html"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# Wait for a process to print "... listening on ADDR" lines; prints the address for $2.
address_of() { # file what
  for _ in $(seq 1 200); do
    if line=$(grep -m1 "$2 listening on" "$1" 2>/dev/null); then
      echo "${line##* }"
      return 0
    fi
    sleep 0.05
  done
  echo "timed out waiting for '$2' in $1" >&2
  cat "${1%.out}.log" >&2 || true
  return 1
}

# The demo target: a static web page on an ephemeral loopback port.
python3 - "$demo/site" > "$demo/target.out" 2> "$demo/target.log" <<'PY' &
import http.server, functools, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(f"demo target listening on 127.0.0.1:{httpd.server_address[1]}", flush=True)
httpd.serve_forever()
PY
pids+=($!)
target=$(address_of "$demo/target.out" "demo target")

"$bin/bridgehead-server" \
  --server-bind-address 127.0.0.1 --server-port 0 \
  --agent-bind-address 127.0.0.1 --agent-port 0 \
  --health-bind-address 127.0.0.1 --health-port 0 \
  --admin-bind-address 127.0.0.1 --admin-port 0 \
  --server-cert "$demo/pki/server.crt" --server-key "$demo/pki/server.key" \
  --server-ca-cert "$demo/pki/frontend-ca.crt" \
  --cluster-cert "$demo/pki/cluster.crt" --cluster-key "$demo/pki/cluster.key" \
  --cluster-ca-cert "$demo/pki/cluster-ca.crt" \
  --proxy-strategies destHost,default \
  > "$demo/server.out" 2> "$demo/server.log" &
pids+=($!)
frontend=$(address_of "$demo/server.out" "frontend")
agent_port=$(address_of "$demo/server.out" "agent endpoint")
health=$(address_of "$demo/server.out" "health")
admin=$(address_of "$demo/server.out" "admin")

"$bin/bridgehead-agent" \
  --proxy-server-host 127.0.0.1 --proxy-server-port "${agent_port##*:}" \
  --ca-cert "$demo/pki/cluster-ca.crt" \
  --agent-cert "$demo/pki/agent.crt" --agent-key "$demo/pki/agent.key" \
  --agent-id demo-agent \
  --agent-identifiers "host=localhost&ipv4=127.0.0.1&default-route=true" \
  --health-server-port 0 --health-bind-address 127.0.0.1 --admin-server-port 0 \
  > "$demo/agent.out" 2> "$demo/agent.log" &
pids+=($!)
address_of "$demo/agent.out" "health" > /dev/null

# Ready once the agent's session is registered.
for _ in $(seq 1 200); do
  if curl -fsS "http://$health/readyz" > /dev/null 2>&1; then break; fi
  sleep 0.05
done
curl -fsS "http://$health/readyz" > /dev/null || { echo "server never became ready" >&2; cat "$demo/server.log" "$demo/agent.log" >&2; exit 1; }

cat <<MSG

Bridgehead is running (logs in $demo/*.log):
  frontend (mTLS CONNECT)  https://$frontend
  agent endpoint           wss://$agent_port/connect
  health / metrics         http://$health/readyz  http://$health/metrics
  admin (agents)           http://$admin/agents
  demo target              http://$target  (reached only through the tunnel)

Paste this into another terminal:

  curl -p -x https://$frontend \\
    --proxy-cacert $demo/pki/frontend-ca.crt \\
    --proxy-cert $demo/pki/client.crt --proxy-key $demo/pki/client.key \\
    http://$target/

kube-apiserver --egress-selector-config-file for this setup:

apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: "https://$frontend"
        tlsConfig:
          caBundle: $demo/pki/frontend-ca.crt
          clientCert: $demo/pki/client.crt
          clientKey: $demo/pki/client.key

Ctrl-C stops everything.
MSG

if [[ "${QUICKSTART_EXIT:-}" == 1 ]]; then
  # Used by the tests: run the printed curl once and stop.
  curl -fsS -p -x "https://$frontend" --proxy-cacert "$demo/pki/frontend-ca.crt" \
    --proxy-cert "$demo/pki/client.crt" --proxy-key "$demo/pki/client.key" "http://$target/"
  exit 0
fi
wait
