// Command drainbench measures a drain of a node that holds live Sessions:
// -sessions Sessions, each with -state bytes of state, on node a, one of
// them in a -step long run; warm pods on node b. Node a is cordoned (what
// kubectl drain does first), and it reports how long until every Session
// that was on a is Ready on b with its state and every pod on a is gone
// (the drain could complete), and each moved Session's pause
// (status.lastMove.pauseMillis: from its snapshot to Ready on its new pod),
// p50, p95 and max.
//
// It runs on envtest with real agents and a real python3 per pod (the test
// kubelet), Node objects the pods are bound to as the scheduler binds them,
// and a real S3 store (SeaweedFS) on loopback; no gVisor.
//
//	go run ./test/drainbench -sessions 10 -state 1048576 -step 3s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/pkg/sessions"
)

type options struct {
	sessions, state int
	step            time.Duration
	verbose         bool
}

func main() {
	var o options
	flag.IntVar(&o.sessions, "sessions", 10, "Sessions on the drained node")
	flag.IntVar(&o.state, "state", 1<<20, "bytes of state of each Session (random, so incompressible)")
	flag.DurationVar(&o.step, "step", 3*time.Second, "the run under way in one of them when the node is cordoned")
	flag.BoolVar(&o.verbose, "v", false, "the manager's logs (V(1)) on stderr")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(o options) error {
	store, err := objectstore.Start()
	if err != nil {
		return err
	}
	defer store.Stop()
	var log logr.Logger
	if o.verbose {
		log = zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.Level(-1)))
	}
	s, err := stack.Start(stack.Options{Log: log, Configure: func(c *controller.Config) {
		c.Snapshots = &controller.Snapshots{Store: store.Config("drainbench", "warmpool/"), KeySecret: "drainbench-key"}
	}})
	if err != nil {
		return err
	}
	defer s.Stop()
	ctx := context.Background()
	k := s.Env.Client
	ns, err := s.Namespace(ctx, "drain-")
	if err != nil {
		return err
	}
	a, b := ns+"-a", ns+"-b"
	for _, n := range []string{a, b} {
		if err := readyNode(ctx, k, n); err != nil {
			return err
		}
	}
	if err := s.WarmPool(ctx, ns, "python", int32(2*o.sessions)); err != nil {
		return err
	}
	c, err := s.SessionsClient(ctx, ns, "bench")
	if err != nil {
		return err
	}
	var all []*sessions.Session
	for i := range o.sessions {
		ses, err := c.Create(ctx, ns, fmt.Sprintf("s-%d", i), "python", nil)
		if err != nil {
			return err
		}
		if _, err := ses.Run(ctx, sessions.ExecRequest{Code: fmt.Sprintf("import os\nblob = os.urandom(%d)\nx = %d", o.state, i)}); err != nil {
			return err
		}
		all = append(all, ses)
	}
	// The Sessions' pods on a, the idle ones on b, as a scheduler would have put them.
	held := map[string]bool{}
	for _, ses := range all {
		got := &sandboxv1alpha1.Session{}
		if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: ses.Name}, got); err != nil {
			return err
		}
		held[got.Status.PodName] = true
	}
	var pods corev1.PodList
	if err := k.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{sandboxpod.LabelPool: "python"}); err != nil {
		return err
	}
	for i := range pods.Items {
		node := b
		if held[pods.Items[i].Name] {
			node = a
		}
		if err := bind(ctx, k, &pods.Items[i], node); err != nil {
			return err
		}
	}

	// One step under way when the node is cordoned: the drain waits for it.
	stepDone := make(chan error, 1)
	go func() {
		_, err := all[0].Run(ctx, sessions.ExecRequest{Code: fmt.Sprintf("import time\ntime.sleep(%f)", o.step.Seconds())})
		stepDone <- err
	}()
	time.Sleep(200 * time.Millisecond)
	node := &corev1.Node{}
	if err := k.Get(ctx, client.ObjectKey{Name: a}, node); err != nil {
		return err
	}
	cordoned := node.DeepCopy()
	cordoned.Spec.Unschedulable = true
	start := time.Now()
	if err := k.Patch(ctx, cordoned, client.MergeFrom(node)); err != nil {
		return err
	}
	var pauses []time.Duration
	var drained time.Duration
	// Looked at every 50 ms, with one list: the bench must not load the
	// API server the moves go through.
	for deadline := time.Now().Add(5 * time.Minute); drained == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s not drained after 5 minutes", a)
		}
		pauses = pauses[:0]
		var list sandboxv1alpha1.SessionList
		if err := k.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, got := range list.Items {
			if mv := got.Status.LastMove; got.Status.Phase == sandboxv1alpha1.SessionReady && mv != nil && mv.EndTime != nil {
				pauses = append(pauses, time.Duration(mv.PauseMillis)*time.Millisecond)
			}
		}
		if len(pauses) < len(all) {
			continue
		}
		left, err := podsOn(ctx, k, ns, a)
		if err != nil {
			return err
		}
		if left == 0 {
			drained = time.Since(start)
		}
	}
	if err := <-stepDone; err != nil {
		return fmt.Errorf("the step under way: %w", err)
	}
	// Each state came along.
	var wg sync.WaitGroup
	errs := make(chan error, len(all))
	for i, ses := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := ses.Run(ctx, sessions.ExecRequest{Code: "(x, len(blob))"})
			want := fmt.Sprintf("(%d, %d)", i, o.state)
			if err != nil || res.Result == nil || *res.Result != want {
				errs <- fmt.Errorf("%s after the move: %v %v, want %s", ses.Name, res, err, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	slices.Sort(pauses)
	at := func(p float64) time.Duration { return pauses[min(len(pauses)-1, int(p*float64(len(pauses))))] }
	fmt.Printf("%d Sessions of %d bytes each on node %s, one in a %s step; warm pods on node %s; envtest, no gVisor\n\n",
		o.sessions, o.state, a, o.step, b)
	fmt.Println("| Sessions moved | pause p50 | p95 | max | cordon → every Session Ready elsewhere and no pod left on the node | of which the step |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	fmt.Printf("| %d | %s | %s | %s | %s | %s |\n", len(pauses), at(0.5), at(0.95), pauses[len(pauses)-1], drained.Round(10*time.Millisecond), o.step)
	return nil
}

// podsOn counts the pods on node that are not being deleted.
func podsOn(ctx context.Context, k client.Client, ns, node string) (int, error) {
	var pods corev1.PodList
	if err := k.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil && !sandboxpod.IsTerminal(&p) {
			n++
		}
	}
	return n, nil
}

// readyNode creates a Ready, untainted node (envtest runs no node controller).
func readyNode(ctx context.Context, k client.Client, name string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	if err := k.Create(ctx, n); err != nil {
		return err
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := k.Status().Update(ctx, n); err != nil {
		return err
	}
	// kube-apiserver taints a new node not-ready; the node lifecycle controller would lift it.
	for range 50 {
		if err := k.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return err
		}
		n.Spec.Taints = nil
		if err := k.Update(ctx, n); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("could not untaint node %s", name)
}

func bind(ctx context.Context, k client.Client, pod *corev1.Pod, node string) error {
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	return k.SubResource("binding").Create(ctx, pod, b)
}
