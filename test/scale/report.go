package main

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// report is what a scenario measured: tables for docs/scale.md and the same
// numbers by name for -json.
type report struct {
	Scenario      string             `json:"scenario"`
	Simulated     string             `json:"simulated"`
	Params        map[string]string  `json:"params"`
	Values        map[string]float64 `json:"values"`
	Tables        []table            `json:"tables"`
	Notes         []string           `json:"notes,omitempty"`
	FleetRequests map[string]int64   `json:"fleetRequests"`
	FleetErrors   int64              `json:"fleetErrors"`
}

type table struct {
	Title  string     `json:"title"`
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
}

func newReport(scenario string) *report {
	return &report{Scenario: scenario, Params: map[string]string{}, Values: map[string]float64{}}
}

func (r *report) param(k string, v any) { r.Params[k] = fmt.Sprint(v) }

func (r *report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## scale: %s\n\n", r.Scenario)
	keys := make([]string, 0, len(r.Params))
	for k := range r.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Params[k])
	}
	for _, t := range r.Tables {
		fmt.Fprintf(&b, "\n%s\n\n| %s |\n|%s\n", t.Title, strings.Join(t.Header, " | "), strings.Repeat("---|", len(t.Header)))
		for _, row := range t.Rows {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	if len(r.FleetRequests) > 0 {
		paths := make([]string, 0, len(r.FleetRequests))
		for p := range r.FleetRequests {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		fmt.Fprintf(&b, "\nAgent calls the stand-in fleet answered:")
		for _, p := range paths {
			fmt.Fprintf(&b, " %s %d;", p, r.FleetRequests[p])
		}
		fmt.Fprintf(&b, " pods it could not serve: %d.\n", r.FleetErrors)
	}
	fmt.Fprintf(&b, "\nSimulated: %s.\n", r.Simulated)
	return b.String()
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func msf(seconds float64) string { return fmt.Sprintf("%.1f ms", seconds*1000) }

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// apiRequests is the manager's own requests to kube-apiserver by verb
// (client-go's rest_client_requests_total) between two scrapes.
func apiRequests(before, after metrics) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		name, labels, _ := strings.Cut(k, "{")
		if name != "rest_client_requests_total" {
			continue
		}
		i := strings.Index(labels, `method="`)
		if i < 0 {
			continue
		}
		m := labels[i+8:]
		m = m[:strings.IndexByte(m, '"')]
		out[m] += v - before[k]
	}
	return out
}

// reconciles is how many times the controller named ran between the two scrapes.
func reconciles(before, after metrics, controller string) float64 {
	var n float64
	for k, v := range after {
		name, labels, _ := strings.Cut(k, "{")
		if name == "controller_runtime_reconcile_total" && strings.Contains(labels, `controller="`+controller+`"`) {
			n += v - before[k]
		}
	}
	return n
}

func apiTable(title string, req map[string]float64, secs float64, per float64, perName string) table {
	t := table{Title: title, Header: []string{"verb", "requests", "per second", perName}}
	verbs := make([]string, 0, len(req))
	for v := range req {
		verbs = append(verbs, v)
	}
	sort.Strings(verbs)
	var total float64
	for _, v := range verbs {
		total += req[v]
		t.Rows = append(t.Rows, []string{v, fmt.Sprintf("%.0f", req[v]), fmt.Sprintf("%.1f", req[v]/secs), fmt.Sprintf("%.2f", req[v]/per)})
	}
	t.Rows = append(t.Rows, []string{"all", fmt.Sprintf("%.0f", total), fmt.Sprintf("%.1f", total/secs), fmt.Sprintf("%.2f", total/per)})
	return t
}

// progress tells, at most every 15 s, how a long wait stands, so that a run
// of minutes is not silent.
type progress struct{ last time.Time }

func (p *progress) say(format string, args ...any) {
	if time.Since(p.last) < 15*time.Second {
		return
	}
	if !p.last.IsZero() {
		fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...)
	}
	p.last = time.Now()
}
