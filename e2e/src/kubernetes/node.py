# A Kubernetes node stand-in for the e2e tests, run inside a test host's network namespace:
# what kube-apiserver reaches on a node through its egress selector (through Bridgehead).
#
#   node.py NAME CERT KEY NODE_IP POD_IP
#
# - kubelet, HTTPS on NODE_IP:10250: /containerLogs/NS/POD/CONTAINER (with ?follow=true one
#   line every 100 ms until the client leaves, else three lines), anything else answers
#   "kubelet NAME: PATH" (node proxy; PATH without the query);
# - a pod, HTTP on POD_IP:8080: "pod NAME: PATH" (pod and service proxy; PATH without the
#   query);
# - an admission webhook, HTTPS on POD_IP:8443, POST /validate: allows every request except for
#   objects whose name starts with "denied-", which it denies with "denied by the webhook on
#   NAME";
# - an aggregated API server, HTTPS on POD_IP:9443: /apis/bridgehead.test/v1 (discovery, one
#   resource "greetings") and /apis/bridgehead.test/v1/greetings (a list whose one item names
#   the node);
# - a black hole on POD_IP:9999: a listener whose accept queue is full, so connects hang.
#
# Prints "node NAME listening on NODE_IP" once every listener is up; exits when its parent (the
# test) is gone.
import http.server, json, os, socket, ssl, sys, threading, time

name, cert, key, node_ip, pod_ip = sys.argv[1:6]


def tls(server):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


class Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, kind="text/plain"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Kubelet(Base):
    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path.startswith("/containerLogs/"):
            return self.logs("follow=true" in query)
        self.reply(200, "kubelet %s: %s\n" % (name, path))

    def logs(self, follow):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        count = 0
        try:
            while follow or count < 3:
                line = ("log line %d from %s\n" % (count, name)).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                count += 1
                if follow:
                    time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


class Pod(Base):
    def do_GET(self):
        self.reply(200, "pod %s: %s\n" % (name, self.path.partition("?")[0]))


class Webhook(Base):
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        denied = request.get("name", "").startswith("denied-")
        response = {"uid": request["uid"], "allowed": not denied}
        if denied:
            response["status"] = {"code": 403, "message": "denied by the webhook on " + name}
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        self.reply(200, json.dumps(review), "application/json")


class Aggregated(Base):
    def do_GET(self):
        path = self.path.partition("?")[0].rstrip("/")
        if path == "/apis/bridgehead.test/v1":
            body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "bridgehead.test/v1",
                    "resources": [{"name": "greetings", "singularName": "greeting", "namespaced": False,
                                   "kind": "Greeting", "verbs": ["list"]}]}
        elif path == "/apis/bridgehead.test/v1/greetings":
            body = {"kind": "GreetingList", "apiVersion": "bridgehead.test/v1", "metadata": {},
                    "items": [{"kind": "Greeting", "apiVersion": "bridgehead.test/v1",
                               "metadata": {"name": "hello-from-" + name}}]}
        elif path in ("/healthz", "/readyz", "/livez"):
            return self.reply(200, "ok")
        else:
            return self.reply(404, "not found: " + path)
        self.reply(200, json.dumps(body), "application/json")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


servers = [
    tls(Server((node_ip, 10250), Kubelet)),
    Server((pod_ip, 8080), Pod),
    tls(Server((pod_ip, 8443), Webhook)),
    tls(Server((pod_ip, 9443), Aggregated)),
]
for server in servers:
    threading.Thread(target=server.serve_forever, daemon=True).start()

# The black hole: backlog 0, never accepted, filled until a connect times out.
hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
hole.bind((pod_ip, 9999))
hole.listen(0)
queued = []
while True:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.settimeout(0.3)
    try:
        probe.connect((pod_ip, 9999))
        queued.append(probe)
    except OSError:
        probe.close()
        break
print("node %s listening on %s" % (name, node_ip), flush=True)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(1)
