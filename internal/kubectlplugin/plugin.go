// Package kubectlplugin is `kubectl warmpool` (cmd/kubectl-warmpool): run code
// in a pool, see pools and Sessions, cancel an Execution, read its output.
// Its flags are kubectl's (k8s.io/cli-runtime): -n, --context, --kubeconfig,
// --as and the rest behave as they do for kubectl, and RBAC decides.
//
// Exit codes of `run` (and of `logs --exit-code`) say how the code ended:
//
//	0  succeeded
//	1  the code failed: an exception, a non-zero shell exit, or a limit it hit (memory, processes, disk)
//	2  usage: bad flags or arguments
//	3  timed out (interrupted at its timeout)
//	4  cancelled (Ctrl-C, `kubectl warmpool cancel`, spec.cancel)
//	5  the sandbox was lost: its pod, interpreter or Session went away under the code
//	6  anything else: the pool does not exist, the API refused, ...
//
// The other commands exit 0, 1 on an error, or 2 on a usage error, as kubectl does.
package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	"github.com/liggitt/tabwriter"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Exit codes (see the package comment).
const (
	ExitSucceeded   = 0
	ExitCodeFailed  = 1
	ExitUsage       = 2
	ExitTimedOut    = 3
	ExitCancelled   = 4
	ExitSandboxLost = 5
	ExitOther       = 6
)

const mergePatch = types.MergePatchType

// exitError carries the exit code a command chose.
type exitError struct {
	code int
	err  error // nil: the outcome was printed already
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// usageError marks wrong arguments (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// Run runs the plugin with args (without the program name) and returns its
// exit code.
func Run(args []string, streams genericiooptions.IOStreams) int {
	return RunContext(context.Background(), args, streams)
}

// RunContext is Run with a context whose end interrupts a run as Ctrl-C does
// (cmd/kubectl-warmpool ends it at the first Ctrl-C).
func RunContext(ctx context.Context, args []string, streams genericiooptions.IOStreams) int {
	cmd := NewCommand(streams)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	var ee *exitError
	var ue usageError
	switch {
	case err == nil:
		return ExitSucceeded
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(streams.ErrOut, "error:", ee.err)
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintln(streams.ErrOut, "error:", err)
		return ExitUsage
	default:
		fmt.Fprintln(streams.ErrOut, "error:", err)
		if isFlagError(err) {
			return ExitUsage
		}
		return ExitCodeFailed
	}
}

// isFlagError tells cobra's argument and flag errors (usage) from others.
func isFlagError(err error) bool {
	var fe flagError
	return errors.As(err, &fe)
}

type flagError struct{ error }

// plugin holds what every command shares.
type plugin struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	// now is the clock of ages and durations; tests set it.
	now func() time.Time
	// outOpen is true when what the code printed so far ends mid-line.
	outOpen bool
}

// writeOut writes the code's output to stdout as it arrives.
func (p *plugin) writeOut(s string) {
	if s == "" {
		return
	}
	_, _ = io.WriteString(p.streams.Out, s)
	p.outOpen = s[len(s)-1] != '\n'
}

// NewCommand returns `kubectl warmpool` with its subcommands.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	p := &plugin{flags: genericclioptions.NewConfigFlags(true), streams: streams, now: time.Now}
	cmd := &cobra.Command{
		Use:   "kubectl-warmpool",
		Short: "Run code in warm gVisor sandboxes and watch warmpool's pools",
		Long: "kubectl warmpool runs code in a SandboxPool's warm sandboxes (through a Session when the\n" +
			"data plane is installed, else as an Execution) and shows pools, Sessions and Executions.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl warmpool"},
	}
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)
	cmd.SetIn(streams.In)
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return flagError{err} })
	p.flags.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(p.runCommand(), p.topCommand(), p.sessionsCommand(), p.cancelCommand(), p.logsCommand(), p.versionCommand())
	return cmd
}

// args wraps a cobra argument check so that its error is a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return flagError{err}
		}
		return nil
	}
}

func (p *plugin) restConfig() (*rest.Config, error) {
	cfg, err := p.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// client is a controller-runtime client for warmpool's and core kinds.
func (p *plugin) client() (client.WithWatch, error) {
	cfg, err := p.restConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Log: logr.New(crlog.NullLogSink{})})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return c, nil
}

// namespace is -n, else the kubeconfig context's namespace, else "default".
func (p *plugin) namespace() (string, error) {
	ns, _, err := p.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("namespace: %w", err)
	}
	return ns, nil
}

// scoped is a client and the namespace the command works in.
func (p *plugin) scoped() (client.WithWatch, string, error) {
	c, err := p.client()
	if err != nil {
		return nil, "", err
	}
	ns, err := p.namespace()
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}

// list fills list with the objects of the namespace, or of every namespace
// with -A (the API server returns them by namespace and name), and says so
// on stderr when there are none, as kubectl get does.
func (p *plugin) list(ctx context.Context, all bool, list client.ObjectList, what string) (client.Client, bool, error) {
	c, ns, err := p.scoped()
	if err != nil {
		return nil, false, err
	}
	var opts []client.ListOption
	if !all {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return nil, false, fmt.Errorf("list %s: %w", what, err)
	}
	if meta.LenList(list) == 0 {
		fmt.Fprintf(p.streams.ErrOut, "No %s found.\n", what)
		return c, false, nil
	}
	return c, true, nil
}

// table starts a kubectl-like table; with -A its first column is NAMESPACE.
func (p *plugin) table(all bool, header string) *tabwriter.Writer {
	w := printers.GetNewTabWriter(p.streams.Out)
	if all {
		header = "NAMESPACE\t" + header
	}
	fmt.Fprintln(w, header)
	return w
}

// age prints a time like kubectl's AGE column.
func (p *plugin) age(t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(p.now().Sub(t))
}

func writeLine(w io.Writer, s string) {
	if s == "" {
		return
	}
	if s[len(s)-1] != '\n' {
		s += "\n"
	}
	_, _ = io.WriteString(w, s)
}
