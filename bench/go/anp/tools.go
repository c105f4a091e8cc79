//go:build tools

// Package tools pins konnectivity (apiserver-network-proxy) for the benchmark: its proxy-server
// and proxy-agent are built from this module's go.mod and go.sum by scripts/anp-build.sh.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
)
