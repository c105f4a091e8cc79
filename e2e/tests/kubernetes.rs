//! kube-apiserver's own traffic through Bridgehead: a real control plane (etcd and
//! kube-apiserver from their Go modules) whose EgressSelectorConfiguration sends `cluster`
//! traffic to a bridgehead-server, and agents on node test hosts where a kubelet stand-in, a
//! pod, an admission webhook and an aggregated API server run. Each test uses kubectl as a user
//! would. Needs root (network namespaces) and `scripts/k8s-build.sh`; skipped loudly otherwise.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::cluster::{
    server_identity, Auth, Cluster, AGENT_ACCOUNT, AGENT_NAMESPACE, AUDIENCE,
};
use bridgehead_e2e::kubernetes::node::{self, NAMESPACE, POD_PORT};
use bridgehead_e2e::kubernetes::{self, ControlPlane};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{Server, ServerOptions};

#[test]
fn kube_apiservers_traffic_reaches_every_kind_of_backend_through_bridgehead() {
    let Some(binaries) = kubernetes::require(
        "kube_apiservers_traffic_reaches_every_kind_of_backend_through_bridgehead",
    ) else {
        return;
    };
    let cluster = Cluster::start(&binaries, 2, Auth::Tokens { bind: true });
    for stand_in in &cluster.nodes {
        let name = &stand_in.name;
        // Node proxy: to the kubelet on the node's InternalIP:10250.
        let answer = cluster.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{name}/proxy/healthz"),
        ]);
        assert_eq!(answer.trim(), format!("kubelet {name}: /healthz"));
        // kubectl logs: the kubelet's containerLogs.
        let logs = cluster.kubectl(&["logs", "-n", NAMESPACE, &stand_in.pod()]);
        assert_eq!(logs.lines().count(), 3, "{logs}");
        assert!(logs.contains(&format!("log line 2 from {name}")), "{logs}");
        // Pod proxy, to the pod IP (routed by the node's pod CIDR).
        let pod = cluster.kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{NAMESPACE}/pods/{}:{POD_PORT}/proxy/hello",
                stand_in.pod()
            ),
        ]);
        assert_eq!(pod.trim(), format!("pod {name}: /hello"));
        // Service proxy, through the Service's endpoints.
        let service = cluster.kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{NAMESPACE}/services/{}:main/proxy/hello",
                node::web_service(name)
            ),
        ]);
        assert_eq!(service.trim(), format!("pod {name}: /hello"));
    }
    // kubectl logs -f: lines arrive while it runs, as the kubelet writes them.
    let stand_in = &cluster.nodes[0];
    let mut follow = cluster.kubectl_command(&["logs", "-f", "-n", NAMESPACE, &stand_in.pod()]);
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let mut arrivals = Vec::new();
    let from_target = "bridgehead_server_bytes_total{direction=\"from_target\"}";
    let mut counted = Vec::new();
    for expected in 0..20 {
        let line = lines.next().expect("kubectl logs -f ended").unwrap();
        assert_eq!(line, format!("log line {expected} from {}", stand_in.name));
        arrivals.push(started.elapsed());
        if expected == 5 || expected == 19 {
            counted.push(cluster.server.metric(from_target).unwrap());
        }
    }
    // The stream's bytes are counted while it runs, not when it ends.
    assert!(counted[1] > counted[0], "bytes counted: {counted:?}");
    let _ = follow.kill();
    let _ = follow.wait();
    // The kubelet writes one line every 100 ms: twenty lines cannot come in one burst.
    assert!(
        arrivals[19] - arrivals[0] >= Duration::from_millis(1500),
        "lines were not streamed: {arrivals:?}"
    );
}

#[test]
fn admission_webhooks_and_aggregated_apis_are_reached_through_bridgehead() {
    let Some(binaries) = kubernetes::require(
        "admission_webhooks_and_aggregated_apis_are_reached_through_bridgehead",
    ) else {
        return;
    };
    let cluster = Cluster::start(&binaries, 2, Auth::Tokens { bind: true });
    let (webhook_node, api_node) = (&cluster.nodes[0], &cluster.nodes[1]);
    let cp = &cluster.control_plane;
    cp.apply(&webhook_node.webhook_yaml(cp).unwrap()).unwrap();
    // kube-apiserver picks the configuration up shortly after it is stored.
    let denial = format!("denied by the webhook on {}", webhook_node.name);
    wait_until(Duration::from_secs(30), || {
        let output = cp
            .kubectl(&["create", "configmap", "denied-probe", "-n", NAMESPACE])
            .unwrap();
        String::from_utf8_lossy(&output.stderr).contains(&denial)
    })
    .unwrap_or_else(|_| {
        panic!(
            "the webhook never answered; server log:\n{}",
            cluster.server.process.stderr()
        )
    });
    cluster.kubectl(&["create", "configmap", "allowed", "-n", NAMESPACE]);

    cp.apply(&api_node.api_service_yaml(cp).unwrap()).unwrap();
    // The availability check (discovery through the tunnel) marks it Available.
    wait_until(Duration::from_secs(60), || {
        cp.kubectl_ok(&[
            "get",
            "apiservice",
            &format!("v1.{}", node::API_GROUP),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])
        .is_ok_and(|status| status.trim() == "True")
    })
    .unwrap_or_else(|_| {
        panic!(
            "the APIService never became Available: {}",
            cluster.kubectl(&[
                "get",
                "apiservice",
                &format!("v1.{}", node::API_GROUP),
                "-o",
                "yaml"
            ])
        )
    });
    let greetings = cluster.kubectl(&[
        "get",
        "--raw",
        &format!("/apis/{}/v1/greetings", node::API_GROUP),
    ]);
    assert!(
        greetings.contains(&format!("hello-from-{}", api_node.name)),
        "{greetings}"
    );
}

/// A ServiceAccount token signed with the cluster's own service-account key, as kube-apiserver
/// would sign it, with the claims it would put in, but `exp` chosen by the test.
fn signed_token(control_plane: &ControlPlane, account_uid: &str, expires: i64) -> String {
    use base64::Engine as _;
    let pem = std::fs::read_to_string(control_plane.dir().join("sa.key")).unwrap();
    let der = base64::engine::general_purpose::STANDARD
        .decode(
            pem.lines()
                .filter(|line| !line.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap();
    let rng = ring::rand::SystemRandom::new();
    let key = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &der,
        &rng,
    )
    .unwrap();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let claims = serde_json::json!({
        "aud": [AUDIENCE],
        "exp": expires,
        "iat": now - 3600,
        "nbf": now - 3600,
        "iss": kubernetes::control_plane::ISSUER,
        "sub": format!("system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"),
        "kubernetes.io": {
            "namespace": AGENT_NAMESPACE,
            "serviceaccount": {"name": AGENT_ACCOUNT, "uid": account_uid},
        },
    });
    let signing_input = format!(
        "{}.{}",
        b64(br#"{"alg":"ES256","typ":"JWT"}"#),
        b64(claims.to_string().as_bytes())
    );
    let signature = key.sign(&rng, signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", b64(signature.as_ref()))
}

#[test]
fn agents_are_refused_unless_their_token_is_right() {
    let Some(binaries) = kubernetes::require("agents_are_refused_unless_their_token_is_right")
    else {
        return;
    };
    let cluster = Cluster::start(&binaries, 0, Auth::Tokens { bind: false });
    let cp = &cluster.control_plane;
    let config =
        bridgehead_e2e::client::tls::config(&cluster.pki.path("cluster-ca.crt"), None).unwrap();
    let upgrade = |token: Option<&str>| {
        bridgehead_e2e::client::agent_upgrade(
            config.clone(),
            cluster.server.agent_addr,
            token,
            "id=probe",
        )
        .unwrap()
    };
    let token = |namespace: &str, account: &str, audience: &str| {
        cp.token(namespace, account, audience, 600, None).unwrap()
    };
    cluster.kubectl(&[
        "create",
        "serviceaccount",
        "someone-else",
        "-n",
        AGENT_NAMESPACE,
    ]);
    cluster.kubectl(&["create", "serviceaccount", AGENT_ACCOUNT, "-n", "default"]);
    let uid = cluster.kubectl(&[
        "get",
        "serviceaccount",
        AGENT_ACCOUNT,
        "-n",
        AGENT_NAMESPACE,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;

    let good = token(AGENT_NAMESPACE, AGENT_ACCOUNT, AUDIENCE);
    let cases: Vec<(&str, Option<String>, u16, &str)> = vec![
        (
            "a token for the agents' account and audience",
            Some(good.clone()),
            101,
            "",
        ),
        (
            "the same claims, signed here, still valid",
            Some(signed_token(cp, &uid, now + 600)),
            101,
            "",
        ),
        ("no token", None, 401, "no bearer token"),
        ("garbage", Some("not-a-token".into()), 403, "token rejected"),
        (
            "the wrong audience",
            Some(token(AGENT_NAMESPACE, AGENT_ACCOUNT, "kubernetes")),
            403,
            "token rejected",
        ),
        (
            "another account",
            Some(token(AGENT_NAMESPACE, "someone-else", AUDIENCE)),
            403,
            "someone-else",
        ),
        (
            "the account in another namespace",
            Some(token("default", AGENT_ACCOUNT, AUDIENCE)),
            403,
            "system:serviceaccount:default:",
        ),
        (
            "expired",
            Some(signed_token(cp, &uid, now - 60)),
            403,
            "token rejected",
        ),
    ];
    for (what, token, status, reason) in &cases {
        let reply = upgrade(token.as_deref());
        assert_eq!(
            reply.status, *status,
            "{what}: {}{}",
            reply.head, reply.body
        );
        assert!(reply.body.contains(reason), "{what}: {}", reply.body);
    }
    // The agent reads its token file for every connection: refused with a wrong token, it
    // connects once the file holds a right one (as when kubelet rotates the projected token).
    let token_file = cluster.socket_dir.path().join("rotating-token");
    std::fs::write(
        &token_file,
        token(AGENT_NAMESPACE, "someone-else", AUDIENCE),
    )
    .unwrap();
    let agent = bridgehead_e2e::Agent::start(
        &cluster.pki,
        &cluster.server,
        bridgehead_e2e::AgentOptions {
            id: Some("rotating".into()),
            args: vec!["--server-name".into(), "127.0.0.1".into()],
            server: Some(cluster.server.agent_addr),
            token: Some(token_file.clone()),
            certificate: Some(None),
            ..Default::default()
        },
    )
    .unwrap();
    agent
        .process
        .wait_log("someone-else", Duration::from_secs(20))
        .unwrap();
    std::fs::write(&token_file, &good).unwrap();
    cluster.server.wait_agents(1).unwrap();
    assert!(
        !agent.process.stderr().contains(&good),
        "the agent logged its token"
    );
    drop(agent);

    // A deleted account's tokens stop working once the cached review expires (1 s here).
    cluster.kubectl(&[
        "delete",
        "serviceaccount",
        AGENT_ACCOUNT,
        "-n",
        AGENT_NAMESPACE,
    ]);
    wait_until(Duration::from_secs(20), || {
        upgrade(Some(&good)).status == 403
    })
    .expect("a deleted account's token still connects");

    // kube-apiserver out of reach: refused, with the reason, never let in.
    let unreachable = cluster.socket_dir.path().join("unreachable.kubeconfig");
    let text = std::fs::read_to_string(server_identity(cp)).unwrap();
    std::fs::write(
        &unreachable,
        text.replace(
            &format!(":{}", kubernetes::control_plane::APISERVER_PORT),
            ":1",
        ),
    )
    .unwrap();
    let lonely = Server::start(
        &cluster.pki,
        ServerOptions {
            args: [
                "--agent-namespace",
                AGENT_NAMESPACE,
                "--agent-service-account",
                AGENT_ACCOUNT,
                "--authentication-audience",
                AUDIENCE,
            ]
            .map(String::from)
            .into_iter()
            .chain([format!("--kubeconfig={}", unreachable.display())])
            .collect(),
            without_cluster_ca: true,
            ..Default::default()
        },
    )
    .unwrap();
    let reply = bridgehead_e2e::client::agent_upgrade(
        config.clone(),
        lonely.agent_addr,
        Some(&good),
        "id=probe",
    )
    .unwrap();
    assert_eq!(reply.status, 503, "{}{}", reply.head, reply.body);
    assert!(
        reply.body.contains("cannot review the token"),
        "{}",
        reply.body
    );

    for result in ["authenticated", "rejected"] {
        let count = cluster
            .server
            .metric(&format!(
                "bridgehead_server_token_reviews_total{{result=\"{result}\"}}"
            ))
            .unwrap();
        assert!(count >= 1.0, "token_reviews{{result={result}}} = {count}");
    }
    let errors = lonely
        .metric("bridgehead_server_token_reviews_total{result=\"error\"}")
        .unwrap();
    assert_eq!(errors, 1.0);
}

#[test]
fn an_agent_cannot_claim_another_nodes_identifiers() {
    let Some(binaries) = kubernetes::require("an_agent_cannot_claim_another_nodes_identifiers")
    else {
        return;
    };
    let cluster = Cluster::start(&binaries, 2, Auth::Tokens { bind: true });
    let (honest, victim) = (&cluster.nodes[0], &cluster.nodes[1]);
    // With node-1's token, an upgrade claiming node-2 is refused, naming the claim.
    let config =
        bridgehead_e2e::client::tls::config(&cluster.pki.path("cluster-ca.crt"), None).unwrap();
    let stolen = cluster.agent_token(&honest.name);
    for claim in [
        format!("host={}", victim.name),
        format!("ipv4={}", victim.node_ip),
    ] {
        let reply = bridgehead_e2e::client::agent_upgrade(
            config.clone(),
            cluster.server.agent_addr,
            Some(&stolen),
            &format!("id=spoof&{claim}"),
        )
        .unwrap();
        assert_eq!(reply.status, 403, "{claim}: {}{}", reply.head, reply.body);
        assert!(
            reply.body.contains(&claim) && reply.body.contains(&format!("node {}", honest.name)),
            "{claim}: {}",
            reply.body
        );
    }
    // A spoofing agent started on node-1's host never registers, and node-2's kubelet
    // traffic keeps going to node-2.
    let spoof = cluster.start_agent(
        1,
        &honest.name,
        &format!("host={}&ipv4={}", victim.name, victim.node_ip),
    );
    spoof
        .process
        .wait_log("server refused the connection", Duration::from_secs(20))
        .unwrap();
    assert_eq!(cluster.server.agents().unwrap().len(), 2);
    for _ in 0..10 {
        let answer = cluster.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/who", victim.name),
        ]);
        assert_eq!(answer.trim(), format!("kubelet {}: /who", victim.name));
    }
}

#[test]
fn kubectl_names_the_cause_when_a_tunnel_fails() {
    let Some(binaries) = kubernetes::require("kubectl_names_the_cause_when_a_tunnel_fails") else {
        return;
    };
    let mut cluster =
        Cluster::start_with(&binaries, 1, Auth::Certificates, &["--dial-timeout", "2s"]);
    let stand_in = &cluster.nodes[0];
    let failure = |args: &[&str]| {
        let output = cluster.control_plane.kubectl(args).unwrap();
        assert!(!output.status.success(), "kubectl {args:?} succeeded");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    // A node no agent announces.
    cluster
        .control_plane
        .apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: ghost\n")
        .unwrap();
    cluster.kubectl(&[
        "patch",
        "node",
        "ghost",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.1"}]}}"#,
    ]);
    let no_agent = failure(&["get", "--raw", "/api/v1/nodes/ghost/proxy/healthz"]);
    assert!(
        no_agent.contains("503") && no_agent.contains("no agent matches"),
        "{no_agent}"
    );
    // A pod port where nothing listens.
    let pod_port = |port: u16| {
        format!(
            "/api/v1/namespaces/{NAMESPACE}/pods/{}:{port}/proxy/",
            stand_in.pod()
        )
    };
    let refused = failure(&["get", "--raw", &pod_port(9)]);
    assert!(
        refused.contains("502") && refused.contains("refused"),
        "{refused}"
    );
    // A port whose connects hang: the dial times out (2 s here).
    let started = Instant::now();
    let timed_out = failure(&["get", "--raw", &pod_port(9999)]);
    assert!(timed_out.contains("504"), "{timed_out}");
    bridgehead_e2e::timing::assert_about(
        "the dial timeout",
        started.elapsed(),
        Duration::from_secs(2),
    );

    // The agent killed while kubectl follows a log. kube-apiserver copies a log stream until
    // its upstream ends, however it ends, and then ends kubectl's stream cleanly: the reset
    // Bridgehead gives kube-apiserver's connection is not passed on (kubectl exits 0, over the
    // socket and over mTLS alike). What Bridgehead can show, it does: the stream stops at once
    // and the server logs why.
    let mut follow = cluster.kubectl_command(&["logs", "-f", "-n", NAMESPACE, &stand_in.pod()]);
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        lines.next().expect("kubectl logs -f ended").unwrap();
    }
    cluster.agents[0].process.kill();
    let killed = Instant::now();
    let more = lines.map_while(Result::ok).count();
    follow.wait().unwrap();
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "kubectl logs -f went on for {:?} ({more} lines) after the agent died",
        killed.elapsed()
    );
    cluster
        .server
        .process
        .wait_log("ended=reset", Duration::from_secs(10))
        .unwrap();
    let _ = &mut cluster;
}

#[test]
fn kube_apiserver_reaches_nodes_through_the_mtls_frontend() {
    let Some(binaries) =
        kubernetes::require("kube_apiserver_reaches_nodes_through_the_mtls_frontend")
    else {
        return;
    };
    let cluster = Cluster::start_over(&binaries, 1, Auth::Certificates, &[], true);
    let stand_in = &cluster.nodes[0];
    let answer = cluster.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/healthz", stand_in.name),
    ]);
    assert_eq!(
        answer.trim(),
        format!("kubelet {}: /healthz", stand_in.name)
    );
    let logs = cluster.kubectl(&["logs", "-n", NAMESPACE, &stand_in.pod()]);
    assert_eq!(logs.lines().count(), 3, "{logs}");
}

/// Token reviews queued behind kube-apiserver's rate limit (0.2 a second here) are never
/// thrown away: a connection that waits past the server's patience gets `503` with a
/// `Retry-After`, the review goes on without it, and the agent's next attempt finds the
/// answer — with no second review of the same token.
#[test]
fn a_queued_token_review_outlives_its_connection_and_answers_the_next_attempt() {
    let test = "a_queued_token_review_outlives_its_connection_and_answers_the_next_attempt";
    let Some(binaries) = kubernetes::require(test) else {
        return;
    };
    let cluster = Cluster::start_with(
        &binaries,
        0,
        Auth::Tokens { bind: false },
        &[
            "--token-verification=review",
            "--kubeconfig-qps=0.2",
            "--kubeconfig-burst=1",
        ],
    );
    let cp = &cluster.control_plane;
    let config =
        bridgehead_e2e::client::tls::config(&cluster.pki.path("cluster-ca.crt"), None).unwrap();
    let tokens: Vec<String> = (0..3)
        .map(|_| {
            cp.token(AGENT_NAMESPACE, AGENT_ACCOUNT, AUDIENCE, 600, None)
                .unwrap()
        })
        .collect();
    let addr = cluster.server.agent_addr;
    let upgrade = move |token: &str, id: &str| {
        bridgehead_e2e::client::agent_upgrade(
            config.clone(),
            addr,
            Some(token),
            &format!("id={id}"),
        )
        .unwrap()
    };
    // The first review takes the burst; the next two queue 5 and 10 s behind it.
    assert_eq!(upgrade(&tokens[0], "a").status, 101);
    let queued: Vec<_> = tokens[1..]
        .iter()
        .enumerate()
        .map(|(i, token)| {
            let (token, upgrade) = (token.clone(), upgrade.clone());
            std::thread::spawn(move || upgrade(&token, &format!("q{i}")))
        })
        .collect();
    let replies: Vec<_> = queued.into_iter().map(|t| t.join().unwrap()).collect();
    let (waiting, told_to_wait) = replies
        .iter()
        .enumerate()
        .find(|(_, reply)| reply.status == 503)
        .unwrap_or_else(|| panic!("no connection was told to come back: {replies:?}"));
    assert!(
        told_to_wait.body.contains("queued"),
        "{}",
        told_to_wait.body
    );
    let retry_after: u64 = told_to_wait
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {}", told_to_wait.head));
    assert!((1..=30).contains(&retry_after), "Retry-After {retry_after}");
    // Its next attempt is answered from the review that went on without it.
    let token = &tokens[1 + waiting];
    wait_until(Duration::from_secs(30), || {
        upgrade(token, "again").status == 101
    })
    .expect("the queued token never got its answer");
    let reviewed = cluster
        .server
        .metric("bridgehead_server_token_reviews_total{result=\"authenticated\"}")
        .unwrap();
    assert_eq!(reviewed, 3.0, "a token was reviewed twice");
}
