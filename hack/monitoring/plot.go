package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warmpool/warmpool/internal/monitoring"
)

// series is one line of a panel: its legend and its points.
type series struct {
	name   string
	points [][2]float64 // unix seconds, value
}

// panelData is one panel's answers.
type panelData struct {
	title, unit string
	lines       []series
}

func plotCmd(args []string) error {
	fs := flag.NewFlagSet("plot", flag.ExitOnError)
	prom := fs.String("prometheus", "http://127.0.0.1:9090", "Prometheus base URL")
	out := fs.String("out", "docs/monitoring-dashboard.svg", "SVG to write")
	window := fs.Duration("window", 20*time.Minute, "time range, ending now")
	step := fs.Duration("step", 15*time.Second, "query resolution")
	rate := fs.String("rate-interval", "1m", "what $__rate_interval stands for (4 scrape intervals)")
	only := fs.String("panels", "", "comma-separated panel titles to draw (default: all that return data)")
	cols := fs.Int("columns", 3, "panels per row")
	_ = fs.Parse(args)

	d, err := monitoring.LoadDashboard(dashboardPath)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, t := range strings.Split(*only, ",") {
		if t != "" {
			want[t] = true
		}
	}
	end := time.Now()
	start := end.Add(-*window)
	var panels []*panelData
	byTitle := map[string]*panelData{}
	for _, q := range d.Queries {
		if len(want) > 0 && !want[q.Panel] {
			continue
		}
		expr, err := monitoring.Expand(q.Expr, *rate)
		if err != nil {
			return err
		}
		lines, err := queryRange(*prom, expr, q.Legend, start, end, *step)
		if err != nil {
			return fmt.Errorf("panel %q: %w", q.Panel, err)
		}
		p := byTitle[q.Panel]
		if p == nil {
			p = &panelData{title: q.Panel, unit: q.Unit}
			byTitle[q.Panel] = p
			panels = append(panels, p)
		}
		p.lines = append(p.lines, lines...)
	}
	var drawn []*panelData
	for _, p := range panels {
		if len(p.lines) > 0 {
			drawn = append(drawn, p)
		}
	}
	if len(drawn) == 0 {
		return fmt.Errorf("no panel returned data from %s", *prom)
	}
	svg := draw(d.Title, drawn, start, end, *cols)
	fmt.Printf("%d of %d panels with data\n", len(drawn), len(panels))
	return os.WriteFile(*out, []byte(svg), 0o644)
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

func queryRange(base, expr, legend string, start, end time.Time, step time.Duration) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
		"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	resp, err := http.Get(strings.TrimRight(base, "/") + "/api/v1/query_range?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query_range %q: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query_range %q: %s", expr, body.Error)
	}
	var out []series
	for _, r := range body.Data.Result {
		name := legendVar.ReplaceAllStringFunc(legend, func(m string) string {
			return r.Metric[legendVar.FindStringSubmatch(m)[1]]
		})
		if name == "" {
			name = expr
		}
		s := series{name: name}
		for _, v := range r.Values {
			t, _ := v[0].(float64)
			str, _ := v[1].(string)
			f, err := strconv.ParseFloat(str, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			s.points = append(s.points, [2]float64{t, f})
		}
		if len(s.points) > 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// draw lays the panels out in a grid, each with its axes, lines and legend.
func draw(title string, panels []*panelData, start, end time.Time, cols int) string {
	const pw, ph, pad, top = 420, 250, 16, 40
	rows := (len(panels) + cols - 1) / cols
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n",
		cols*(pw+pad)+pad, top+rows*(ph+pad))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#f4f5f5"/><text x="%d" y="26" font-size="16">%s: Prometheus answers to the dashboard's queries, %s to %s UTC</text>`+"\n",
		pad, html.EscapeString(title), start.UTC().Format("2006-01-02 15:04"), end.UTC().Format("15:04"))
	for i, p := range panels {
		x0 := pad + (i%cols)*(pw+pad)
		y0 := top + (i/cols)*(ph+pad)
		drawPanel(&b, p, float64(x0), float64(y0), pw, ph, start, end)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func drawPanel(b *strings.Builder, p *panelData, x0, y0 float64, w, h int, start, end time.Time) {
	const left, right, titleH, legendLine = 52, 10, 22, 13
	lines := p.lines
	if len(lines) > 6 {
		lines = lines[:6]
	}
	legendH := float64(len(lines)*legendLine + 6)
	plotW := float64(w) - left - right
	plotH := float64(h) - titleH - legendH - 18
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="white" stroke="#d8d9da"/>`+"\n", x0, y0, w, h)
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-size="13">%s</text>`+"\n", x0+8, y0+16, html.EscapeString(p.title))
	lo, hi := 0.0, 0.0
	for _, s := range lines {
		for _, pt := range s.points {
			lo, hi = math.Min(lo, pt[1]), math.Max(hi, pt[1])
		}
	}
	if hi == lo {
		hi = lo + 1
	}
	hi *= 1.08
	px := func(t float64) float64 {
		return x0 + left + plotW*(t-float64(start.Unix()))/float64(end.Unix()-start.Unix())
	}
	py := func(v float64) float64 { return y0 + titleH + plotH - plotH*(v-lo)/(hi-lo) }
	for i := 0; i <= 4; i++ {
		v := lo + (hi-lo)*float64(i)/4
		y := py(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eeeeee"/>`+"\n", x0+left, y, x0+left+plotW, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", x0+left-4, y+4, format(v, p.unit))
	}
	for i := 0; i <= 4; i++ {
		t := start.Add(time.Duration(i) * end.Sub(start) / 4)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n",
			px(float64(t.Unix())), y0+titleH+plotH+13, t.UTC().Format("15:04"))
	}
	for i, s := range lines {
		colour := palette[i%len(palette)]
		var pts []string
		for _, pt := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(pt[0]), py(pt[1])))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colour, strings.Join(pts, " "))
		ly := y0 + float64(h) - legendH + float64(i*legendLine) + 10
		name := s.name
		if len(name) > 60 {
			name = name[:57] + "..."
		}
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="10" height="3" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			x0+left, ly-4, colour, x0+left+14, ly, html.EscapeString(name))
	}
	if len(p.lines) > len(lines) {
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" fill="#555">+%d more</text>`+"\n", x0+float64(w)-70, y0+16, len(p.lines)-len(lines))
	}
}

// format writes an axis value in the panel's unit.
func format(v float64, unit string) string {
	switch unit {
	case "percentunit":
		return fmt.Sprintf("%.0f%%", v*100)
	case "s":
		if v != 0 && math.Abs(v) < 1 {
			return fmt.Sprintf("%.0fms", v*1000)
		}
		return fmt.Sprintf("%.3gs", v)
	case "reqps":
		return fmt.Sprintf("%.3g/s", v)
	}
	return fmt.Sprintf("%.3g", v)
}
