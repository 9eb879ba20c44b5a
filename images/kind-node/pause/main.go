// Command pause is the pod sandbox's first process on the pdmtp kind node: it holds the pod's
// namespaces open for as long as the pod lives, reaps the zombies of a shared PID namespace,
// and exits on SIGINT or SIGTERM. containerd starts it as the sandbox image
// (images/kind-node/files/etc/containerd/config.toml).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the tag the image carries (the pause release kubeadm lists for our Kubernetes pin).
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pdmtp pause", version)
		return
	}
	if os.Getpid() != 1 {
		// Still useful (it holds namespaces), but zombies of a shared PID namespace would not
		// be re-parented to it.
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: shutting down on %v\n", sig)
			os.Exit(0)
		}
		// Signals coalesce: one SIGCHLD may stand for several exited children.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
