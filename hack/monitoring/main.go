// Command monitoring checks and draws what config/ ships for monitoring.
//
//	go run ./hack/monitoring check -promtool bin/promtool
//
// runs promtool on the PrometheusRule's rules (check rules, then the unit
// tests of config/prometheus/rules_test.yaml) and on every query of the
// Grafana dashboard (each as a recording rule, so promtool parses it).
//
//	go run ./hack/monitoring plot -prometheus http://127.0.0.1:9090 -out docs/monitoring-dashboard.svg
//
// draws the dashboard's time-series panels from a real Prometheus' answers
// (query_range), for docs: no Grafana builds from Go modules.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/warmpool/warmpool/internal/monitoring"
)

const (
	rulesPath     = "config/prometheus/rules.yaml"
	testsPath     = "config/prometheus/rules_test.yaml"
	dashboardPath = "config/grafana/warmpool.json"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: monitoring check|plot [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "check":
		err = check(os.Args[2:])
	case "plot":
		err = plotCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: check or plot", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "monitoring:", err)
		os.Exit(1)
	}
}

func check(args []string) error {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	promtool := fs.String("promtool", "bin/promtool", "promtool binary")
	_ = fs.Parse(args)

	dir, err := os.MkdirTemp("", "warmpool-monitoring-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	rules, err := monitoring.LoadPrometheusRule(rulesPath)
	if err != nil {
		return err
	}
	alerts := filepath.Join(dir, "warmpool.rules.yaml")
	if err := writeYAML(alerts, rules); err != nil {
		return err
	}
	// promtool reads rule_files relative to the test file: both go in dir.
	tests, err := os.ReadFile(testsPath)
	if err != nil {
		return err
	}
	testFile := filepath.Join(dir, "rules_test.yaml")
	if err := os.WriteFile(testFile, tests, 0o644); err != nil {
		return err
	}

	queries, err := dashboardRules()
	if err != nil {
		return err
	}
	panels := filepath.Join(dir, "dashboard.rules.yaml")
	if err := writeYAML(panels, queries); err != nil {
		return err
	}

	for _, cmd := range [][]string{
		{"check", "rules", alerts},
		{"check", "rules", panels},
		{"test", "rules", testFile},
	} {
		fmt.Printf("== promtool %s\n", strings.Join(cmd[:2], " ")+" "+filepath.Base(cmd[2]))
		c := exec.Command(*promtool, cmd...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Run(); err != nil {
			return fmt.Errorf("promtool %s %s: %w", cmd[0], cmd[2], err)
		}
	}
	return nil
}

// labelValues is Grafana's variable query label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// dashboardRules turns every dashboard query, and the selector of every
// variable query, into a recording rule: promtool check rules parses them.
func dashboardRules() (*monitoring.RuleFile, error) {
	d, err := monitoring.LoadDashboard(dashboardPath)
	if err != nil {
		return nil, err
	}
	g := monitoring.RuleGroup{Name: "dashboard"}
	for i, q := range d.Queries {
		expr, err := monitoring.Expand(q.Expr, "5m")
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", q.Panel, err)
		}
		g.Rules = append(g.Rules, monitoring.Rule{Record: fmt.Sprintf("dashboard:query_%d:%s", i, q.RefID), Expr: expr})
	}
	for name, q := range d.VariableQueries {
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			return nil, fmt.Errorf("variable %s: %q is not label_values(selector, label)", name, q)
		}
		expr, err := monitoring.Expand(m[1], "5m")
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", name, err)
		}
		g.Rules = append(g.Rules, monitoring.Rule{Record: "dashboard:variable:" + name, Expr: expr})
	}
	return &monitoring.RuleFile{Groups: []monitoring.RuleGroup{g}}, nil
}

func writeYAML(path string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
