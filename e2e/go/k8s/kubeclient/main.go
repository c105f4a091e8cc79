// Command kubeclient dials a tunnel with kube-apiserver's own egress dialer: the
// k8s.io/apiserver/pkg/server/egressselector package, at the same version as the
// kube-apiserver built from this module. It loads the EgressSelectorConfiguration the way
// kube-apiserver's --egress-selector-config-file does (read, validate, NewEgressSelector),
// looks up the dialer of one egress selection (default: cluster), dials TARGET through it,
// writes MESSAGE into the tunnel and prints what comes back on stdout.
//
// Usage:
//
//	kubeclient [flags] EGRESS_CONFIG_YAML TARGET MESSAGE
//	kubeclient [flags] tcp PROXY_ADDR CA CERT KEY TARGET MESSAGE
//	kubeclient [flags] uds SOCKET_PATH TARGET MESSAGE
//
// The tcp and uds forms are those of the older e2e/go/kubeclient.go: they stand for a
// configuration whose cluster selection is proxyProtocol: HTTPConnect over
// tcp (url https://PROXY_ADDR, tlsConfig caBundle/clientCert/clientKey) or uds (udsName).
//
// By default it reads back as many bytes as MESSAGE has (an echo); -n reads another count and
// -eof reads until the tunnel ends. -half-close closes the write side after MESSAGE (TLS
// close_notify over tcp, shutdown(SHUT_WR) over uds).
//
// -version prints the k8s.io/apiserver version it was built with.
//
// Exit status: 0 on success; 1 when the dial or the tunnel fails, with the error on stderr (a
// dial error is printed exactly as the egress dialer returned it, which is the text
// kube-apiserver reports); 2 on a usage or configuration error; 3 when -timeout expires (the
// egress dialer itself sets no deadline on the CONNECT exchange).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/server/egressselector"
)

const usage = `usage: kubeclient [flags] EGRESS_CONFIG_YAML TARGET MESSAGE
       kubeclient [flags] tcp PROXY_ADDR CA CERT KEY TARGET MESSAGE
       kubeclient [flags] uds SOCKET_PATH TARGET MESSAGE`

// stage names what the program is doing, for the -timeout message.
var stage atomic.Value

func exit(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

// halfCloser is what *tls.Conn and *net.UnixConn offer to end one direction.
type halfCloser interface {
	CloseWrite() error
}

func main() {
	flags := flag.NewFlagSet("kubeclient", flag.ContinueOnError)
	flags.Usage = func() {
		fmt.Fprintln(os.Stderr, usage)
		flags.PrintDefaults()
	}
	selection := flags.String("selection", "cluster", "egress selection whose dialer to use: cluster, controlplane or etcd")
	count := flags.Int("n", -1, "bytes to read back; -1: as many as MESSAGE has")
	untilEOF := flags.Bool("eof", false, "read back until the tunnel ends (overrides -n)")
	halfClose := flags.Bool("half-close", false, "close the write side of the tunnel after writing MESSAGE")
	timeout := flags.Duration("timeout", 20*time.Second, "give up after this long, dial included (0: never)")
	version := flags.Bool("version", false, "print the k8s.io/apiserver version this was built with, and exit")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *version {
		fmt.Printf("kubeclient k8s.io/apiserver %s %s\n", apiserverVersion(), runtime.Version())
		return
	}
	args := flags.Args()

	var config *apiserver.EgressSelectorConfiguration
	switch {
	case len(args) == 7 && args[0] == "tcp":
		config = httpConnect(apiserver.Transport{TCP: &apiserver.TCPTransport{
			URL:       "https://" + args[1],
			TLSConfig: &apiserver.TLSConfig{CABundle: args[2], ClientCert: args[3], ClientKey: args[4]},
		}})
		args = args[5:]
	case len(args) == 4 && args[0] == "uds":
		config = httpConnect(apiserver.Transport{UDS: &apiserver.UDSTransport{UDSName: args[1]}})
		args = args[2:]
	case len(args) == 3:
		var err error
		// As kube-apiserver's EgressSelectorOptions.ApplyTo.
		config, err = egressselector.ReadEgressSelectorConfiguration(args[0])
		if err != nil {
			exit(2, "failed to read egress selector config: %v", err)
		}
		args = args[1:]
	default:
		exit(2, "%s", usage)
	}
	if errs := egressselector.ValidateEgressSelectorConfiguration(config); len(errs) > 0 {
		exit(2, "failed to validate egress selector configuration: %v", errs.ToAggregate())
	}
	selector, err := egressselector.NewEgressSelector(config)
	if err != nil {
		exit(2, "failed to setup egress selector: %v", err)
	}
	target, message := args[0], args[1]

	var egress egressselector.EgressType
	switch strings.ToLower(*selection) {
	case "cluster":
		egress = egressselector.Cluster
	case "controlplane":
		egress = egressselector.ControlPlane
	case "etcd":
		egress = egressselector.Etcd
	default:
		exit(2, "unknown egress selection %q: want cluster, controlplane or etcd", *selection)
	}
	if selector == nil {
		exit(2, "the configuration has no egress selections")
	}
	dial, err := selector.Lookup(egress.AsNetworkContext())
	if err != nil {
		exit(2, "looking up egress selection %s: %v", egress, err)
	}
	if dial == nil {
		// kube-apiserver would dial directly; a test wants to know.
		exit(2, "the configuration has no %s egress selection", egress)
	}

	stage.Store("dialing")
	if *timeout > 0 {
		time.AfterFunc(*timeout, func() {
			exit(3, "kubeclient: timed out after %v while %s", *timeout, stage.Load())
		})
	}
	conn, err := dial(context.Background(), "tcp", target)
	if err != nil {
		exit(1, "%v", err)
	}
	defer conn.Close()

	stage.Store("writing through the tunnel")
	if _, err := io.WriteString(conn, message); err != nil {
		exit(1, "writing through the tunnel: %v", err)
	}
	if *halfClose {
		stage.Store("closing the write side")
		hc, ok := conn.(halfCloser)
		if !ok {
			exit(1, "closing the write side: %T cannot half-close", conn)
		}
		if err := hc.CloseWrite(); err != nil {
			exit(1, "closing the write side: %v", err)
		}
	}

	stage.Store("reading through the tunnel")
	if *untilEOF {
		if _, err := io.Copy(os.Stdout, conn); err != nil && !errors.Is(err, net.ErrClosed) {
			exit(1, "reading through the tunnel: %v", err)
		}
		return
	}
	want := int64(len(message))
	if *count >= 0 {
		want = int64(*count)
	}
	if _, err := io.CopyN(os.Stdout, conn, want); err != nil {
		exit(1, "reading through the tunnel: %v", err)
	}
}

// httpConnect is a configuration with one selection, cluster, over HTTP CONNECT.
func httpConnect(transport apiserver.Transport) *apiserver.EgressSelectorConfiguration {
	return &apiserver.EgressSelectorConfiguration{
		EgressSelections: []apiserver.EgressSelection{{
			Name: "cluster",
			Connection: apiserver.Connection{
				ProxyProtocol: apiserver.ProtocolHTTPConnect,
				Transport:     &transport,
			},
		}},
	}
}

// apiserverVersion is the version of k8s.io/apiserver in this binary's build list.
func apiserverVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	for _, dep := range info.Deps {
		if dep.Path == "k8s.io/apiserver" {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "(unknown)"
}
