package kubectlplugin

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func (p *plugin) cancelCommand() *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "cancel EXECUTION...",
		Short: "Cancel Executions: a waiting one never runs, a running one is interrupted",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, ns, err := p.scoped()
			if err != nil {
				return err
			}
			for _, name := range names {
				ex := &sandboxv1alpha1.Execution{}
				ex.Namespace, ex.Name = ns, name
				if err := setCancel(cmd.Context(), c, ex); err != nil {
					return fmt.Errorf("cancel Execution %s: %w", name, err)
				}
				fmt.Fprintf(p.streams.Out, "execution.sandbox.warmpool.dev/%s cancel requested\n", name)
			}
			if !wait {
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			for _, name := range names {
				done, err := waitFinished(ctx, c, client.ObjectKey{Namespace: ns, Name: name})
				if err != nil {
					return fmt.Errorf("wait for Execution %s: %w", name, err)
				}
				fmt.Fprintf(p.streams.Out, "execution.sandbox.warmpool.dev/%s %s\n", name, done.Status.Phase)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the Executions have ended")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long --wait waits")
	return cmd
}

func (p *plugin) logsCommand() *cobra.Command {
	var follow, exitCode bool
	cmd := &cobra.Command{
		Use:   "logs EXECUTION",
		Short: "Print a finished Execution's stdout and stderr (and its result and error)",
		Long: `Print what a finished Execution's code wrote: stdout to stdout, stderr to stderr, then its
result, or its error. -f waits for an unfinished Execution to end. --exit-code exits with
the code run would have (0 succeeded, 1 the code failed, 3 timed out, 4 cancelled,
5 sandbox lost, 6 other).`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, ns, err := p.scoped()
			if err != nil {
				return err
			}
			key := client.ObjectKey{Namespace: ns, Name: names[0]}
			ex := &sandboxv1alpha1.Execution{}
			if err := c.Get(cmd.Context(), key, ex); err != nil {
				return fmt.Errorf("get Execution %s: %w", names[0], err)
			}
			if !ex.Status.Phase.IsFinished() {
				if !follow {
					phase := ex.Status.Phase
					if phase == "" {
						phase = sandboxv1alpha1.PhasePending
					}
					return fmt.Errorf("execution %s is %s: its output is written when it ends (-f waits)", ex.Name, phase)
				}
				if ex, err = waitFinished(cmd.Context(), c, key); err != nil {
					return fmt.Errorf("wait for Execution %s: %w", names[0], err)
				}
			}
			err = p.printExecution(ex)
			if !exitCode {
				return nil
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "wait for the Execution to end")
	cmd.Flags().BoolVar(&exitCode, "exit-code", false, "exit with the Execution's outcome, as run does")
	return cmd
}
