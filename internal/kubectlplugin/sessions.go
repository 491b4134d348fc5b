package kubectlplugin

import (
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func (p *plugin) sessionsCommand() *cobra.Command {
	var all bool
	list := func(cmd *cobra.Command, _ []string) error { return p.listSessions(cmd, all) }
	cmd := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session"},
		Short:   "List Sessions, or close them",
		Args:    args(cobra.NoArgs),
		RunE:    list,
	}
	cmd.PersistentFlags().BoolVarP(&all, "all-namespaces", "A", false, "Sessions of every namespace")
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List Sessions: pool, phase, pod, runs, last activity",
		Args:  args(cobra.NoArgs),
		RunE:  list,
	}, &cobra.Command{
		Use:   "close NAME...",
		Short: "Close Sessions (spec.close): their pods go back to their pools",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE:  p.closeSessions,
	})
	return cmd
}

func (p *plugin) listSessions(cmd *cobra.Command, all bool) error {
	list := &sandboxv1alpha1.SessionList{}
	if _, found, err := p.list(cmd.Context(), all, list, "Sessions"); !found {
		return err
	}
	w := p.table(all, "NAME\tPOOL\tPHASE\tPOD\tRUNS\tLAST-ACTIVITY\tAGE")
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, s.Spec.PoolRef.Name, phase, pod, s.Status.Runs, last, p.age(s.CreationTimestamp.Time))
	}
	return nil
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
