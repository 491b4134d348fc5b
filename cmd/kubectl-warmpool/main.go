// Command kubectl-warmpool is the kubectl plugin of warmpool: put it on PATH
// and run `kubectl warmpool`. See internal/kubectlplugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/warmpool/warmpool/internal/kubectlplugin"
)

func main() {
	// From the first instruction: a Ctrl-C while the plugin still asks the
	// cluster what it serves, or waits for a sandbox, ends the command with
	// the exit code of a cancel (4), not as a killed process (130). The
	// first one interrupts the code and waits for it to stop; a second one
	// leaves at once.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		os.Exit(kubectlplugin.ExitCancelled)
	}()
	os.Exit(kubectlplugin.RunContext(ctx, os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
