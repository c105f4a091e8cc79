// Command pause holds a pod sandbox's namespaces open for the test nodes' containerd: it
// waits for a signal, reaps any child it inherits as PID 1 of a shared PID namespace, and
// exits 0 on SIGINT or SIGTERM (the runtime stopping the sandbox).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Several children may have ended behind one SIGCHLD.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
