#!/usr/bin/env python3
"""Writes Bridgehead's monitoring from one description: the Prometheus rule file, the same
groups as a PrometheusRule, and the Grafana dashboard (as JSON and as a ConfigMap for Grafana's
sidecar); and the rule groups and dashboard charts/bridgehead reads.

    deploy/monitoring/generate.py            # rewrite the generated files
    deploy/monitoring/generate.py --check    # exit 1 if a generated file is stale
    deploy/monitoring/generate.py --queries  # every dashboard query and alert signal, one a line

Each alert is a *signal* (a query whose value means something on its own: a ratio, a count,
seconds left) and a *condition* on it (`> 0.05`); the alert's expression is the two together.
The e2e test evaluates every signal and dashboard query against a Prometheus that scraped a
running server and agents, and each must return data: a signal over a series that does not
exist would never fire. Standard library only.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The workspace's repository (Cargo.toml); a fork points it at its own copy of the runbooks.
RUNBOOK = "https://example.invalid/bridgehead/blob/main/docs/operations.md#"

# The PodMonitors set these job labels; the rules select on them.
SERVER = 'job="bridgehead-server"'
AGENT = 'job="bridgehead-agent"'

RECORDING = [
    ("bridgehead:connects:rate5m",
     "sum by (result) (rate(bridgehead_server_dials_total[5m]))"),
    ("bridgehead:connect_errors:ratio_rate5m",
     'sum(rate(bridgehead_server_dials_total{result=~"refused|unreachable|name_not_resolved|not_permitted|timed_out|agent_lost|other"}[5m]))'
     " / clamp_min(sum(rate(bridgehead_server_dials_total[5m])), 1e-9)"),
    ("bridgehead:dial_duration_seconds:p99_5m",
     "histogram_quantile(0.99, sum by (le) (rate(bridgehead_server_dial_duration_seconds_bucket[5m])))"),
]

# name, severity, for, signal, condition, summary, description
ALERTS = [
    ("BridgeheadServerDown", "critical", "5m",
     f"up{{{SERVER}}}", "== 0",
     "A Bridgehead server is not scraped",
     "{{ $labels.instance }} has not answered a scrape for 5 minutes: kube-apiserver beside it has no egress."),
    ("BridgeheadNoAgents", "critical", "5m",
     f"bridgehead_server_agents_connected{{{SERVER}}}", "== 0",
     "A Bridgehead server has no agent",
     "{{ $labels.instance }} holds no agent session: every CONNECT through it gets 503 (kubectl logs/exec, webhooks, aggregated APIs)."),
    # Connected agents per node, 0 for a node that runs pods and has none.
    ("BridgeheadNodeWithoutAgent", "warning", "10m",
     f"sum by (node) (bridgehead_agent_connected{{{AGENT}}})"
     ' or on (node) 0 * count by (node) (kube_pod_info{node!="",created_by_kind!="DaemonSet"})', "< 1",
     "A node with pods has no connected Bridgehead agent",
     "Node {{ $labels.node }} runs pods but no agent there is connected: tunnels to its kubelet and pods fail."),
    ("BridgeheadFewerAgentsThanNodes", "warning", "15m",
     f"count(kube_node_info) - min(bridgehead_server_agents_connected{{{SERVER}}})", "> 0",
     "Fewer agents than nodes",
     "A server holds fewer agent sessions than the cluster has nodes: some nodes' kubelets and pods are unreachable through it."),
    ("BridgeheadAgentNotOnEveryServer", "warning", "10m",
     f"max by (instance) (bridgehead_agent_known_servers{{{AGENT}}})"
     f' - sum by (instance) (bridgehead_agent_server_sessions{{{AGENT},state="active"}})', "> 0",
     "An agent is not connected to every server",
     "Agent {{ $labels.instance }} holds fewer sessions than there are servers: CONNECTs reaching the others get 503 for its node."),
    ("BridgeheadConnectErrors", "warning", "10m",
     "bridgehead:connect_errors:ratio_rate5m", "> 0.05",
     "Tunnel dials are failing",
     "More than 5 % of CONNECTs end in 502 or 504: the agents' dials are refused, unreachable or time out."),
    ("BridgeheadNoAgentForTarget", "warning", "10m",
     f'sum by (instance) (rate(bridgehead_server_dials_total{{{SERVER},result="no_agent"}}[5m]))', "> 0.1",
     "CONNECTs get 503: no agent for the target",
     "{{ $labels.instance }} answers 503 to CONNECTs whose target no connected agent matches."),
    ("BridgeheadOverloaded", "warning", "5m",
     f'sum by (instance) (rate(bridgehead_server_dials_total{{{SERVER},result="overloaded"}}[5m]))', "> 0",
     "CONNECTs get 503: overloaded",
     "{{ $labels.instance }} refuses CONNECTs as overloaded (pending dials or memory budget at their cap)."),
    ("BridgeheadDialLatencyHigh", "warning", "15m",
     "bridgehead:dial_duration_seconds:p99_5m", "> 1",
     "Tunnel dials are slow",
     "The 99th percentile from CONNECT to the agent's dial answer is above 1 s."),
    ("BridgeheadPendingDialsNearCap", "warning", "5m",
     f"max by (instance) (bridgehead_server_dials_pending{{{SERVER}}} / bridgehead_server_dials_pending_limit{{{SERVER}}})", "> 0.8",
     "Pending dials near --max-pending-dials",
     "{{ $labels.instance }} has more than 80 % of --max-pending-dials in use; past it CONNECTs get 503."),
    ("BridgeheadMemoryBudgetNearlySpent", "warning", "10m",
     f"max by (job, instance) (bridgehead_server_tunnel_buffered_bytes{{{SERVER}}} / bridgehead_server_tunnel_memory_budget_bytes{{{SERVER}}}"
     f" or bridgehead_agent_tunnel_buffered_bytes{{{AGENT}}} / bridgehead_agent_tunnel_memory_budget_bytes{{{AGENT}}})", "> 0.8",
     "Tunnel memory budget nearly spent",
     "{{ $labels.instance }} buffers more than 80 % of --tunnel-memory-budget; when it is spent, new tunnels get 503."),
    ("BridgeheadHandshakesCut", "warning", "10m",
     f"sum by (instance, listener) (rate(bridgehead_server_handshakes_refused_total{{{SERVER}}}[5m]))", "> 1",
     "Handshakes are being cut for room",
     "{{ $labels.instance }} cuts {{ $labels.listener }} handshakes for room: a flood of stalled connections, or limits too low for the fleet."),
    ("BridgeheadAgentAuthFailures", "warning", "10m",
     f'sum by (instance) (rate(bridgehead_server_agent_handshakes_total{{{SERVER},result=~"unauthorized|forbidden|tls_error"}}[5m]))', "> 0.05",
     "Agents fail to authenticate",
     "{{ $labels.instance }} refuses agent connections (401, 403 or TLS): expired tokens or certificates, a wrong CA, or identifiers not bound to the agent's node."),
    ("BridgeheadCertificateExpiresSoon", "warning", "1h",
     f"min by (job, instance, role) ((bridgehead_server_certificate_expiry_timestamp_seconds{{{SERVER}}}"
     f" or bridgehead_agent_certificate_expiry_timestamp_seconds{{{AGENT}}}) - time())", "< 14 * 86400",
     "A certificate expires within 14 days",
     "The {{ $labels.role }} certificate of {{ $labels.job }} {{ $labels.instance }} expires in less than 14 days."),
    ("BridgeheadCertificateExpiresVerySoon", "critical", "10m",
     f"min by (job, instance, role) ((bridgehead_server_certificate_expiry_timestamp_seconds{{{SERVER}}}"
     f" or bridgehead_agent_certificate_expiry_timestamp_seconds{{{AGENT}}}) - time())", "< 3 * 86400",
     "A certificate expires within 3 days",
     "The {{ $labels.role }} certificate of {{ $labels.job }} {{ $labels.instance }} expires in less than 3 days."),
    ("BridgeheadRestartLoop", "warning", "0m",
     'changes(process_start_time_seconds{job=~"bridgehead-(server|agent)"}[30m])', "> 3",
     "A Bridgehead process restarts in a loop",
     "{{ $labels.job }} {{ $labels.instance }} started more than 3 times in 30 minutes."),
]

# The rule tests (promtool test rules): a healthy fleet of one server and three agents on
# three nodes, and for each alert the change that makes it fire, when, and with what labels.
S1 = {"job": "bridgehead-server", "instance": "s1"}
HEALTHY = {
    'up{job="bridgehead-server",instance="s1"}': "1x180",
    'bridgehead_server_agents_connected{job="bridgehead-server",instance="s1"}': "3x180",
    'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="ok"}': "0+60x180",
    'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="refused"}': "0x180",
    'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="no_agent"}': "0x180",
    'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="overloaded"}': "0x180",
    'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="0.01"}': "0+60x180",
    'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="1"}': "0+60x180",
    'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="10"}': "0+60x180",
    'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="+Inf"}': "0+60x180",
    'bridgehead_server_dials_pending{job="bridgehead-server",instance="s1"}': "2x180",
    'bridgehead_server_dials_pending_limit{job="bridgehead-server",instance="s1"}': "1024x180",
    'bridgehead_server_tunnel_buffered_bytes{job="bridgehead-server",instance="s1"}': "65536x180",
    'bridgehead_server_tunnel_memory_budget_bytes{job="bridgehead-server",instance="s1"}': "268435456x180",
    'bridgehead_server_handshakes_refused_total{job="bridgehead-server",instance="s1",listener="agent"}': "0x180",
    'bridgehead_server_agent_handshakes_total{job="bridgehead-server",instance="s1",result="ok"}': "0+1x180",
    'bridgehead_server_agent_handshakes_total{job="bridgehead-server",instance="s1",result="forbidden"}': "0x180",
    'bridgehead_server_certificate_expiry_timestamp_seconds{job="bridgehead-server",instance="s1",role="frontend"}': "10000000000x180",
    'process_start_time_seconds{job="bridgehead-server",instance="s1"}': "100x180",
}
for n in (1, 2, 3):
    a = f'job="bridgehead-agent",instance="a{n}"'
    HEALTHY.update({
        f'kube_node_info{{node="n{n}"}}': "1x180",
        f'kube_pod_info{{node="n{n}",pod="web-{n}",created_by_kind="ReplicaSet"}}': "1x180",
        f'bridgehead_agent_connected{{{a},node="n{n}"}}': "1x180",
        f"bridgehead_agent_known_servers{{{a}}}": "1x180",
        f'bridgehead_agent_server_sessions{{{a},state="active"}}': "1x180",
        f"bridgehead_agent_tunnel_buffered_bytes{{{a}}}": "0x180",
        f"bridgehead_agent_tunnel_memory_budget_bytes{{{a}}}": "268435456x180",
        f'bridgehead_agent_certificate_expiry_timestamp_seconds{{{a},role="client"}}': "10000000000x180",
        f"process_start_time_seconds{{{a}}}": "100x180",
    })

# alert: (series changed from the healthy fleet, evaluation time, the firing alert's labels)
FIRING = {
    "BridgeheadServerDown": ({'up{job="bridgehead-server",instance="s1"}': "0x180"}, "10m", S1),
    "BridgeheadNoAgents": ({'bridgehead_server_agents_connected{job="bridgehead-server",instance="s1"}': "0x180"}, "10m", S1),
    "BridgeheadNodeWithoutAgent": ({'bridgehead_agent_connected{job="bridgehead-agent",instance="a3",node="n3"}': "0x180"}, "15m", {"node": "n3"}),
    "BridgeheadFewerAgentsThanNodes": ({'bridgehead_server_agents_connected{job="bridgehead-server",instance="s1"}': "2x180"}, "20m", {}),
    "BridgeheadAgentNotOnEveryServer": ({'bridgehead_agent_known_servers{job="bridgehead-agent",instance="a1"}': "2x180"}, "15m", {"instance": "a1"}),
    "BridgeheadConnectErrors": ({'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="refused"}': "0+10x180"}, "20m", {}),
    "BridgeheadNoAgentForTarget": ({'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="no_agent"}': "0+60x180"}, "20m", {"instance": "s1"}),
    "BridgeheadOverloaded": ({'bridgehead_server_dials_total{job="bridgehead-server",instance="s1",result="overloaded"}': "0+6x180"}, "15m", {"instance": "s1"}),
    "BridgeheadDialLatencyHigh": ({
        'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="0.01"}': "0x180",
        'bridgehead_server_dial_duration_seconds_bucket{job="bridgehead-server",instance="s1",le="1"}': "0x180",
    }, "25m", {}),
    "BridgeheadPendingDialsNearCap": ({'bridgehead_server_dials_pending{job="bridgehead-server",instance="s1"}': "900x180"}, "10m", {"instance": "s1"}),
    "BridgeheadMemoryBudgetNearlySpent": ({'bridgehead_server_tunnel_buffered_bytes{job="bridgehead-server",instance="s1"}': "250000000x180"}, "15m", S1),
    "BridgeheadHandshakesCut": ({'bridgehead_server_handshakes_refused_total{job="bridgehead-server",instance="s1",listener="agent"}': "0+120x180"}, "15m", {"instance": "s1", "listener": "agent"}),
    "BridgeheadAgentAuthFailures": ({'bridgehead_server_agent_handshakes_total{job="bridgehead-server",instance="s1",result="forbidden"}': "0+6x180"}, "15m", {"instance": "s1"}),
    "BridgeheadCertificateExpiresSoon": ({'bridgehead_server_certificate_expiry_timestamp_seconds{job="bridgehead-server",instance="s1",role="frontend"}': "864000x180"}, "70m", {**S1, "role": "frontend"}),
    "BridgeheadCertificateExpiresVerySoon": ({'bridgehead_agent_certificate_expiry_timestamp_seconds{job="bridgehead-agent",instance="a2",role="client"}': "172800x180"}, "20m", {"job": "bridgehead-agent", "instance": "a2", "role": "client"}),
    "BridgeheadRestartLoop": ({'process_start_time_seconds{job="bridgehead-agent",instance="a1"}': "100 200 300 400 500 600x175"}, "10m", {"job": "bridgehead-agent", "instance": "a1"}),
}

# title, unit, queries (expr, legend)
PANELS = [
    ("Agents connected vs nodes", "short", [
        (f"bridgehead_server_agents_connected{{{SERVER}}}", "sessions on {{instance}}"),
        ("count(kube_node_info)", "nodes"),
    ]),
    ("Sessions per server (agent side)", "short", [
        (f"sum by (state) (bridgehead_agent_server_sessions{{{AGENT}}})", "{{state}}"),
        (f"max(bridgehead_agent_known_servers{{{AGENT}}})", "servers known"),
    ]),
    ("Tunnels open", "short", [
        (f"sum by (instance) (bridgehead_server_tunnels_open{{{SERVER}}})", "{{instance}}"),
    ]),
    ("CONNECT results", "reqps", [
        ("bridgehead:connects:rate5m", "{{result}}"),
    ]),
    ("Dial latency", "s", [
        ("bridgehead:dial_duration_seconds:p99_5m", "p99"),
        ("histogram_quantile(0.5, sum by (le) (rate(bridgehead_server_dial_duration_seconds_bucket[5m])))", "p50"),
    ]),
    ("Bytes carried", "Bps", [
        (f"sum by (direction) (rate(bridgehead_server_bytes_total{{{SERVER}}}[5m]))", "{{direction}}"),
    ]),
    ("Tunnel memory budget in use", "percentunit", [
        (f"bridgehead_server_tunnel_buffered_bytes{{{SERVER}}} / bridgehead_server_tunnel_memory_budget_bytes{{{SERVER}}}", "server {{instance}}"),
        (f"max(bridgehead_agent_tunnel_buffered_bytes{{{AGENT}}} / bridgehead_agent_tunnel_memory_budget_bytes{{{AGENT}}})", "busiest agent"),
    ]),
    ("Agent handshakes", "reqps", [
        (f"sum by (result) (rate(bridgehead_server_agent_handshakes_total{{{SERVER}}}[5m]))", "{{result}}"),
    ]),
    ("Requests to kube-apiserver", "reqps", [
        (f"sum by (result) (rate(bridgehead_server_token_reviews_total{{{SERVER}}}[5m]))", "token reviews {{result}}"),
        (f"sum by (result) (rate(bridgehead_server_lease_renewals_total{{{SERVER}}}[5m]))", "lease renewals {{result}}"),
    ]),
    ("Certificate expiry", "s", [
        (f"min by (job, role) ((bridgehead_server_certificate_expiry_timestamp_seconds{{{SERVER}}} or bridgehead_agent_certificate_expiry_timestamp_seconds{{{AGENT}}}) - time())", "{{job}} {{role}}"),
    ]),
]


def alert_rule(name, severity, for_, signal, condition, summary, description):
    rule = {"alert": name, "expr": f"({signal}) {condition}"}
    if for_ != "0m":
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": RUNBOOK + name.lower(),
    }
    return rule


def groups():
    return [
        {"name": "bridgehead.recording", "rules": [{"record": r, "expr": e} for r, e in RECORDING]},
        {"name": "bridgehead.alerts", "rules": [alert_rule(*a) for a in ALERTS]},
    ]


def yaml(value, indent=0):
    """Block YAML for dicts, lists and strings (strings double-quoted, JSON-escaped)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.append(yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            body = yaml(item, indent + 2)
            lines.append(f"{pad}- {body.lstrip()}")
        return "\n".join(lines)
    return pad + scalar(value)


def scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(value)


HEADER = "# Generated by deploy/monitoring/generate.py: edit that, then run it.\n"


def rule_file():
    return HEADER + yaml({"groups": groups()}) + "\n"


def prometheus_rule():
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "bridgehead",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "bridgehead"},
        },
        "spec": {"groups": groups()},
    }
    return HEADER + yaml(rule) + "\n"


def dashboard():
    panels = []
    for i, (title, unit, queries) in enumerate(PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend}
                for j, (expr, legend) in enumerate(queries)
            ],
        })
    board = {
        "title": "Bridgehead",
        "uid": "bridgehead-fleet",
        "tags": ["bridgehead", "kubernetes"],
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{
            "name": "datasource",
            "type": "datasource",
            "query": "prometheus",
            "label": "Data source",
        }]},
        "panels": panels,
    }
    return json.dumps(board, indent=2) + "\n"



def expand(text, labels):
    """An annotation as Prometheus writes it for an alert with `labels` (only `$labels` is used)."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def series(changes):
    merged = dict(HEALTHY)
    merged.update(changes)
    return [{"series": name, "values": values} for name, values in merged.items()]


def rule_tests():
    assert sorted(FIRING) == sorted(a[0] for a in ALERTS), "every alert needs its firing case"
    cases = [{
        "name": "a healthy fleet fires nothing",
        "interval": "1m",
        "input_series": series({}),
        "alert_rule_test": [
            {"eval_time": "170m", "alertname": a[0], "exp_alerts": []} for a in ALERTS
        ],
    }]
    for name, severity, _, _, _, summary, description in ALERTS:
        changes, at, labels = FIRING[name]
        labels = dict(labels, severity=severity)
        cases.append({
            "name": f"{name} fires",
            "interval": "1m",
            "input_series": series(changes),
            "alert_rule_test": [{
                "eval_time": at,
                "alertname": name,
                "exp_alerts": [{
                    "exp_labels": labels,
                    "exp_annotations": {
                        "summary": summary,
                        "description": expand(description, labels),
                        "runbook_url": RUNBOOK + name.lower(),
                    },
                }],
            }],
        })
    test = {
        "rule_files": ["../bridgehead.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": cases,
    }
    return HEADER + yaml(test) + "\n"


def dashboard_configmap():
    """The dashboard where Grafana's sidecar (kube-prometheus-stack's) picks it up: a ConfigMap
    with the label `grafana_dashboard`."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "bridgehead-dashboard",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "bridgehead", "grafana_dashboard": "1"},
        },
        "data": {"bridgehead.json": dashboard()},
    }
    return HEADER + yaml(config_map) + "\n"


def chart_groups():
    """The rule groups for charts/bridgehead's PrometheusRule (Helm does not template files
    it reads with .Files.Get, so the alerts' {{ $labels }} stay as they are)."""
    return HEADER + yaml(groups()) + "\n"


OUTPUTS = {
    "bridgehead.rules.yaml": rule_file,
    "prometheusrule.yaml": prometheus_rule,
    "dashboard.json": dashboard,
    "dashboard-configmap.yaml": dashboard_configmap,
    "tests/bridgehead.rules.test.yaml": rule_tests,
    "../../charts/bridgehead/files/rule-groups.yaml": chart_groups,
    "../../charts/bridgehead/files/dashboard.json": dashboard,
}


def queries():
    for _, _, _, signal, *_ in ALERTS:
        yield signal
    for _, expr in RECORDING:
        yield expr
    for _, _, targets in PANELS:
        for expr, _ in targets:
            yield expr


def main(argv):
    if argv[1:] == ["--queries"]:
        for query in queries():
            print(query)
        return 0
    check = argv[1:] == ["--check"]
    stale = []
    for name, make in OUTPUTS.items():
        path = os.path.join(HERE, name)
        text = make()
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            if check:
                stale.append(name)
            else:
                with open(path, "w") as out:
                    out.write(text)
    if stale:
        print("stale, run deploy/monitoring/generate.py: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
