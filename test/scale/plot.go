package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// cdfPlot draws, as an SVG, the share of claims Ready within each latency
// (log scale, 10 ms to 10 s), with the gate's p99 marked.
func cdfPlot(title string, sorted []time.Duration, gate time.Duration) string {
	const w, h, left, top, plotW, plotH = 720, 360, 60, 40, 620, 260
	lo, hi := math.Log10(10), math.Log10(10000) // ms
	x := func(d time.Duration) float64 {
		ms := math.Max(10, math.Min(10000, float64(d.Microseconds())/1000))
		return left + plotW*(math.Log10(ms)-lo)/(hi-lo)
	}
	y := func(share float64) float64 { return top + plotH*(1-share) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", left, html.EscapeString(title))
	for _, ms := range []int{10, 30, 100, 300, 1000, 3000, 10000} {
		xx := x(time.Duration(ms) * time.Millisecond)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%d ms</text>`+"\n", xx, top, xx, top+plotH, xx, top+plotH+16, ms)
	}
	for _, s := range []float64{0, 0.5, 0.9, 0.99, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%g%%</text>`+"\n", left, y(s), left+plotW, y(s), left-6, y(s)+4, s*100)
	}
	if gate > 0 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/><text x="%.1f" y="%d" fill="#d62728">gate p99 %s</text>`+"\n", x(gate), top, x(gate), top+plotH, x(gate)+4, top+12, gate)
	}
	var pts []string
	for i, d := range sorted {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(d), y(float64(i+1)/float64(len(sorted)))))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="%d" y="%d">create → Ready (client), share of Sessions</text></svg>`+"\n", left, h-8)
	return b.String()
}
