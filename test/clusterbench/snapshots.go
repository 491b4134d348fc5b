package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// snapshotRuns and snapshotSizes hold -snapshot-runs and -snapshot-sizes.
var (
	snapshotRuns  int
	snapshotSizes string
)

// snapshotStates are the namespaces the snapshot phase measures: plain
// Python objects (strings, not compressible to nothing) and numpy arrays of
// random floats, of about 1 KB, 1 MB, 10 MB and 100 MB pickled.
var snapshotStates = []struct {
	name, code string
}{
	{"1 KB plain", plainState(7)},
	{"1 MB plain", plainState(7_000)},
	{"10 MB plain", plainState(70_000)},
	{"100 MB plain", plainState(700_000)},
	{"1 KB numpy", "import numpy as np\ndata = np.random.rand(128)"},
	{"1 MB numpy", "import numpy as np\ndata = np.random.rand(128 * 1024)"},
	{"10 MB numpy", "import numpy as np\ndata = np.random.rand(1280 * 1024)"},
	{"100 MB numpy", "import numpy as np\ndata = np.random.rand(12800 * 1024)"},
}

// plainState is n records of plain Python objects, about 150 bytes each
// pickled: an int and 96 random hex digits (which compress to about half).
func plainState(n int) string {
	return fmt.Sprintf("import os\ndata = [{'id': i, 'text': os.urandom(48).hex()} for i in range(%d)]", n)
}

// snapshotPhase measures, per namespace size, through the data plane on
// gVisor: snapshot (the bytes to the caller), restore (the caller's bytes
// into a Ready Session), fork (a new Session with the state, server-side)
// and resume-on-run (a run of a Suspended Session, the resume included,
// timed by the caller). Needs the controllers configured with a snapshot store.
func (b *bench) snapshotPhase(ctx context.Context, cfg *rest.Config, image, runtimeClass string) error {
	pool := wrappers.Pool(b.ns, "snap").Image(image).RuntimeClass(runtimeClass).Replicas(3).MaxPods(8).
		Preload("numpy").Timeout(5 * time.Minute).Obj()
	pool.Spec.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1536Mi")},
	}
	if err := b.warmPool(ctx, pool); err != nil {
		return err
	}
	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	never := time.Duration(0)
	for _, st := range snapshotStates {
		if snapshotSizes != "" && !slices.Contains(strings.Split(snapshotSizes, ","), st.name) {
			continue
		}
		src, err := c.Create(ctx, b.ns, "src-", "snap", &sessions.Options{IdleTimeout: time.Hour, SuspendAfter: &never})
		if err != nil {
			return err
		}
		dst, err := c.Create(ctx, b.ns, "dst-", "snap", &sessions.Options{IdleTimeout: time.Hour, SuspendAfter: &never})
		if err != nil {
			return err
		}
		if err := mustRun(ctx, src, st.code); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		var snap []byte
		var takes, restores, forks, resumes []time.Duration
		for range snapshotRuns {
			start := time.Now()
			body, err := src.Snapshot(ctx, false)
			if err == nil {
				snap, err = io.ReadAll(body)
				_ = body.Close()
			}
			if err != nil {
				return fmt.Errorf("%s: snapshot: %w", st.name, err)
			}
			takes = append(takes, time.Since(start))
			start = time.Now()
			if _, err := dst.Restore(ctx, bytes.NewReader(snap)); err != nil {
				return fmt.Errorf("%s: restore: %w", st.name, err)
			}
			restores = append(restores, time.Since(start))
		}
		fmt.Printf("snapshot %s: %d bytes\n", st.name, len(snap))
		report(fmt.Sprintf("snapshot %s: snapshot (Session -> caller)", st.name), takes)
		report(fmt.Sprintf("snapshot %s: restore (caller -> Ready Session)", st.name), restores)
		if len(snap) > 64<<20 {
			// Over the fork's and the default suspend's limit: both refuse it.
			_, err := src.Fork(ctx, sessions.ForkRequest{Count: 1})
			fmt.Printf("snapshot %s: fork refused as over its limit: %v\n", st.name, err)
			_ = src.Close(ctx)
			_ = dst.Close(ctx)
			continue
		}
		for range max(snapshotRuns/3, 3) {
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			start := time.Now()
			out, err := src.Fork(ctx, sessions.ForkRequest{Count: 1})
			if err != nil {
				return fmt.Errorf("%s: fork: %w", st.name, err)
			}
			forks = append(forks, time.Since(start))
			_ = c.Open(b.ns, out.Sessions[0]).Close(ctx)
		}
		// Resume on run: the Session suspends after 1 s idle; its next run
		// resumes it, which the caller sees as one slower run.
		if err := b.setSuspendAfter(ctx, src.Name, time.Second); err != nil {
			return err
		}
		for range snapshotRuns {
			if err := b.waitSuspended(ctx, src.Name); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			start := time.Now()
			res, err := src.Run(ctx, sessions.ExecRequest{Code: "len(data)"})
			if err != nil {
				return fmt.Errorf("%s: resume-on-run: %w", st.name, err)
			}
			if res.Status != sessions.StatusSucceeded || !res.Resumed {
				return fmt.Errorf("%s: resume-on-run: %s, resumed %v: %+v", st.name, res.Status, res.Resumed, res.Error)
			}
			resumes = append(resumes, time.Since(start))
		}
		report(fmt.Sprintf("snapshot %s: fork (one new Session with the state, server-side)", st.name), forks)
		report(fmt.Sprintf("snapshot %s: resume-on-run (a Suspended Session's next run, resume included)", st.name), resumes)
		_ = src.Close(ctx)
		_ = dst.Close(ctx)
	}
	return nil
}

func mustRun(ctx context.Context, s *sessions.Session, code string) error {
	res, err := s.Run(ctx, sessions.ExecRequest{Code: code, TimeoutMillis: 300_000})
	if err != nil {
		return err
	}
	if res.Status != sessions.StatusSucceeded {
		return fmt.Errorf("%s: %+v", res.Status, res.Error)
	}
	return nil
}

func (b *bench) setSuspendAfter(ctx context.Context, name string, d time.Duration) error {
	ses := &sandboxv1alpha1.Session{ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: name}}
	patch := fmt.Appendf(nil, `{"spec":{"suspendAfter":%q}}`, d.String())
	return b.c.Patch(ctx, ses, client.RawPatch(types.MergePatchType, patch))
}

func (b *bench) waitSuspended(ctx context.Context, name string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ses := &sandboxv1alpha1.Session{}
		if err := b.c.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: name}, ses); err != nil {
			return err
		}
		if ses.Status.Phase == sandboxv1alpha1.SessionSuspended {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("Session %s not Suspended after 2 minutes", name)
}
