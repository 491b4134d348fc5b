package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// seedTable holds -data-image, -seed-runs, -seed-executions and -seed-cold.
var seedTable struct {
	image                  string
	runs, executions, cold int
}

// seedCode is the REPL server seed's table: simple code, and data-science
// code (a pandas group-by on 100k rows, a matplotlib chart returned as PNG, a
// small scikit-learn fit).
var seedCode = []struct{ name, code string }{
	{"simple: print", "print('hello')"},
	{"simple: arithmetic", "sum(i * i for i in range(1000))"},
	{"complex: pandas group-by, 100k rows", `import numpy as np, pandas as pd
df = pd.DataFrame({"k": np.arange(100_000) % 100, "v": np.random.rand(100_000)})
print(len(df.groupby("k").v.agg(["mean", "sum"])))`},
	{"complex: matplotlib chart as PNG", `import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(range(100), [i * i for i in range(100)])
ax.set_title("squares")
print("drawn")`},
	{"complex: scikit-learn fit", `import numpy as np
from sklearn.linear_model import LogisticRegression
X = np.random.rand(1000, 5)
y = (X[:, 0] > 0.5).astype(int)
print(round(LogisticRegression().fit(X, y).score(X, y), 2))`},
}

// seedTablePhase measures the seed's table on the data-science image: each
// code through the data plane in a warm Session, as an Execution object on
// a warm pool (a fresh pod each: reusePolicy Never), and cold, as a Job of
// the same image that imports what it needs.
func (b *bench) seedTablePhase(ctx context.Context, cfg *rest.Config, runtimeClass string) error {
	pool := wrappers.Pool(b.ns, "data").Image(seedTable.image).RuntimeClass(runtimeClass).Replicas(3).MaxPods(6).
		Preload("pandas", "numpy", "matplotlib.pyplot").Timeout(2 * time.Minute).Obj()
	pool.Spec.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
	if err := b.warmPool(ctx, pool); err != nil {
		return err
	}
	c, err := sessions.New(cfg)
	if err != nil {
		return err
	}
	s, err := c.Create(ctx, b.ns, "seed-", "data", nil)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close(context.Background()) }()
	// The lease starts a replacement pod: let its boot (and its preload) end
	// before timing, as the data-plane phase does.
	if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	for _, sc := range seedCode {
		var lat []time.Duration
		for i := range seedTable.runs + 1 {
			start := time.Now()
			res, err := s.Run(ctx, sessions.ExecRequest{Code: sc.code})
			took := time.Since(start)
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			if res.Status != sessions.StatusSucceeded {
				return fmt.Errorf("%s: %s %+v", sc.name, res.Status, res.Error)
			}
			if sc.name == "complex: matplotlib chart as PNG" && !hasPNG(res) {
				return fmt.Errorf("%s: no image/png came back", sc.name)
			}
			if i > 0 { // the first run of each code warms what it imports
				lat = append(lat, took)
			}
		}
		report(fmt.Sprintf("seed table, data plane in a warm Session: %s", sc.name), lat)
	}
	for _, sc := range seedCode {
		var lat []time.Duration
		for range seedTable.executions {
			if err := b.waitIdle(ctx, pool, pool.Spec.Replicas); err != nil {
				return err
			}
			took, _, err := b.execute(ctx, "data", fmt.Sprintf("seed-%05d", b.next()), sc.code, "")
			if err != nil {
				return err
			}
			lat = append(lat, took)
		}
		report(fmt.Sprintf("seed table, Execution object on a warm pool (create -> Succeeded): %s", sc.name), lat)
	}
	for _, sc := range seedCode {
		code := "import pandas, numpy, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot\n" + sc.code
		if sc.name == "complex: matplotlib chart as PNG" {
			code += "\nimport io\nfig.savefig(io.BytesIO(), format='png')"
		}
		lat, err := b.jobsOf(ctx, seedTable.cold, runtimeClass, seedTable.image, code)
		if err != nil {
			return err
		}
		report(fmt.Sprintf("seed table, cold: a Job of the same image (create -> Complete): %s", sc.name), lat)
	}
	return nil
}

func hasPNG(res *sessions.Result) bool {
	for _, d := range res.Displays {
		var s string
		if json.Unmarshal(d.Data["image/png"], &s) == nil && len(s) > 100 {
			return true
		}
	}
	return false
}
