package kubectlplugin

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func (p *plugin) topCommand() *cobra.Command {
	var all bool
	var output string
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show SandboxPools: pods by state, waiting Executions, warm hits and start-up time",
		Long: `Show the SandboxPools of the namespace (or all, with -A): the pods they keep (REPLICAS
wanted idle; IDLE, BUSY and WARMING now), the Executions WAITING for a pod, WARM-HIT (the
share of the last minute's claims served by a pod that was already Ready) and STARTUP (how
long the pool's pods take from creation to Ready, the recent ones' moving mean plus their
mean deviation), from the pools' status; "-" before there were claims in the last minute
or a pod became Ready. ROLLOUT says how far the pool is in replacing its pods after a change
of its template: "done", the unclaimed pods of the new template out of all ("3/5") while older
ones still serve, or "stalled" when the new pods do not start (why follows on stderr). STATUS is the reason of the pool's Ready condition (IdleReplicasReady,
PodsStarting, Unschedulable, ImagePullBackOff, ResourceQuota, ...); for a pool held back, its
message follows the table on stderr (-o wide: in a MESSAGE column).`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			return p.top(cmd, all, output)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "pools of every namespace")
	addOutputFlag(cmd, &output)
	return cmd
}

func (p *plugin) top(cmd *cobra.Command, all bool, output string) error {
	pools := &sandboxv1alpha1.SandboxPoolList{}
	_, found, err := p.list(cmd.Context(), all, pools, "SandboxPools")
	if !found {
		return err
	}
	if output == outputJSON || output == outputYAML {
		return p.printObject(pools, "SandboxPool", output)
	}
	header := "NAME\tREPLICAS\tIDLE\tBUSY\tWARMING\tWAITING\tWARM-HIT\tSTARTUP\tROLLOUT\tSTATUS\tAGE"
	if output == outputWide {
		header += "\tMAX-PODS\tAGENTS\tMESSAGE"
	}
	w := p.table(all, header)
	var notes []string
	for i := range pools.Items {
		pool := &pools.Items[i]
		st := pool.Status
		warmHit, startup := percent(st.WarmHitRatio), seconds(st.StartupSeconds)
		status, msg, held := poolStatus(pool)
		ro, stalled := rollout(pool)
		if all {
			fmt.Fprintf(w, "%s\t", pool.Namespace)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s", pool.Name, pool.Spec.Replicas, st.IdleReplicas, st.BusyReplicas,
			max(st.Replicas-st.IdleReplicas, 0), st.PendingExecutions, warmHit, startup, ro, status, p.age(pool.CreationTimestamp.Time))
		if output == outputWide {
			maxPods := "-"
			if pool.Spec.MaxPods != nil {
				maxPods = strconv.Itoa(int(*pool.Spec.MaxPods))
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s", maxPods, agents(st.Agents), msg)
		} else if held {
			notes = append(notes, fmt.Sprintf("%s/%s: %s: %s", pool.Namespace, pool.Name, status, msg))
		}
		if stalled != "" {
			notes = append(notes, fmt.Sprintf("%s/%s: %s: %s", pool.Namespace, pool.Name, sandboxv1alpha1.ReasonRolloutStalled, stalled))
		}
		fmt.Fprintln(w)
	}
	_ = w.Flush()
	for _, n := range notes {
		fmt.Fprintln(p.streams.ErrOut, n)
	}
	return nil
}

// poolStatus is the reason and message of the pool's Ready condition, and
// whether something holds the pool back (not Ready for another reason than
// pods that are starting).
func poolStatus(pool *sandboxv1alpha1.SandboxPool) (reason, message string, held bool) {
	c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionReady)
	if c == nil {
		return "-", "", false
	}
	return c.Reason, c.Message, c.Status != metav1.ConditionTrue && c.Reason != sandboxv1alpha1.ReasonPodsStarting
}

// rollout is the pool's ROLLOUT column, and the message of a stalled rollout.
func rollout(pool *sandboxv1alpha1.SandboxPool) (column, stalled string) {
	c := meta.FindStatusCondition(pool.Status.Conditions, sandboxv1alpha1.PoolConditionProgressing)
	switch {
	case c == nil:
		return "-", ""
	case c.Reason == sandboxv1alpha1.ReasonRolloutComplete:
		return "done", ""
	case c.Reason == sandboxv1alpha1.ReasonRolloutStalled:
		return "stalled", c.Message
	}
	return fmt.Sprintf("%d/%d", pool.Status.UpdatedReplicas, pool.Status.Replicas), ""
}

// agents prints the pool's agent builds as "v0.3.0x4,v0.2.0x1" (an
// unsupported one marked "!"), "-" before any answered.
func agents(counts []sandboxv1alpha1.AgentVersionCount) string {
	if len(counts) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, a := range counts {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%sx%d", a.Build, a.Replicas)
		if !a.Supported {
			b.WriteByte('!')
		}
	}
	return b.String()
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
