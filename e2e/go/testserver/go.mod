// The test nodes' workload server (scripts/image.sh builds it into an image): standard
// library only, built static.
module bridgehead/e2e/testserver

go 1.21
