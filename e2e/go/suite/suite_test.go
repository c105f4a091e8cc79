// Package suite is the upstream Kubernetes e2e suite (`e2e.test`) cut down to the test packages
// that hold the tests whose traffic goes from kube-apiserver to nodes and pods (exec, attach,
// logs, cp, port-forward, the proxy subresources, admission and conversion webhooks, the
// aggregated API): Bridgehead carries all of it. Upstream's test/e2e/e2e_test.go links every
// SIG's tests (storage drivers, DRA, autoscaling, ...); a binary of only these compiles in less
// time and caches in less space. The suite's own setup (waiting for nodes and kube-system,
// RunE2ETests) comes from package test/e2e, so a run behaves as upstream's binary does.
package suite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"

	e2e "k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The feature and label constants the tests below name; frozen before the specs register.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The tests. sig-node's common tests (Pods over websockets, container logs) come with
	// package test/e2e itself, which imports test/e2e/common.
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/kubectl"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/e2e/node"

	// The framework's hooks a full e2e.test installs: failure dumps, metrics, node checks.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "Print the Kubernetes version this suite was built from and exit.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "e2e.test: unexpected arguments %v\n", flag.Args())
		os.Exit(64)
	}
	// The manifests and fixtures the tests read (webhook and CRD objects, pod specs) are
	// embedded in the binary: no checkout of kubernetes is needed beside it.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
