// The pause program of the test nodes' pod sandboxes (scripts/image.sh builds it into the
// pause image): standard library only, built static.
module bridgehead/e2e/pause

go 1.21
