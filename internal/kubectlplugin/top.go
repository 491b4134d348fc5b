package kubectlplugin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
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
message follows the table on stderr (-o wide: in a MESSAGE column). -o wide adds NODES: how
the pool's live pods are spread over nodes, the most loaded first ("node-a=3,node-b=2",
"<pending>" for pods not scheduled yet, "+N" for N more nodes; spec.nodeSpread sets the spread).`,
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
	c, found, err := p.list(cmd.Context(), all, pools, "SandboxPools")
	if !found {
		return err
	}
	if output == outputJSON || output == outputYAML {
		return p.printObject(pools, "SandboxPool", output)
	}
	header := "NAME\tREPLICAS\tIDLE\tBUSY\tWARMING\tWAITING\tWARM-HIT\tSTARTUP\tROLLOUT\tSTATUS\tAGE"
	var spread map[types.NamespacedName]string
	if output == outputWide {
		header += "\tMAX-PODS\tAGENTS\tNODES\tMESSAGE"
		if spread, err = podsPerNode(cmd.Context(), c, all, pools.Items); apierrors.IsForbidden(err) {
			// A user who may read pools but not pods still gets the rest.
			fmt.Fprintf(p.streams.ErrOut, "NODES unknown: %v\n", err)
		} else if err != nil {
			return err
		}
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
			nodes := spread[types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}]
			if nodes == "" {
				nodes = "-"
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", maxPods, agents(st.Agents), nodes, msg)
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

// maxNodesShown bounds the NODES column: the busiest nodes, then how many more.
const maxNodesShown = 4

// podsPerNode is the NODES column of each pool: how many of its live pods
// each node runs, the most loaded first ("node-a=3,node-b=2,+5"), pods the
// scheduler has not placed as "<pending>": one list of the pools' pods.
func podsPerNode(ctx context.Context, c client.Client, all bool, pools []sandboxv1alpha1.SandboxPool) (map[types.NamespacedName]string, error) {
	opts := []client.ListOption{client.HasLabels{sandboxpod.LabelPool}}
	if !all && len(pools) > 0 {
		opts = append(opts, client.InNamespace(pools[0].Namespace))
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, opts...); err != nil {
		return nil, fmt.Errorf("list the pools' pods: %w", err)
	}
	counts := map[types.NamespacedName]map[string]int{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Labels[sandboxpod.LabelPool]}
		if counts[key] == nil {
			counts[key] = map[string]int{}
		}
		node := p.Spec.NodeName
		if node == "" {
			node = "<pending>"
		}
		counts[key][node]++
	}
	out := map[types.NamespacedName]string{}
	for key, perNode := range counts {
		type nodeCount struct {
			node string
			n    int
		}
		var list []nodeCount
		for node, n := range perNode {
			list = append(list, nodeCount{node, n})
		}
		slices.SortFunc(list, func(a, b nodeCount) int { return cmp.Or(b.n-a.n, strings.Compare(a.node, b.node)) })
		var parts []string
		for i, nc := range list {
			if i == maxNodesShown {
				parts = append(parts, fmt.Sprintf("+%d", len(list)-maxNodesShown))
				break
			}
			parts = append(parts, fmt.Sprintf("%s=%d", nc.node, nc.n))
		}
		out[key] = strings.Join(parts, ",")
	}
	return out, nil
}
