package monitoring

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped files load, every alert links its runbook and says how bad it
// is, and every dashboard query expands to PromQL without variables
// (promtool then parses them all: make check-monitoring).
func TestShippedRulesAndDashboard(t *testing.T) {
	rules, err := LoadPrometheusRule(filepath.Join("..", "..", "config", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			anchor := "docs/monitoring.md#" + strings.ToLower(r.Alert)
			if !strings.HasSuffix(r.Annotations["runbook_url"], anchor) {
				t.Errorf("%s: runbook_url %q does not point at %s", r.Alert, r.Annotations["runbook_url"], anchor)
			}
			if !strings.Contains(string(docs), "\n### "+r.Alert+"\n") {
				t.Errorf("%s: docs/monitoring.md has no runbook section '### %s'", r.Alert, r.Alert)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: needs a severity label and a summary", r.Alert)
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts, want at least the five of docs/monitoring.md", alerts)
	}

	d, err := LoadDashboard(filepath.Join("..", "..", "config", "grafana", "warmpool.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range d.Queries {
		if _, err := Expand(q.Expr, "5m"); err != nil {
			t.Errorf("panel %q: %v", q.Panel, err)
		}
	}
	if _, err := Expand(`up{job="$job"}`, "5m"); err == nil {
		t.Error("an unknown variable expanded without an error")
	}
}
