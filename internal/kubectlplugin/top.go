package kubectlplugin

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
)

const mergePatch = types.MergePatchType

func (p *plugin) topCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show SandboxPools: pods by state, waiting Executions, warm hits and start-up time",
		Long: `Show the SandboxPools of the namespace (or all, with -A): the pods they keep (REPLICAS
wanted idle; IDLE, BUSY and WARMING now), the Executions WAITING for a pod, WARM-HIT (the
share of the last minute's claims served by a pod that was already Ready) and STARTUP (how
long the pool's pods take from creation to Ready).

Autoscaled pools report both figures in their status. For other pools WARM-HIT is "-" (the
manager's metric warmpool_pool_warm_hit_ratio has it) and STARTUP is the median over the
pool's current Ready pods, when you may list pods.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return p.top(cmd, all) },
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "pools of every namespace")
	return cmd
}

func (p *plugin) top(cmd *cobra.Command, all bool) error {
	pools := &sandboxv1alpha1.SandboxPoolList{}
	c, found, err := p.list(cmd.Context(), all, pools, "SandboxPools")
	if !found {
		return err
	}
	w := p.table(all, "NAME\tREPLICAS\tIDLE\tBUSY\tWARMING\tWAITING\tWARM-HIT\tSTARTUP\tAGE")
	defer w.Flush()
	for i := range pools.Items {
		pool := &pools.Items[i]
		st := pool.Status
		warmHit, startup := "-", "-"
		if a := st.Autoscaling; a != nil {
			warmHit = percent(a.WarmHitRatio)
			startup = seconds(a.StartupSeconds)
		} else if d, ok := p.medianStartup(cmd, c, pool); ok {
			startup = d.Round(100 * time.Millisecond).String()
		}
		if all {
			fmt.Fprintf(w, "%s\t", pool.Namespace)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", pool.Name, pool.Spec.Replicas, st.IdleReplicas, st.BusyReplicas,
			max(st.Replicas-st.IdleReplicas, 0), st.PendingExecutions, warmHit, startup, p.age(pool.CreationTimestamp.Time))
	}
	return nil
}

// medianStartup is the median creation-to-Ready time of the pool's Ready pods.
func (p *plugin) medianStartup(cmd *cobra.Command, c client.Client, pool *sandboxv1alpha1.SandboxPool) (time.Duration, bool) {
	pods := &corev1.PodList{}
	if err := c.List(cmd.Context(), pods, client.InNamespace(pool.Namespace), client.MatchingLabels{sandboxpod.LabelPool: pool.Name}); err != nil {
		return 0, false // not allowed to list pods: leave it out
	}
	var ds []time.Duration
	for _, pod := range pods.Items {
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ds = append(ds, cond.LastTransitionTime.Sub(pod.CreationTimestamp.Time))
			}
		}
	}
	if len(ds) == 0 {
		return 0, false
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], true
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
