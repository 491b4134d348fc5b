package kubectlplugin

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func (p *plugin) topCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show SandboxPools: pods by state, waiting Executions, warm hits and start-up time",
		Long: `Show the SandboxPools of the namespace (or all, with -A): the pods they keep (REPLICAS
wanted idle; IDLE, BUSY and WARMING now), the Executions WAITING for a pod, WARM-HIT (the
share of the last minute's claims served by a pod that was already Ready) and STARTUP (how
long the pool's pods take from creation to Ready, the recent ones' moving mean plus their
mean deviation), from the pools' status; "-" before there were claims in the last minute
or a pod became Ready.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return p.top(cmd, all) },
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "pools of every namespace")
	return cmd
}

func (p *plugin) top(cmd *cobra.Command, all bool) error {
	pools := &sandboxv1alpha1.SandboxPoolList{}
	_, found, err := p.list(cmd.Context(), all, pools, "SandboxPools")
	if !found {
		return err
	}
	w := p.table(all, "NAME\tREPLICAS\tIDLE\tBUSY\tWARMING\tWAITING\tWARM-HIT\tSTARTUP\tAGE")
	defer w.Flush()
	for i := range pools.Items {
		pool := &pools.Items[i]
		st := pool.Status
		warmHit, startup := percent(st.WarmHitRatio), seconds(st.StartupSeconds)
		if all {
			fmt.Fprintf(w, "%s\t", pool.Namespace)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", pool.Name, pool.Spec.Replicas, st.IdleReplicas, st.BusyReplicas,
			max(st.Replicas-st.IdleReplicas, 0), st.PendingExecutions, warmHit, startup, p.age(pool.CreationTimestamp.Time))
	}
	return nil
}

// percent prints a ratio such as "0.985" as "98.5%".
func percent(ratio string) string {
	f, err := strconv.ParseFloat(ratio, 64)
	if err != nil {
		return "-"
	}
	return strconv.FormatFloat(f*100, 'f', 1, 64) + "%"
}

// seconds prints "2.52" as "2.52s".
func seconds(s string) string {
	if _, err := strconv.ParseFloat(s, 64); err != nil {
		return "-"
	}
	return s + "s"
}
