package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

const (
	seatsFlag = "--data-plane-namespace-seats="
	rateFlag  = "--data-plane-namespace-rate="
)

// dataPlaneLimits are a data plane's per-namespace limits: seats and rate
// (-1: none; 0: the default).
type dataPlaneLimits struct {
	seats int
	rate  float64
}

func (l dataPlaneLimits) String() string {
	say := func(what string, n float64) string {
		switch {
		case n < 0:
			return "no " + what
		case n == 0:
			return what + " default"
		}
		return fmt.Sprintf("%s %g", what, n)
	}
	return say("seats", float64(l.seats)) + ", " + say("rate", l.rate)
}

// fairnessPhase measures one tenant's runs while another floods the data
// plane, side by side in one run: tenant B's sequential print(1) (fair.pause
// between them) alone and under tenant A's flood (fair.sessions Sessions,
// fair.clients runs at once on each, each printing fair.bytes), for each of
// the data-plane Deployment's per-namespace limits in turn (-1/-1 is none,
// the build before fairness).
func (b *bench) fairnessPhase(ctx context.Context, cfg *rest.Config, image, runtimeClass string, limits []dataPlaneLimits) error {
	runs, floodSessions, floodClients, floodBytes := fair.runs, fair.sessions, fair.clients, fair.bytes
	nsB := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-b-"}}
	if err := b.c.Create(ctx, nsB); err != nil {
		return err
	}
	defer func() { _ = b.c.Delete(context.Background(), nsB) }()
	if err := b.warmPool(ctx, wrappers.Pool(b.ns, "a").Image(image).RuntimeClass(runtimeClass).Replicas(int32(floodSessions)).Obj()); err != nil {
		return err
	}
	if err := b.warmPool(ctx, wrappers.Pool(nsB.Name, "b").Image(image).RuntimeClass(runtimeClass).Replicas(1).Obj()); err != nil {
		return err
	}
	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	var flood []*sessions.Session
	for range floodSessions {
		s, err := c.Create(ctx, b.ns, "a-", "a", &sessions.Options{IdleTimeout: time.Hour})
		if err != nil {
			return err
		}
		flood = append(flood, s)
	}
	quiet, err := c.Create(ctx, nsB.Name, "b-", "b", &sessions.Options{IdleTimeout: time.Hour})
	if err != nil {
		return err
	}
	defer func() { _ = b.setLimits(context.Background(), dataPlaneLimits{}) }()
	floodCode := fmt.Sprintf("print('x' * %d)", floodBytes)
	for _, l := range limits {
		if err := b.setLimits(ctx, l); err != nil {
			return err
		}
		label := l.String()
		if err := waitServed(ctx, quiet); err != nil {
			return err
		}
		alone, err := sequentialRuns(ctx, quiet, runs)
		if err != nil {
			return err
		}
		report(fmt.Sprintf("[%s] tenant B alone: print(1), %d one at a time, %s apart", label, runs, fair.pause), alone)

		fctx, stop := context.WithCancel(ctx)
		var done, refused, failed atomic.Int64
		var wg sync.WaitGroup
		for _, s := range flood {
			for range floodClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for fctx.Err() == nil {
						_, err := s.Run(fctx, sessions.ExecRequest{Code: floodCode})
						var e *sessions.Error
						switch {
						case err == nil:
							done.Add(1)
						case errors.As(err, &e) && e.Code == http.StatusTooManyRequests:
							refused.Add(1)
							time.Sleep(e.RetryAfter)
						case fctx.Err() == nil:
							failed.Add(1)
						}
					}
				}()
			}
		}
		time.Sleep(fair.warmup) // the flood at its pace, its burst spent
		start, before := time.Now(), done.Load()
		under, err := sequentialRuns(ctx, quiet, runs)
		secs := time.Since(start).Seconds()
		floodRuns := done.Load() - before
		stop()
		wg.Wait()
		if err != nil {
			return err
		}
		report(fmt.Sprintf("[%s] tenant B under A's flood (%d Sessions x %d clients, %d B printed each, %s before; A ran %.0f/s, %d refused 429, %d failed)",
			label, floodSessions, floodClients, floodBytes, fair.warmup, float64(floodRuns)/secs, refused.Load(), failed.Load()), under)
	}
	return nil
}

func sequentialRuns(ctx context.Context, s *sessions.Session, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		res, err := s.Run(ctx, sessions.ExecRequest{Code: "print(1)"})
		if err != nil {
			return nil, err
		}
		if res.Status != sessions.StatusSucceeded {
			return nil, fmt.Errorf("print(1) ended %s", res.Status)
		}
		out = append(out, time.Since(t))
		time.Sleep(fair.pause)
	}
	return out, nil
}

// waitServed waits until the data plane serves s again (after a rollout).
func waitServed(ctx context.Context, s *sessions.Session) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := s.Run(ctx, sessions.ExecRequest{Code: "None"})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the data plane did not serve again: %w", err)
		}
		time.Sleep(time.Second)
	}
}

// setLimits sets the data-plane Deployment's per-namespace seats and rate
// (0: the default) and waits for the rollout.
func (b *bench) setLimits(ctx context.Context, l dataPlaneLimits) error {
	key := client.ObjectKey{Namespace: "warmpool-system", Name: "warmpool-data-plane"}
	d := &appsv1.Deployment{}
	if err := b.c.Get(ctx, key, d); err != nil {
		return err
	}
	ctr := &d.Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range ctr.Args {
		if !strings.HasPrefix(a, seatsFlag) && !strings.HasPrefix(a, rateFlag) {
			args = append(args, a)
		}
	}
	if l.seats != 0 {
		args = append(args, fmt.Sprintf("%s%d", seatsFlag, l.seats))
	}
	if l.rate != 0 {
		args = append(args, fmt.Sprintf("%s%g", rateFlag, l.rate))
	}
	if strings.Join(args, " ") == strings.Join(ctr.Args, " ") {
		return nil
	}
	ctr.Args = args
	if err := b.c.Update(ctx, d); err != nil {
		return err
	}
	for {
		if err := b.c.Get(ctx, key, d); err != nil {
			return err
		}
		want := *d.Spec.Replicas
		if d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want && d.Status.AvailableReplicas == want &&
			d.Status.Replicas == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
