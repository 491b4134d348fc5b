package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// work is what users do on the starved node: Sessions that run code without
// pause through the data plane, and Executions that arrive at a steady rate,
// on a pool of their own in a namespace of their own, so that the idle pool's
// pods stay idle and the watchdog's flaps are only theirs.
type work struct {
	c        client.Client
	sc       *sessions.Client
	ns       string
	sessions []*sessions.Session
	every    time.Duration // between two Executions; 0: none

	mu       sync.Mutex
	runs     int
	failed   []string
	latency  []time.Duration
	created  []string
	wg       sync.WaitGroup
	stopOnce sync.Once
	stop     chan struct{}
}

// startWork makes the work pool and its Sessions (each Ready before it
// returns), so that the window measures what the starved node does to them.
func startWork(ctx context.Context, c client.Client, cfg *rest.Config, image, runtimeClass string, nSessions, perMinute int) (*work, error) {
	sc, err := sessions.New(cfg)
	if err != nil {
		return nil, err
	}
	w := &work{c: c, sc: sc, ns: fmt.Sprintf("starve-work-%d", time.Now().Unix()), stop: make(chan struct{})}
	if perMinute > 0 {
		w.every = time.Minute / time.Duration(perMinute)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}); err != nil {
		return nil, err
	}
	// Warm pods for the Sessions, and two for the Executions, which delete
	// theirs after each run.
	replicas := int32(nSessions + 2)
	pool := &sandboxv1alpha1.SandboxPool{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "work"},
		Spec: sandboxv1alpha1.SandboxPoolSpec{Replicas: replicas, Image: image, RuntimeClassName: &runtimeClass}}
	if err := c.Create(ctx, pool); err != nil {
		return nil, err
	}
	for i := range nSessions {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		s, err := sc.Create(cctx, w.ns, fmt.Sprintf("s%d", i), "work", nil)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("session %d: %w", i, err)
		}
		if _, err := s.Run(ctx, sessions.ExecRequest{Code: "n = 0"}); err != nil {
			return nil, fmt.Errorf("session %d: first run: %w", i, err)
		}
		w.sessions = append(w.sessions, s)
	}
	return w, nil
}

// run starts the Sessions' loops and the Executions' arrivals; they go on
// until end.
func (w *work) run(ctx context.Context) {
	for _, s := range w.sessions {
		w.wg.Add(1)
		go w.session(ctx, s)
	}
	if w.every > 0 {
		w.wg.Add(1)
		go w.executions(ctx)
	}
}

func (w *work) session(ctx context.Context, s *sessions.Session) {
	defer w.wg.Done()
	for want := 1; ; want++ {
		select {
		case <-w.stop:
			return
		default:
		}
		start := time.Now()
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "n += 1\nn"})
		took := time.Since(start)
		w.mu.Lock()
		w.runs++
		switch {
		case err != nil:
			w.failed = append(w.failed, fmt.Sprintf("%s %s: %v", start.Format("15:04:05"), s.Name, err))
		case res.Status != sessions.StatusSucceeded || res.Result == nil || *res.Result != fmt.Sprint(want):
			w.failed = append(w.failed, fmt.Sprintf("%s %s: %s %v %+v, want %d", start.Format("15:04:05"), s.Name, res.Status, res.Result, res.Error, want))
		default:
			w.latency = append(w.latency, took)
		}
		w.mu.Unlock()
		if err != nil || res.Status != sessions.StatusSucceeded {
			// Where the count now is, so that one failure is counted once.
			if r, err := s.Run(ctx, sessions.ExecRequest{Code: "n"}); err == nil && r.Result != nil {
				_, _ = fmt.Sscan(*r.Result, &want)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *work) executions(ctx context.Context) {
	defer w.wg.Done()
	t := time.NewTicker(w.every)
	defer t.Stop()
	for i := 0; ; i++ {
		ex := &sandboxv1alpha1.Execution{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: fmt.Sprintf("e-%04d", i)},
			Spec: sandboxv1alpha1.ExecutionSpec{PoolRef: sandboxv1alpha1.PoolReference{Name: "work"},
				Code: ptrTo(fmt.Sprintf("print('e-%04d')\n%d * %d", i, i, i))}}
		if err := w.c.Create(ctx, ex); err != nil {
			w.mu.Lock()
			w.failed = append(w.failed, fmt.Sprintf("create %s: %v", ex.Name, err))
			w.mu.Unlock()
		} else {
			w.mu.Lock()
			w.created = append(w.created, ex.Name)
			w.mu.Unlock()
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// end stops the arrivals, waits up to patience for every Execution to end
// and reports.
func (w *work) end(ctx context.Context, patience time.Duration) {
	w.stopOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
	deadline := time.Now().Add(patience)
	var right, wrong, unfinished int
	var notes []string
	var waits []time.Duration
	for {
		right, wrong, unfinished, notes, waits = 0, 0, 0, nil, nil
		var list sandboxv1alpha1.ExecutionList
		if err := w.c.List(ctx, &list, client.InNamespace(w.ns)); err != nil {
			notes = append(notes, err.Error())
		}
		for _, ex := range list.Items {
			var i int
			_, _ = fmt.Sscanf(ex.Name, "e-%d", &i)
			switch {
			case !ex.Status.Phase.IsFinished():
				unfinished++
			case ex.Status.Phase == sandboxv1alpha1.PhaseSucceeded && ex.Status.Stdout == fmt.Sprintf("e-%04d\n", i) &&
				ex.Status.Result == fmt.Sprint(i*i):
				right++
				if ex.Status.CompletionTime != nil {
					waits = append(waits, ex.Status.CompletionTime.Sub(ex.CreationTimestamp.Time))
				}
			default:
				wrong++
				notes = append(notes, fmt.Sprintf("%s: %s %q %v", ex.Name, ex.Status.Phase, ex.Status.Stdout, ex.Status.Conditions))
			}
		}
		if unfinished == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf("Sessions: %d runs through the data plane, %d failed or wrong; run latency p50 %s, p99 %s, max %s\n",
		w.runs, len(w.failed), pct(w.latency, 50), pct(w.latency, 99), pct(w.latency, 100))
	for _, f := range w.failed {
		fmt.Println("  " + f)
	}
	fmt.Printf("Executions: %d created, %d ended right, %d wrong, %d unfinished %s after the window; creation to final status (whole seconds) p50 %s, max %s\n",
		len(w.created), right, wrong, unfinished, patience, pct(waits, 50), pct(waits, 100))
	for _, n := range notes {
		fmt.Println("  " + n)
	}
}

func (w *work) cleanup() {
	for _, s := range w.sessions {
		_ = s.Close(context.Background())
	}
	_ = w.c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}})
}

// pct is the p-th percentile of d (100: the largest), rounded.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s) - 1) * p / 100
	return s[i].Round(time.Millisecond)
}
