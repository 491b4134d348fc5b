package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// nodeloss: thousands of warm pods and Ready Sessions over o.nodes nodes;
// o.lostNodes of them stop answering at once. kwok stops playing their
// kubelets, and the scenario writes what the node lifecycle controller
// (not run here) writes after its grace period: Ready Unknown and the
// unreachable taint. Measured: how long until each Session there is told
// (Lost, NodeLost, the node named), that no other Session is touched, and
// that new Sessions keep being served, never on a lost node.
func nodeloss(ctx context.Context, e *env) (*report, error) {
	o := e.o
	rep := newReport("nodeloss")
	rep.param("nodes", o.nodes)
	rep.param("nodes lost at once", o.lostNodes)
	rep.param("warm pods", o.warm)
	rep.param("Ready Sessions", o.sessions)
	rep.param("pools", failoverPools)
	m, c, cfg, err := e.managerAndClient()
	if err != nil {
		return nil, err
	}
	defer m.stop(10 * time.Second)
	per := o.warm / failoverPools
	t0 := time.Now()
	if err := createPools(ctx, c, "nl", failoverPools, per); err != nil {
		return nil, err
	}
	if err := poolsFull(ctx, c, failoverPools, per, 30*time.Minute); err != nil {
		return nil, fmt.Errorf("the pools did not fill: %w", err)
	}
	fmt.Fprintf(os.Stderr, "scale: %d warm pods in %s\n", o.warm, time.Since(t0).Round(time.Millisecond))
	sw, err := e.watchSessions(ctx, cfg, "")
	if err != nil {
		return nil, err
	}
	defer sw.stop()
	if err := createReadySessions(ctx, c, sw, "nl", o.sessions, o.seed); err != nil {
		return nil, err
	}
	var pr progress

	// Where each Ready Session runs.
	onNode, err := sessionNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	nodes := make([]string, 0, len(onNode))
	for n := range onNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	if len(nodes) < o.lostNodes {
		return nil, fmt.Errorf("the Sessions are on %d nodes, fewer than the %d to lose", len(nodes), o.lostNodes)
	}
	lost := nodes[:o.lostNodes]
	doomed := map[string]string{} // Session -> its node
	for _, n := range lost {
		for _, s := range onNode[n] {
			doomed[s] = n
		}
	}
	fmt.Fprintf(os.Stderr, "scale: losing %d nodes with %d of %d Sessions on them\n", len(lost), len(doomed), o.sessions)

	tl := time.Now()
	markedAt := map[string]time.Time{}
	for _, n := range lost {
		if err := loseNode(ctx, c, n); err != nil {
			return nil, err
		}
		markedAt[n] = time.Now()
	}
	marking := time.Since(tl)
	var told []time.Duration
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		told = told[:0]
		for s, n := range doomed {
			if t, ok := sw.lostAt[s]; ok {
				told = append(told, t.Sub(markedAt[n]))
			}
		}
		pr.say("%d of %d Sessions on the lost nodes told", len(told), len(doomed))
		return len(told) == len(doomed), nil
	}); err != nil {
		return nil, fmt.Errorf("%d of %d Sessions on the lost nodes were told: %w", len(told), len(doomed), err)
	}
	sort.Slice(told, func(i, j int) bool { return told[i] < told[j] })

	// What they were told, and that nothing else was lost.
	var problems []string
	var sessions sandboxv1alpha1.SessionList
	if err := c.List(ctx, &sessions); err != nil {
		return nil, err
	}
	for _, s := range sessions.Items {
		key := s.Namespace + "/" + s.Name
		n, wasThere := doomed[key]
		ready := readyCondition(&s)
		switch {
		case wasThere && (s.Status.Phase != sandboxv1alpha1.SessionLost || ready == nil || ready.Reason != sandboxv1alpha1.ReasonNodeLost ||
			!strings.Contains(ready.Message, "node "+n+" stopped answering")):
			problems = append(problems, fmt.Sprintf("%s on lost node %s: %s %+v", key, n, s.Status.Phase, ready))
		case !wasThere && s.Status.Phase != sandboxv1alpha1.SessionReady:
			problems = append(problems, fmt.Sprintf("%s on a node that answers: %s", key, s.Status.Phase))
		}
	}

	// New Sessions are served meanwhile, never on a lost node.
	const probes = 50
	tp := time.Now()
	for i := range probes {
		if err := c.Create(ctx, wrappers.Session(fmt.Sprintf("nl-%04d", i%failoverPools), fmt.Sprintf("after-%03d", i)).Pool("python").Obj()); err != nil {
			return nil, fmt.Errorf("create a Session after the loss: %w", err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		r, _ := sw.count()
		return r >= o.sessions+probes, nil
	}); err != nil {
		return nil, fmt.Errorf("the Sessions created after the loss did not all get Ready: %w", err)
	}
	probesReady := time.Since(tp)
	after, err := sessionNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, n := range lost {
		for _, s := range after[n] {
			problems = append(problems, fmt.Sprintf("%s is Ready on lost node %s", s, n))
		}
	}

	rep.Tables = append(rep.Tables, table{
		Title:  fmt.Sprintf("%d of %d nodes stop answering with %d Ready Sessions (%d on them): node marked → Session seen Lost", len(lost), o.nodes, o.sessions, len(doomed)),
		Header: []string{"Sessions told", "p50", "p95", "max", "marking the nodes took"},
		Rows: [][]string{{fmt.Sprint(len(told)), percentile(told, 50).Round(time.Millisecond).String(), percentile(told, 95).Round(time.Millisecond).String(),
			told[len(told)-1].Round(time.Millisecond).String(), marking.Round(time.Millisecond).String()}},
	})
	rep.Values["nodeloss_told_p50_seconds"] = percentile(told, 50).Seconds()
	rep.Values["nodeloss_told_p95_seconds"] = percentile(told, 95).Seconds()
	rep.Values["problems"] = float64(len(problems))
	rep.note("%d new Sessions created after the loss were all Ready within %s, none on a lost node. Problems (a Session on a lost node not told NodeLost naming it, a Session elsewhere not Ready, a new one on a lost node): %d.",
		probes, probesReady.Round(time.Millisecond), len(problems))
	if len(problems) > 0 {
		sort.Strings(problems)
		return rep, fmt.Errorf("%d problems, first: %v", len(problems), problems[:min(5, len(problems))])
	}
	return rep, nil
}

// sessionNodes maps each node to the Ready Sessions whose pod runs there.
func sessionNodes(ctx context.Context, c client.Client) (map[string][]string, error) {
	var sessions sandboxv1alpha1.SessionList
	if err := c.List(ctx, &sessions); err != nil {
		return nil, err
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return nil, err
	}
	nodeOf := map[string]string{}
	for _, p := range pods.Items {
		nodeOf[p.Namespace+"/"+p.Name] = p.Spec.NodeName
	}
	out := map[string][]string{}
	for _, s := range sessions.Items {
		if s.Status.Phase == sandboxv1alpha1.SessionReady {
			if n := nodeOf[s.PodKey().String()]; n != "" {
				out[n] = append(out[n], s.Namespace+"/"+s.Name)
			}
		}
	}
	return out, nil
}

// loseNode takes a node from kwok (its kubelet goes silent) and marks it as
// the node lifecycle controller does once its grace period has passed.
func loseNode(ctx context.Context, c client.Client, name string) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return false, nil
		}
		if n.Annotations[kwokNodeAnnotation] != "lost" {
			n.Annotations[kwokNodeAnnotation] = "lost"
			if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeUnreachable }) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: time.Now()}})
			}
			if err := c.Update(ctx, n); err != nil {
				return false, nil // kwok wrote its status meanwhile
			}
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
					Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status.",
					LastHeartbeatTime: n.Status.Conditions[i].LastHeartbeatTime, LastTransitionTime: metav1.Now()}
			}
		}
		if err := c.Status().Update(ctx, n); err != nil {
			return false, nil
		}
		return true, nil
	})
}

// readyCondition is a Session's Ready condition.
func readyCondition(s *sandboxv1alpha1.Session) *metav1.Condition {
	for i := range s.Status.Conditions {
		if s.Status.Conditions[i].Type == sandboxv1alpha1.SessionConditionReady {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}
