// Command pause is the pod sandbox ("pause") image of the local cluster
// (hack/local-cluster.sh): no registry is reachable there, so containerd's
// sandbox_image is built from this instead of pulled. It holds the pod's
// namespaces by sleeping until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
