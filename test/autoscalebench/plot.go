package main

import (
	"fmt"
	"html"
	"strings"
	"time"
)

var colours = []string{"#d62728", "#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"}

// plot draws the run as an SVG: above, the trace's claims per second (5-s
// bins); below, each pool's idle pods over time (solid) and its
// spec.replicas (dotted).
func plot(title string, strategies []strategy, samples [][]sample, arrivals []arrival, span time.Duration) string {
	const (
		w, left, right = 900, 60, 150
		top1, h1       = 40, 120
		top2, h2       = 200, 260
		bin            = 5 * time.Second
	)
	plotW := float64(w - left - right)
	x := func(d time.Duration) float64 { return left + plotW*d.Seconds()/span.Seconds() }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, top2+h2+50)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", left, html.EscapeString(title))

	// Arrivals, as bars of claims per second.
	bins := make([]int, int(span/bin)+1)
	for _, a := range arrivals {
		bins[int(a.At/bin)]++
	}
	peak := 1.0
	for _, n := range bins {
		peak = max(peak, float64(n)/bin.Seconds())
	}
	for i, n := range bins {
		rate := float64(n) / bin.Seconds()
		bh := float64(h1) * rate / peak
		x0 := x(time.Duration(i) * bin)
		x1 := min(x(time.Duration(i+1)*bin), left+plotW)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#9467bd" opacity="0.6"/>`+"\n", x0, top1+h1-bh, max(x1-x0-1, 0.5), bh)
	}
	axes(&b, left, top1, plotW, h1, peak, "claims/s (5 s bins)")

	// Idle pods and replicas.
	ymax := 1.0
	for _, series := range samples {
		for _, s := range series {
			ymax = max(ymax, float64(s.idle), float64(s.replicas))
		}
	}
	ymax = float64(int(ymax*1.1) + 1)
	y := func(v float64) float64 { return top2 + h2 - float64(h2)*v/ymax }
	for i, st := range strategies {
		var idle, replicas []string
		for _, s := range samples[i] {
			if s.at > span {
				break
			}
			idle = append(idle, fmt.Sprintf("%.1f,%.1f", x(s.at), y(float64(s.idle))))
			replicas = append(replicas, fmt.Sprintf("%.1f,%.1f", x(s.at), y(float64(s.replicas))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`+"\n", colours[i%len(colours)], strings.Join(idle, " "))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1" stroke-dasharray="2,3" points="%s"/>`+"\n", colours[i%len(colours)], strings.Join(replicas, " "))
		ly := top2 + 20 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			w-right+10, ly, w-right+30, ly, colours[i%len(colours)], w-right+35, ly+4, st.name)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">solid: idle pods</text><text x="%d" y="%d" fill="#555">dotted: replicas</text>`+"\n",
		w-right+10, top2+20+20*len(strategies)+10, w-right+10, top2+20+20*len(strategies)+26)
	axes(&b, left, top2, plotW, h2, ymax, "idle pods")
	for s := 0.0; s <= span.Seconds(); s += 30 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n", x(time.Duration(s*float64(time.Second))), top2+h2+16, s)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">seconds into the trace</text>`+"\n", left+plotW/2, top2+h2+36)
	b.WriteString("</svg>\n")
	return b.String()
}

// axes draws a panel's frame with three labelled ticks on its y axis.
func axes(b *strings.Builder, left, top int, width float64, height int, ymax float64, label string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, width, height)
	for _, f := range []float64{0, 0.5, 1} {
		yy := float64(top+height) - f*float64(height)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%.3g</text>`+"\n", left-4, yy+4, f*ymax)
	}
	fmt.Fprintf(b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`+"\n", top+height/2, top+height/2, label)
}
