package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/internal/controller/agentkeys"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// dataPlanePhase measures Sessions side by side with the Execution path, in
// one run on one pool: Execution objects in a session, Session create ->
// Ready on a warm pool, and print(1) through the data plane three ways: via
// kube-apiserver's aggregator (what users do), straight to the data plane
// (bearer token, the hop the aggregator adds is the difference), and
// straight to the agent (the floor).
func (b *bench) dataPlanePhase(ctx context.Context, cfg *rest.Config, image, runtimeClass string, executions, runs, creates, parallel int) error {
	pool := wrappers.Pool(b.ns, "dp").Image(image).RuntimeClass(runtimeClass).Replicas(2).Obj()
	if err := b.warmPool(ctx, pool); err != nil {
		return err
	}
	lat, err := b.sequential(ctx, "dp", executions, nil, "bench-exec-session")
	if err != nil {
		return err
	}
	report(fmt.Sprintf("Execution objects in a session: print(1) create -> Succeeded, %d one at a time", executions), lat)

	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	// Each closed Session's pod is deleted and the pool starts another: a
	// gVisor sandbox booting takes the cores for a few seconds after it is
	// Ready. Measured right after the pool is full again, and once the node
	// has settled.
	for _, settle := range []time.Duration{0, 3 * time.Second} {
		var ready []time.Duration
		for i := range creates {
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			time.Sleep(settle)
			start := time.Now()
			s, err := c.Create(ctx, b.ns, fmt.Sprintf("ready-%d-%03d", settle/time.Second, i), "dp", nil)
			if err != nil {
				return err
			}
			ready = append(ready, time.Since(start))
			if err := s.Close(ctx); err != nil {
				return err
			}
		}
		report(fmt.Sprintf("Session create -> Ready on a warm pool (client-side: create call to the watch event), %d one at a time, "+
			"%s after the pool is full again", creates, settle), ready)
	}

	if err := b.firstAnswer(ctx, cfg, c, pool, creates); err != nil {
		return err
	}

	if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
		return err
	}
	s, err := c.Create(ctx, b.ns, "runs", "dp", nil)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close(context.Background()) }()
	print1 := sessions.ExecRequest{Code: "print(1)"}
	timed := func(what string, run func() error) error {
		for range 20 { // warm the connections
			if err := run(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		var lat []time.Duration
		start := time.Now()
		for range runs {
			t := time.Now()
			if err := run(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			lat = append(lat, time.Since(t))
		}
		report(fmt.Sprintf("%s, %d one at a time (%.0f runs/s)", what, runs, float64(runs)/time.Since(start).Seconds()), lat)
		return nil
	}
	runVia := func(s *sessions.Session) func() error {
		return func() error {
			res, err := s.Run(ctx, print1)
			if err == nil && res.Stdout != "1\n" {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			return err
		}
	}
	if err := timed("print(1) through the data plane via kube-apiserver (aggregated API)", runVia(s)); err != nil {
		return err
	}

	// Throughput of one data-plane replica: parallel Sessions, each running
	// one print(1) after another (a Session runs one thing at a time).
	if parallel > 1 {
		par := make([]*sessions.Session, parallel)
		for i := range par {
			if err := b.waitIdle(ctx, pool, 1); err != nil {
				return err
			}
			if par[i], err = c.Create(ctx, b.ns, fmt.Sprintf("par-%d", i), "dp", nil); err != nil {
				return err
			}
			defer func(s *sessions.Session) { _ = s.Close(context.Background()) }(par[i])
		}
		var wg sync.WaitGroup
		errs := make(chan error, parallel)
		lat := make([][]time.Duration, parallel)
		start := time.Now()
		for i := range par {
			wg.Go(func() {
				run := runVia(par[i])
				for range runs / parallel {
					t := time.Now()
					if err := run(); err != nil {
						errs <- err
						return
					}
					lat[i] = append(lat[i], time.Since(t))
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		report(fmt.Sprintf("print(1) via kube-apiserver, %d Sessions in parallel (%.0f runs/s in total)", parallel,
			float64(len(all))/time.Since(start).Seconds()), all)
	}

	// Straight to one data-plane replica, as a gateway would be reached.
	dpAddr, err := b.dataPlanePodIP(ctx)
	if err != nil {
		return err
	}
	token := cfg.BearerToken
	direct := &http.Client{Transport: &bearer{token: token, next: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 4}}} //nolint:gosec // the data plane's self-signed certificate; measurement only
	ds := c.WithDataPlane("https://"+dpAddr+":9443", direct).Open(b.ns, s.Name)
	if token == "" {
		fmt.Println("print(1) straight to the data plane: skipped (the kubeconfig has no bearer token)")
	} else if err := timed("print(1) straight to a data-plane replica (bearer token, no aggregator)", runVia(ds)); err != nil {
		return err
	}

	// Straight to the agent: the floor. Needs the agent keys and a route to
	// the pod's agent port from here.
	agent, err := b.agentOf(ctx, s)
	if err != nil {
		fmt.Println("print(1) straight to the agent: skipped:", err)
		return nil
	}
	n := 0
	return timed("print(1) straight to the sandbox agent (no Kubernetes in the path)", func() error {
		n++
		res, err := agent.Execute(ctx, protocol.ExecuteRequest{ID: "direct-" + strconv.Itoa(n), Code: "print(1)"})
		if err == nil && res.Stdout != "1\n" {
			err = fmt.Errorf("unexpected result %+v", res)
		}
		return err
	})
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func (b *bench) dataPlanePodIP(ctx context.Context) (string, error) {
	var pods corev1.PodList
	if err := b.c.List(ctx, &pods, client.InNamespace("warmpool-system"),
		client.MatchingLabels{"control-plane": "data-plane"}); err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			return p.Status.PodIP, nil
		}
	}
	return "", fmt.Errorf("no data-plane pod with an IP in warmpool-system")
}

// agentOf returns a client of the Session's agent, with a token signed by
// the manager's keys (read from their Secret, as the manager does).
func (b *bench) agentOf(ctx context.Context, s *sessions.Session) (*agentclient.Client, error) {
	obj, err := s.Get(ctx)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: obj.Status.PodName}, pod); err != nil {
		return nil, err
	}
	secret := &corev1.Secret{}
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: agentkeys.DefaultSecret}, secret); err != nil {
		return nil, fmt.Errorf("agent keys: %w", err)
	}
	keys, err := agentauth.ParseKeyring(secret.Data)
	if err != nil {
		return nil, err
	}
	keyID := pod.Labels[sandboxpod.LabelAgentKey]
	c := agentclient.New(fmt.Sprintf("http://%s:%d", pod.Status.PodIP, sandboxpod.AgentPort), "").
		WithTokenSource(func() (string, error) { return keys.Token(string(pod.UID), keyID) })
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := c.Ready(pctx); err != nil {
		return nil, fmt.Errorf("agent of pod %s not reachable from here (NetworkPolicy admits only the manager): %w", pod.Name, err)
	}
	return c, nil
}

// firstAnswer measures create -> first print(1) answered, the two ways a
// caller with nothing can go: a Session created and watched until Ready, then
// a run (two calls and a watch); and one call to the data plane's runs/exec,
// which leases and runs (the Server-Timing header says where its time went).
// Interleaved, each after the pool is full again and the node settled.
func (b *bench) firstAnswer(ctx context.Context, cfg *rest.Config, c *sessions.Client, pool *sandboxv1alpha1.SandboxPool, n int) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	runs := strings.TrimRight(cfg.Host, "/") + "/apis/" + sessions.Group + "/" + sessions.Version + "/namespaces/" + b.ns + "/runs/"
	var two, one, create, lease, rest1 []time.Duration
	for i := range n {
		for _, oneCall := range []bool{i%2 == 0, i%2 != 0} {
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			time.Sleep(3 * time.Second)
			start := time.Now()
			if !oneCall {
				s, err := c.Create(ctx, b.ns, fmt.Sprintf("two-%03d", i), "dp", nil)
				if err != nil {
					return err
				}
				res, err := s.Run(ctx, sessions.ExecRequest{Code: "print(1)"})
				if err == nil && res.Stdout != "1\n" {
					err = fmt.Errorf("unexpected result %+v", res)
				}
				if err != nil {
					return err
				}
				two = append(two, time.Since(start))
				if err := s.Close(ctx); err != nil {
					return err
				}
				continue
			}
			body, _ := json.Marshal(sessions.RunRequest{Pool: "dp", ExecRequest: sessions.ExecRequest{Code: "print(1)"}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, runs+fmt.Sprintf("one-%03d/exec", i), bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			var res sessions.Result
			err = json.NewDecoder(resp.Body).Decode(&res)
			took := time.Since(start)
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if err == nil && (resp.StatusCode != http.StatusOK || res.Stdout != "1\n") {
				err = fmt.Errorf("one-call run: %d %+v", resp.StatusCode, res)
			}
			if err != nil {
				return err
			}
			one = append(one, took)
			timing := serverTiming(resp.Header.Get("Server-Timing"))
			create, lease = append(create, timing["create"]), append(lease, timing["lease"])
			rest1 = append(rest1, took-timing["create"]-timing["lease"])
		}
	}
	report(fmt.Sprintf("create -> first print(1) answered, two calls (Session create, watch to Ready, run), %d", n), two)
	report(fmt.Sprintf("create -> first print(1) answered, one call (data plane runs), %d", n), one)
	report("  of which: the data plane's Session create call", create)
	report("  of which: the lease, from the create's answer to Ready in the data plane's cache", lease)
	report("  of which: the rest (the caller to the data plane and back through kube-apiserver, checks, the run)", rest1)
	return nil
}

// serverTiming reads "name;dur=MS, ..." into durations.
func serverTiming(h string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, part := range strings.Split(h, ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(part), ";dur=")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(dur, 64); err == nil {
			out[name] = time.Duration(v * float64(time.Millisecond))
		}
	}
	return out
}

// firstRunPhase takes the first run on a freshly leased pod apart: straight
// to the agent (the first call's connection and health check, the first
// run, the second run), and through the data plane (first and second run),
// each on a new Session of a pool that had settled for 3 s.
//
// noRefill caps the pool at its replicas (maxPods), so that a lease starts no
// replacement pod: what the first run costs without a pod booting beside it.
func (b *bench) firstRunPhase(ctx context.Context, cfg *rest.Config, image, runtimeClass string, n int, noRefill bool) error {
	pw := wrappers.Pool(b.ns, "fr").Image(image).RuntimeClass(runtimeClass).Replicas(2)
	if noRefill {
		pw = pw.MaxPods(2)
	}
	pool := pw.Obj()
	if err := b.warmPool(ctx, pool); err != nil {
		return err
	}
	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{}
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: "warmpool-system", Name: agentkeys.DefaultSecret}, secret); err != nil {
		return fmt.Errorf("agent keys: %w", err)
	}
	keys, err := agentauth.ParseKeyring(secret.Data)
	if err != nil {
		return err
	}
	var connect, direct1, direct2, dp1, dp2 []time.Duration
	timed := func(into *[]time.Duration, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return err
		}
		*into = append(*into, time.Since(t))
		return nil
	}
	for i := range n {
		for _, viaDataPlane := range []bool{false, true} {
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			time.Sleep(3 * time.Second)
			s, err := c.Create(ctx, b.ns, fmt.Sprintf("fr-%v-%03d", viaDataPlane, i), "fr", nil)
			if err != nil {
				return err
			}
			print1 := func(run func() (*protocol.Result, error)) func() error {
				return func() error {
					res, err := run()
					if err == nil && res.Stdout != "1\n" {
						err = fmt.Errorf("unexpected result %+v", res)
					}
					return err
				}
			}
			if viaDataPlane {
				time.Sleep(firstRunDelay)
				dp := print1(func() (*protocol.Result, error) { return s.Run(ctx, sessions.ExecRequest{Code: "print(1)"}) })
				if err := timed(&dp1, dp); err != nil {
					return err
				}
				if err := timed(&dp2, dp); err != nil {
					return err
				}
			} else {
				obj, err := s.Get(ctx)
				if err != nil {
					return err
				}
				pod := &corev1.Pod{}
				if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: obj.Status.PodName}, pod); err != nil {
					return err
				}
				ac := agentclient.New(fmt.Sprintf("http://%s:%d", pod.Status.PodIP, sandboxpod.AgentPort), "").
					WithTokenSource(func() (string, error) { return keys.Token(string(pod.UID), pod.Labels[sandboxpod.LabelAgentKey]) })
				if err := timed(&connect, func() error { _, err := ac.Ready(ctx); return err }); err != nil {
					return err
				}
				k := 0
				run := print1(func() (*protocol.Result, error) {
					k++
					return ac.Execute(ctx, protocol.ExecuteRequest{ID: fmt.Sprintf("fr-%d-%d", i, k), Code: "print(1)"})
				})
				if err := timed(&direct1, run); err != nil {
					return err
				}
				if err := timed(&direct2, run); err != nil {
					return err
				}
			}
			if err := s.Close(ctx); err != nil {
				return err
			}
		}
	}
	report("a freshly leased pod, straight to its agent: the first call (connection + health check)", connect)
	report("  then the first print(1)", direct1)
	report("  then the second print(1)", direct2)
	report("a freshly leased pod, through the data plane via kube-apiserver: the first print(1)", dp1)
	report("  then the second print(1)", dp2)
	return nil
}
