// Command kubectl-warmpool is the kubectl plugin of warmpool: put it on PATH
// and run `kubectl warmpool`. See internal/kubectlplugin.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/warmpool/warmpool/internal/kubectlplugin"
)

func main() {
	os.Exit(kubectlplugin.Run(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
