// kubeclient dials a tunnel the way kube-apiserver's egress selector does for
// proxyProtocol: HTTPConnect (k8s.io/apiserver/pkg/server/egressselector), using Go's own
// crypto/tls and net/http: a fresh TLS connection (or Unix socket) per tunnel, exactly
// "CONNECT <target> HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", http.ReadResponse over a
// bufio.Reader, status 200 required, and no byte buffered behind the response head.
// Then it writes a message through the tunnel and prints what comes back.
//
// Usage: kubeclient (tcp ADDR CA CERT KEY | uds PATH) TARGET MESSAGE
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	args := os.Args[1:]
	var conn net.Conn
	var err error
	switch {
	case len(args) == 7 && args[0] == "tcp":
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(args[2])
		if err != nil || !pool.AppendCertsFromPEM(ca) {
			fail("reading CA %s: %v", args[2], err)
		}
		cert, err := tls.LoadX509KeyPair(args[3], args[4])
		if err != nil {
			fail("loading client certificate: %v", err)
		}
		config := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}
		dialer := &net.Dialer{Timeout: 10 * time.Second}
		conn, err = tls.DialWithDialer(dialer, "tcp", args[1], config)
		if err != nil {
			fail("dialing proxy %s: %v", args[1], err)
		}
		args = args[5:]
	case len(args) == 4 && args[0] == "uds":
		conn, err = net.DialTimeout("unix", args[1], 10*time.Second)
		if err != nil {
			fail("dialing proxy %s: %v", args[1], err)
		}
		args = args[2:]
	default:
		fail("usage: kubeclient (tcp ADDR CA CERT KEY | uds PATH) TARGET MESSAGE")
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	target, message := args[0], args[1]

	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, "127.0.0.1")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		fail("reading HTTP response from CONNECT to %s failed: %v", target, err)
	}
	if res.StatusCode != 200 {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
		fail("proxy error while dialing %s: %v: %s", target, res.Status, body)
	}
	if br.Buffered() > 0 {
		fail("unexpected %d bytes of buffered data from CONNECT proxy", br.Buffered())
	}
	if _, err := io.WriteString(conn, message); err != nil {
		fail("writing through the tunnel: %v", err)
	}
	back := make([]byte, len(message))
	if _, err := io.ReadFull(conn, back); err != nil {
		fail("reading through the tunnel: %v", err)
	}
	fmt.Print(string(back))
}
