package autoscale

import (
	"math"
	"testing"
)

func TestPoissonQuantile(t *testing.T) {
	for _, tc := range []struct {
		mean, q float64
		want    int
	}{
		{0, 0.99, 0},
		{1, 0, 0},
		{0.01, 0.99, 0},  // P(X=0) = 0.990
		{0.02, 0.99, 1},  // P(X=0) = 0.980
		{1, 0.5, 1},      // P(X<=0) = 0.368, P(X<=1) = 0.736
		{1, 0.99, 4},     // P(X<=3) = 0.981, P(X<=4) = 0.996
		{2, 0.99, 6},     // P(X<=5) = 0.983, P(X<=6) = 0.9955
		{10, 0.99, 18},   // P(X<=17) = 0.9857, P(X<=18) = 0.9928
		{10, 0.999, 21},  // P(X<=20) = 0.9984, P(X<=21) = 0.9993
		{100, 0.99, 124}, // tables: 124
	} {
		if got := PoissonQuantile(tc.mean, tc.q); got != tc.want {
			t.Errorf("PoissonQuantile(%v, %v) = %d, want %d", tc.mean, tc.q, got, tc.want)
		}
	}
}

// Large means: the quantile grows with the mean and sits where the normal
// approximation (with its skew term) puts it.
func TestPoissonQuantileLargeMeans(t *testing.T) {
	for _, mean := range []float64{500, 501, 10_000, 1e6} {
		for _, q := range []float64{0.9, 0.99, 0.999} {
			z := map[float64]float64{0.9: 1.2816, 0.99: 2.3263, 0.999: 3.0902}[q]
			approx := mean + z*math.Sqrt(mean) + (z*z-1)/6
			got := PoissonQuantile(mean, q)
			if math.Abs(float64(got)-approx) > 1.5 {
				t.Errorf("PoissonQuantile(%v, %v) = %d, approximation %.1f", mean, q, got, approx)
			}
			if got < PoissonQuantile(mean-1, q) {
				t.Errorf("PoissonQuantile(%v, %v) fell below the one of mean-1", mean, q)
			}
		}
	}
}
