package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/lease"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// failoverPools is how many pools (each in a namespace of its own) the
// failover scenario spreads its warm pods and Sessions over.
const failoverPools = 10

// probeRate is how many new Sessions a second ask for a pod while the
// leader changes: the first one Ready after the change is when the new
// leader serves claims.
const probeRate = 10

// leads reports whether a manager holds the leader lock (its own metric).
func (m *manager) leads() bool {
	ms, err := m.scrape()
	return err == nil && ms.sum("leader_election_master_status", `name="manager.warmpool.dev"`) == 1
}

// failover: two managers, thousands of warm pods and Ready Sessions; the
// leader stops (SIGTERM: it hands the lock over) and later dies (SIGKILL:
// the lock expires); each time, how long until the other serves claims,
// and whether any lease was lost or doubled.
func failover(ctx context.Context, e *env) (*report, error) {
	o := e.o
	rep := newReport("failover")
	rep.param("nodes", o.nodes)
	rep.param("warm pods", o.warm)
	rep.param("Ready Sessions", o.sessions)
	rep.param("pools", failoverPools)
	rep.param("leader lease duration", "15s (the manager's default)")
	a, err := e.startManager("manager-a", true)
	if err != nil {
		return nil, err
	}
	defer func() { a.stop(10 * time.Second) }()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) { return a.leads(), nil }); err != nil {
		return nil, fmt.Errorf("manager-a did not lead: %w", err)
	}
	b, err := e.startManager("manager-b", true)
	if err != nil {
		return nil, err
	}
	defer func() { b.stop(10 * time.Second) }()
	c, cfg, err := e.client()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	per := o.warm / failoverPools
	if err := createPools(ctx, c, "fo", failoverPools, per); err != nil {
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
	t1 := time.Now()
	if err := createReadySessions(ctx, c, sw, "fo", o.sessions, o.seed); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "scale: %d Sessions Ready in %s\n", o.sessions, time.Since(t1).Round(time.Millisecond))

	// New Sessions keep coming while the leader changes.
	var probeMu sync.Mutex
	probes := map[string]time.Time{}
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		for i := 0; ; i++ {
			select {
			case <-probeCtx.Done():
				return
			case <-time.After(time.Second / probeRate):
			}
			key := fmt.Sprintf("fo-%04d/probe-%05d", i%failoverPools, i)
			probeMu.Lock()
			probes[key] = time.Now()
			probeMu.Unlock()
			go func() {
				_ = c.Create(ctx, wrappers.Session(fmt.Sprintf("fo-%04d", i%failoverPools), fmt.Sprintf("probe-%05d", i)).Pool("python").Obj())
			}()
		}
	}()
	// firstReadyAfter is when the first probe created after t was Ready.
	firstReadyAfter := func(t time.Time, timeout time.Duration) (time.Duration, error) {
		var got time.Duration
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
			probeMu.Lock()
			defer probeMu.Unlock()
			sw.mu.Lock()
			defer sw.mu.Unlock()
			for k, created := range probes {
				if r, ok := sw.ready[k]; ok && created.After(t) {
					got = r.Sub(t)
					return true, nil
				}
			}
			return false, nil
		})
		return got, err
	}
	// The probes are served by the first leader before it goes.
	if _, err := firstReadyAfter(time.Now().Add(-time.Hour), time.Minute); err != nil {
		return nil, fmt.Errorf("no new Session was Ready before the leader changed: %w", err)
	}
	rows := [][]string{}
	for _, kill := range []struct {
		name   string
		signal func(m *manager)
	}{
		{"SIGTERM (rolling update: the leader hands the lock over)", func(m *manager) { m.stop(30 * time.Second) }},
		{"SIGKILL (the leader's node dies: the lock expires)", func(m *manager) { _ = m.cmd.Process.Kill(); <-m.done }},
	} {
		leader, standby := a, b
		if !a.leads() {
			leader, standby = b, a
		}
		tk := time.Now()
		kill.signal(leader)
		var leadAfter time.Duration
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			leadAfter = time.Since(tk)
			return standby.leads(), nil
		}); err != nil {
			return nil, fmt.Errorf("the standby did not lead after %s: %w", kill.name, err)
		}
		served, err := firstReadyAfter(tk, 2*time.Minute)
		if err != nil {
			return nil, fmt.Errorf("no new Session was Ready after %s: %w", kill.name, err)
		}
		fmt.Fprintf(os.Stderr, "scale: %s: leads after %s, serves claims after %s\n", kill.name, leadAfter.Round(time.Millisecond), served.Round(time.Millisecond))
		rep.Values["takeover_"+kill.name[:7]+"_seconds"] = served.Seconds()
		u, _ := procUsage(standby.cmd.Process.Pid)
		rows = append(rows, []string{kill.name, leadAfter.Round(time.Millisecond).String(), served.Round(time.Millisecond).String(), mib(u.rss)})
		// The stopped manager comes back as the standby, as its Deployment would restart it.
		restarted, err := e.startManager(leader.name+"-again", true)
		if err != nil {
			return nil, err
		}
		if leader == a {
			a = restarted
		} else {
			b = restarted
		}
		// It is the standby of the next change. A standby tells nobody when
		// its caches are synced (its /readyz answers at once): it gets 5 s.
		// Were that short, the next takeover would include the sync, so the
		// number errs long, never short.
		time.Sleep(5 * time.Second)
	}
	stopProbes()
	<-probesDone
	rep.Tables = append(rep.Tables, table{
		Title:  fmt.Sprintf("The leader stops with %d warm pods and %d Ready Sessions; new Sessions arrive at %d/s", o.warm, o.sessions, probeRate),
		Header: []string{"how the leader goes", "standby leads after", "first new Session Ready after", "new leader's RSS"},
		Rows:   rows,
	})

	// Every Session gets Ready, and no pod serves two.
	probeMu.Lock()
	nProbes := len(probes)
	probeMu.Unlock()
	total := o.sessions + nProbes
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		r, l := sw.count()
		return r+l >= total, nil
	})
	problems, err := checkLeases(ctx, c)
	if err != nil {
		return nil, err
	}
	r, l := sw.count()
	rep.Values["lost"] = float64(l)
	rep.Values["lease_problems"] = float64(len(problems))
	rep.note("After both changes: %d of %d Sessions Ready, %d Lost; lease check (each Ready Session on a pod of its own that names it, no pod naming a Session that does not hold it): %d problems.", r, total, l, len(problems))
	if r < total || l > 0 || len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 5 {
			problems = problems[:5]
		}
		return rep, fmt.Errorf("%d of %d Sessions Ready, %d Lost, lease problems: %v", r, total, l, problems)
	}
	return rep, nil
}

// createReadySessions creates n Sessions over the pools prefix-0000 … (one
// in failoverPools each), 250 a second (Poisson, with two seconds to spare
// for the count to reach n), and waits until sw has seen them all Ready.
func createReadySessions(ctx context.Context, c client.Client, sw *sessionWatch, prefix string, n int, seed int64) error {
	at := arrivals(seed, 250, time.Duration(float64(n)/250*float64(time.Second))+2*time.Second)
	if len(at) < n {
		return fmt.Errorf("the arrivals came short of %d Sessions: try another -seed", n)
	}
	_, errs := offer(ctx, at[:n], func(ctx context.Context, i int) error {
		return c.Create(ctx, wrappers.Session(fmt.Sprintf("%s-%04d", prefix, i%failoverPools), fmt.Sprintf("s-%05d", i)).Pool("python").Obj())
	})
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("create a Session: %w", err)
		}
	}
	var pr progress
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		r, _ := sw.count()
		pr.say("%d of %d Sessions Ready", r, n)
		return r >= n, nil
	}); err != nil {
		return fmt.Errorf("%d Sessions did not get Ready: %w", n, err)
	}
	return nil
}

// checkLeases reads every Session and sandbox pod from the API server and
// lists what breaks exactly-one: two Sessions on one pod, a Ready Session
// whose pod does not name it, a pod that names a Session not on it.
func checkLeases(ctx context.Context, c client.Client) ([]string, error) {
	var sessions sandboxv1alpha1.SessionList
	if err := c.List(ctx, &sessions); err != nil {
		return nil, err
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.HasLabels{sandboxpod.LabelPool}); err != nil {
		return nil, err
	}
	podByKey := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		podByKey[p.Namespace+"/"+p.Name] = p
	}
	var problems []string
	holder := map[string]string{}
	for _, s := range sessions.Items {
		if s.Status.Phase != sandboxv1alpha1.SessionReady {
			continue
		}
		key := s.PodKey().String()
		if h, ok := holder[key]; ok {
			problems = append(problems, fmt.Sprintf("pod %s held by %s and %s/%s", key, h, s.Namespace, s.Name))
		}
		holder[key] = s.Namespace + "/" + s.Name
		p, ok := podByKey[key]
		if !ok {
			problems = append(problems, fmt.Sprintf("Session %s/%s is Ready on pod %s, which is gone", s.Namespace, s.Name, key))
			continue
		}
		if lease.Session(p) != s.Name {
			problems = append(problems, fmt.Sprintf("Session %s/%s is Ready on pod %s, which names %q", s.Namespace, s.Name, key, lease.Session(p)))
		}
	}
	for key, p := range podByKey {
		if n := lease.Session(p); n != "" && p.DeletionTimestamp == nil && holder[key] == "" {
			problems = append(problems, fmt.Sprintf("pod %s names Session %s, which does not hold it", key, n))
		}
	}
	return problems, nil
}
