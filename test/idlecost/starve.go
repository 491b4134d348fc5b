package main

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/sandboxpod"
)

// burners starts n busy loops on the node (processes of their own, stopped
// by PID): other tenants' pods using the CPU.
func burners(n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// watchdog counts, while it runs, the pool's pods that went from Ready to
// not Ready (a warm pod that flapped cannot be leased), and reads the
// manager's restarts and leader changes at the start and the end.
type watchdog struct {
	c      client.Client
	ns     string
	flaps  map[string]int
	mu     sync.Mutex
	before managerState
}

type managerState struct {
	restarts    int32
	transitions int32
}

func (w *watchdog) manager(ctx context.Context) managerState {
	var st managerState
	var pods corev1.PodList
	if err := w.c.List(ctx, &pods, client.InNamespace("warmpool-system")); err == nil {
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				st.restarts += cs.RestartCount
			}
		}
	}
	lease := &coordinationv1.Lease{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: "manager.warmpool.dev"}, lease); err == nil && lease.Spec.LeaseTransitions != nil {
		st.transitions = *lease.Spec.LeaseTransitions
	}
	return st
}

// run polls every second until ctx ends.
func (w *watchdog) run(ctx context.Context) {
	ready := map[string]bool{}
	for {
		var pods corev1.PodList
		if err := w.c.List(ctx, &pods, client.InNamespace(w.ns)); err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				now := sandboxpod.IsReady(p)
				if was, seen := ready[p.Name]; seen && was && !now {
					w.mu.Lock()
					w.flaps[p.Name]++
					w.mu.Unlock()
				}
				ready[p.Name] = now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (w *watchdog) report(ctx context.Context) {
	after := w.manager(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	total := 0
	for _, n := range w.flaps {
		total += n
	}
	fmt.Printf("\nunder the burners: %d warm pods went from Ready to not Ready (%d times); manager container restarts %d, leader changes %d\n",
		len(w.flaps), total, after.restarts-w.before.restarts, after.transitions-w.before.transitions)
}
