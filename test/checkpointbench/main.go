// Command checkpointbench measures what a durable Session's checkpoints
// cost, for states of a few sizes: two Sessions of one pool, one durable
// (spec.checkpoint, after every run) and one not, run the same small code
// side by side, first with a think time between runs (an LLM agent's pace),
// then back to back; it reports each run's latency, p50 and p95, the
// checkpoints taken and how long one took (snapshot and upload, off the
// run's path), and the bytes stored per checkpoint.
//
// It runs on envtest with real agents and a real python3 per pod (the test
// kubelet) and a real S3 store (SeaweedFS) on loopback; no gVisor.
//
//	go run ./test/checkpointbench -runs 20 -think 500ms
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/controller"
	"github.com/warmpool/warmpool/internal/metrics"
	"github.com/warmpool/warmpool/internal/snapshotstore"
	"github.com/warmpool/warmpool/internal/testing/objectstore"
	"github.com/warmpool/warmpool/internal/testing/stack"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

type options struct {
	runs  int
	think time.Duration
	sizes []int
}

func main() {
	var o options
	var sizes string
	flag.IntVar(&o.runs, "runs", 20, "runs per Session and pace")
	flag.DurationVar(&o.think, "think", 500*time.Millisecond, "pause between two runs at the paced pace")
	flag.StringVar(&sizes, "sizes", "1024,1048576,10485760", "bytes of state (random, so incompressible), comma-separated")
	flag.Parse()
	for _, f := range strings.Split(sizes, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil {
			fmt.Fprintln(os.Stderr, "bad -sizes:", err)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
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
	s, err := stack.Start(stack.Options{Configure: func(c *controller.Config) {
		c.Snapshots = &controller.Snapshots{Store: store.Config("checkpointbench", "warmpool/"), KeySecret: "checkpointbench-key"}
	}})
	if err != nil {
		return err
	}
	defer s.Stop()
	ctx := context.Background()
	ns, err := s.Namespace(ctx, "checkpoint-")
	if err != nil {
		return err
	}
	if err := s.WarmPool(ctx, ns, "python", 3); err != nil {
		return err
	}
	c, err := s.SessionsClient(ctx, ns, "bench")
	if err != nil {
		return err
	}
	fmt.Printf("%d runs per Session and pace (think time %s between paced runs); state: random bytes; one agent per pod, no gVisor\n\n", o.runs, o.think)
	fmt.Println("| state | pace | run p50 / p95, plain | run p50 / p95, durable | checkpoints / runs | checkpoint mean (snapshot + upload) | bytes per checkpoint |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for i, size := range o.sizes {
		plain, durable := fmt.Sprintf("plain-%d", i), fmt.Sprintf("durable-%d", i)
		for _, ses := range []*sandboxv1alpha1.Session{wrappers.Session(ns, plain).IdleTimeout(time.Hour).Obj(),
			wrappers.Session(ns, durable).IdleTimeout(time.Hour).Checkpoint(0).Obj()} {
			if err := s.Env.Client.Create(ctx, ses); err != nil {
				return err
			}
		}
		p, d := c.Open(ns, plain), c.Open(ns, durable)
		state := fmt.Sprintf("import os\nblob = os.urandom(%d)\nn = 0", size)
		for _, ses := range []*sessions.Session{p, d} {
			if _, err := runOnce(ctx, ses, state); err != nil {
				return err
			}
		}
		for _, pace := range []time.Duration{o.think, 0} {
			// The checkpoints of earlier runs are done before this pace starts.
			if err := caughtUp(ctx, s.Env.Client, store, ns, durable); err != nil {
				return err
			}
			before := checkpointMetrics()
			var lp, ld []time.Duration
			for range o.runs {
				for _, r := range []struct {
					s   *sessions.Session
					out *[]time.Duration
				}{{p, &lp}, {d, &ld}} {
					took, err := runOnce(ctx, r.s, "n += 1\nn")
					if err != nil {
						return err
					}
					*r.out = append(*r.out, took)
				}
				time.Sleep(pace)
			}
			if err := caughtUp(ctx, s.Env.Client, store, ns, durable); err != nil {
				return err
			}
			after := checkpointMetrics()
			taken := after.count - before.count
			paceName := "back to back"
			if pace > 0 {
				paceName = "think " + pace.String()
			}
			fmt.Printf("| %s | %s | %s | %s | %d / %d | %s | %s |\n", bytesName(size), paceName, q(lp), q(ld), taken, o.runs,
				meanDuration(after.seconds-before.seconds, taken), meanBytes(after.bytes-before.bytes, taken))
		}
	}
	return nil
}

func runOnce(ctx context.Context, s *sessions.Session, code string) (time.Duration, error) {
	start := time.Now()
	res, err := s.Run(ctx, sessions.ExecRequest{Code: code})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", s.Name, err)
	}
	if res.Status != sessions.StatusSucceeded {
		return 0, fmt.Errorf("%s: %s %+v", s.Name, res.Status, res.Error)
	}
	return took, nil
}

// caughtUp waits until the durable Session's newest checkpoint is of its last run.
func caughtUp(ctx context.Context, k client.Client, store *objectstore.Server, ns, name string) error {
	secret, err := snapshotKey(ctx, k)
	if err != nil {
		return err
	}
	st, err := snapshotstore.New(store.Config("checkpointbench", "warmpool/"), secret)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ses := &sandboxv1alpha1.Session{}
		if err := k.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ses); err != nil {
			return err
		}
		latest, err := st.Latest(ctx, snapshotstore.Owner{Namespace: ns, UID: ses.UID})
		if err == nil && latest.Run >= ses.Status.Runs && time.Since(latest.Time) > 100*time.Millisecond {
			return nil
		}
	}
	return fmt.Errorf("the checkpoints of %s did not catch up in 2 minutes", name)
}

func snapshotKey(ctx context.Context, k client.Client) ([]byte, error) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		key, err := snapshotstore.LoadKey(ctx, k, k, "", types.NamespacedName{Namespace: stack.ManagerNamespace, Name: "checkpointbench-key"})
		if err == nil {
			return key, nil
		}
	}
	return nil, fmt.Errorf("no snapshot key")
}

type totals struct {
	count          uint64
	seconds, bytes float64
}

// checkpointMetrics reads the manager's checkpoint histograms (it runs in this process).
func checkpointMetrics() totals {
	read := func(m prometheus.Metric) *dto.Histogram {
		var out dto.Metric
		_ = m.Write(&out)
		return out.GetHistogram()
	}
	t := read(metrics.SessionCheckpoint.WithLabelValues("stored").(prometheus.Metric))
	b := read(metrics.SessionCheckpointBytes)
	return totals{count: t.GetSampleCount(), seconds: t.GetSampleSum(), bytes: b.GetSampleSum()}
}

func q(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		return s[min(len(s)-1, int(p*float64(len(s))))].Round(100 * time.Microsecond)
	}
	return fmt.Sprintf("%s / %s", at(0.5), at(0.95))
}

func meanDuration(seconds float64, n uint64) string {
	if n == 0 {
		return "-"
	}
	return time.Duration(seconds / float64(n) * float64(time.Second)).Round(100 * time.Microsecond).String()
}

func meanBytes(total float64, n uint64) string {
	if n == 0 {
		return "-"
	}
	return bytesName(int(total / float64(n)))
}

func bytesName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
