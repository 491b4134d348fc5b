package kubectlplugin

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func (p *plugin) sessionsCommand() *cobra.Command {
	var all bool
	var output string
	list := func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		return p.listSessions(cmd, all, output)
	}
	cmd := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session"},
		Short:   "List Sessions, or close them",
		Args:    args(cobra.NoArgs),
		RunE:    list,
	}
	cmd.PersistentFlags().BoolVarP(&all, "all-namespaces", "A", false, "Sessions of every namespace")
	addOutputFlag(cmd, &output)
	listCmd := &cobra.Command{
		Use:   "list",
		Short: "List Sessions: pool, phase, pod, runs, last activity",
		Args:  args(cobra.NoArgs),
		RunE:  list,
	}
	addOutputFlag(listCmd, &output)
	cmd.AddCommand(listCmd, &cobra.Command{
		Use:   "close NAME...",
		Short: "Close Sessions (spec.close): their pods go back to their pools",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE:  p.closeSessions,
	}, p.snapshotCommand(), p.restoreCommand(), p.forkCommand())
	return cmd
}

func (p *plugin) listSessions(cmd *cobra.Command, all bool, output string) error {
	list := &sandboxv1alpha1.SessionList{}
	if _, found, err := p.list(cmd.Context(), all, list, "Sessions"); !found {
		return err
	}
	if output == outputJSON || output == outputYAML {
		return p.printObject(list, "Session", output)
	}
	header := "NAME\tPOOL\tPHASE\tPOD\tRUNS\tLAST-ACTIVITY\tAGE"
	if output == outputWide {
		header += "\tIDLE-TIMEOUT\tOWNER\tACCESS\tREASON"
	}
	w := p.table(all, header)
	defer w.Flush()
	for _, s := range list.Items {
		if all {
			fmt.Fprintf(w, "%s\t", s.Namespace)
		}
		phase, pod, last := string(s.Status.Phase), s.Status.PodName, "-"
		if phase == "" {
			phase = string(sandboxv1alpha1.SessionPending)
		}
		if pod == "" {
			pod = "-"
		}
		if s.Status.LastActivityTime != nil {
			last = p.age(s.Status.LastActivityTime.Time)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s", s.Name, s.Spec.PoolRef.String(), phase, pod, s.Status.Runs, last, p.age(s.CreationTimestamp.Time))
		if output == outputWide {
			idle, owner, access, reason := "pool's", dash(s.Spec.Owner), dash(string(s.Spec.Access)), "-"
			if s.Spec.IdleTimeout != nil {
				idle = s.Spec.IdleTimeout.Duration.String()
			}
			if c := meta.FindStatusCondition(s.Status.Conditions, sandboxv1alpha1.SessionConditionReady); c != nil {
				reason = c.Reason
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", idle, owner, access, reason)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (p *plugin) closeSessions(cmd *cobra.Command, names []string) error {
	c, ns, err := p.scoped()
	if err != nil {
		return err
	}
	for _, name := range names {
		s := &sandboxv1alpha1.Session{}
		s.Namespace, s.Name = ns, name
		if err := c.Patch(cmd.Context(), s, client.RawPatch(mergePatch, []byte(`{"spec":{"close":true}}`))); err != nil {
			return fmt.Errorf("close Session %s: %w", name, err)
		}
		fmt.Fprintf(p.streams.Out, "session.sandbox.warmpool.dev/%s closed\n", name)
	}
	return nil
}
