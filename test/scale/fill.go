package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// steadyWindow is how long the manager is watched once every pool is full.
const steadyWindow = 30 * time.Second

// createPools creates n pools of size, each in a namespace of its own (a
// tenant each), 32 at a time.
func createPools(ctx context.Context, c client.Client, prefix string, n, size int, reuse ...sandboxv1alpha1.ReusePolicy) error {
	return parallel(n, func(i int) error {
		ns := fmt.Sprintf("%s-%04d", prefix, i)
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
			return err
		}
		pool := wrappers.Pool(ns, "python").Replicas(int32(size))
		if len(reuse) > 0 && reuse[0] != "" {
			// A reused pod comes back to the pool: no more pods than the warm ones.
			pool.Reuse(reuse[0]).MaxPods(int32(size))
		}
		return c.Create(ctx, pool.Obj())
	})
}

// poolsFull waits until every pool reports size idle pods.
func poolsFull(ctx context.Context, c client.Client, n, size int, timeout time.Duration) error {
	var pr progress
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var pools sandboxv1alpha1.SandboxPoolList
		if err := c.List(ctx, &pools); err != nil {
			return false, nil
		}
		full, idle := 0, int32(0)
		for _, p := range pools.Items {
			idle += p.Status.IdleReplicas
			if int(p.Status.IdleReplicas) >= size {
				full++
			}
		}
		pr.say("%d of %d pools full, %d of %d pods idle", full, n, idle, n*size)
		return full >= n, nil
	})
}

// fill: many pools of a few warm pods each, filled from nothing; then the
// manager holding them all, idle.
func fill(ctx context.Context, e *env) (*report, error) {
	o := e.o
	rep := newReport("fill")
	rep.param("nodes", o.nodes)
	rep.param("pools", o.pools)
	rep.param("warm pods per pool", o.poolSize)
	m, c, _, err := e.managerAndClient()
	if err != nil {
		return nil, err
	}
	defer m.stop(10 * time.Second)
	before, err := m.scrape()
	if err != nil {
		return nil, err
	}
	u0, _ := procUsage(m.cmd.Process.Pid)
	cpu0 := processCPU()
	t0 := time.Now()
	go e.profiles(ctx, m, "fill", 30)
	if err := createPools(ctx, c, "tenant", o.pools, o.poolSize); err != nil {
		return nil, fmt.Errorf("create the pools: %w", err)
	}
	created := time.Since(t0)
	if err := poolsFull(ctx, c, o.pools, o.poolSize, 30*time.Minute); err != nil {
		return nil, fmt.Errorf("the pools did not fill: %w", err)
	}
	filled := time.Since(t0)
	u1, _ := procUsage(m.cmd.Process.Pid)
	cpu1 := processCPU()
	mid, err := m.scrape()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "scale: %d pools of %d filled in %s\n", o.pools, o.poolSize, filled.Round(time.Millisecond))
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(steadyWindow):
	}
	u2, _ := procUsage(m.cmd.Process.Pid)
	after, err := m.scrape()
	if err != nil {
		return nil, err
	}
	e.profiles(ctx, m, "steady", 0)
	pods := float64(o.pools * o.poolSize)
	rep.Values["fill_seconds"] = filled.Seconds()
	rep.Values["create_seconds"] = created.Seconds()
	rep.Values["manager_rss_bytes"] = float64(u2.rss)
	rep.Values["manager_peak_rss_bytes"] = float64(u2.hwm)
	rep.Values["fill_cpu_cores"] = (u1.cpu - u0.cpu).Seconds() / filled.Seconds()
	rep.Values["steady_cpu_cores"] = (u2.cpu - u1.cpu).Seconds() / steadyWindow.Seconds()
	rep.Values["heap_inuse_bytes"] = after.sum("go_memstats_heap_inuse_bytes")
	rep.Tables = append(rep.Tables, table{
		Title:  fmt.Sprintf("%d pools × %d warm pods (%0.f pods) on %d nodes, from nothing", o.pools, o.poolSize, pods, o.nodes),
		Header: []string{"pools created", "all pods idle (time to fill)", "manager CPU while filling (cores)", "manager CPU idle after (cores)", "RSS after", "peak RSS", "Go heap in use"},
		Rows: [][]string{{created.Round(time.Millisecond).String(), filled.Round(time.Millisecond).String(),
			fmt.Sprintf("%.2f", rep.Values["fill_cpu_cores"]), fmt.Sprintf("%.3f", rep.Values["steady_cpu_cores"]),
			mib(u2.rss), mib(u2.hwm), mib(int64(rep.Values["heap_inuse_bytes"]))}},
	})
	rep.Tables = append(rep.Tables, cpuTable("CPU by process while filling (the machine has 2 cores)", cpu0, cpu1, filled.Seconds()))
	rep.Tables = append(rep.Tables, apiTable("The manager's requests to kube-apiserver while filling", apiRequests(before, mid), filled.Seconds(), pods, "per pod"))
	rep.Tables = append(rep.Tables, apiTable(fmt.Sprintf("… and in the %s after, every pool full and nothing asked", steadyWindow), apiRequests(mid, after), steadyWindow.Seconds(), pods, "per pod"))
	return rep, nil
}
