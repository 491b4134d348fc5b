package main

import (
	"math"
	"strings"
	"testing"
)

func TestQuantileOfHistogramBetweenScrapes(t *testing.T) {
	before, err := parseMetrics(strings.NewReader(`# HELP x_seconds x
x_seconds_bucket{le="0.01"} 10
x_seconds_bucket{le="0.1"} 10
x_seconds_bucket{le="1"} 10
x_seconds_bucket{le="+Inf"} 10
`))
	if err != nil {
		t.Fatal(err)
	}
	// 100 new observations: 50 under 10 ms, 40 in (10 ms, 100 ms], 10 in (100 ms, 1 s].
	after, err := parseMetrics(strings.NewReader(`x_seconds_bucket{le="0.01"} 60
x_seconds_bucket{le="0.1"} 100
x_seconds_bucket{le="1"} 110
x_seconds_bucket{le="+Inf"} 110
rest_client_requests_total{code="201",host="h",method="POST"} 7
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.01}, {0.7, 0.055}, {0.95, 0.55}} {
		if got := quantile(c.q, "x_seconds", before, after); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%.2f = %g, want %g", c.q, got, c.want)
		}
	}
	if got := apiRequests(metrics{}, after)["POST"]; got != 7 {
		t.Errorf("POST requests %g, want 7", got)
	}
}
