// Package monitoring reads what config/ ships for monitoring warmpool: the
// PrometheusRule of config/prometheus and the Grafana dashboard of
// config/grafana, so that promtool can check both (hack/monitoring) and the
// e2e suite can run every query against a real Prometheus.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// Rule is one alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RuleGroup is a group of rules, as Prometheus' rule files hold them.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// RuleFile is a Prometheus rule file (the PrometheusRule's spec).
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// LoadPrometheusRule reads the rule groups of a PrometheusRule manifest.
func LoadPrometheusRule(path string) (*RuleFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var obj struct {
		Kind string   `json:"kind"`
		Spec RuleFile `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if obj.Kind != "PrometheusRule" || len(obj.Spec.Groups) == 0 {
		return nil, fmt.Errorf("%s: not a PrometheusRule with rule groups", path)
	}
	return &obj.Spec, nil
}

// Query is one target of a dashboard panel.
type Query struct {
	Panel  string
	RefID  string
	Expr   string
	Legend string
	Unit   string
}

// Dashboard is what the checks need of a Grafana dashboard.
type Dashboard struct {
	Title     string
	Queries   []Query
	Variables []string // template variables queries may use
	// VariableQueries are the label_values(...) queries of its variables.
	VariableQueries map[string]string
}

type grafanaPanel struct {
	Title       string `json:"title"`
	Type        string `json:"type"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

// LoadDashboard reads a Grafana dashboard JSON file.
func LoadDashboard(path string) (*Dashboard, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw struct {
		Title      string         `json:"title"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d := &Dashboard{Title: raw.Title, VariableQueries: map[string]string{}}
	for _, v := range raw.Templating.List {
		d.Variables = append(d.Variables, v.Name)
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", path, v.Name, err)
		}
		d.VariableQueries[v.Name] = q.Query
	}
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			for _, t := range p.Targets {
				d.Queries = append(d.Queries, Query{Panel: p.Title, RefID: t.RefID, Expr: t.Expr, Legend: t.LegendFormat, Unit: p.FieldConfig.Defaults.Unit})
			}
			walk(p.Panels)
		}
	}
	walk(raw.Panels)
	if len(d.Queries) == 0 {
		return nil, fmt.Errorf("%s: no panel queries", path)
	}
	return d, nil
}

// Expand replaces the dashboard's variables in expr as Grafana would with
// "All" selected (the regex .*) and $__rate_interval with rateInterval, so
// that Prometheus can run the query. A variable it does not know is an
// error: a new one must be taught here, not left for Prometheus to reject.
func Expand(expr, rateInterval string) (string, error) {
	r := strings.NewReplacer(
		"$__rate_interval", rateInterval,
		"${namespace}", ".*", "$namespace", ".*",
		"${pool}", ".*", "$pool", ".*",
	)
	out := r.Replace(expr)
	if strings.Contains(out, "$") {
		return "", fmt.Errorf("query %q uses a variable Expand does not know", expr)
	}
	return out, nil
}
