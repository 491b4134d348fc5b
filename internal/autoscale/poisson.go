package autoscale

import "math"

// PoissonQuantile is the least k with P(X <= k) >= q for X ~ Poisson(mean):
// how many warm pods cover the claims that arrive, at rate r, during one
// start-up time T (mean = r*T) with probability q.
func PoissonQuantile(mean, q float64) int {
	switch {
	case mean <= 0 || q <= 0:
		return 0
	case q >= 1:
		q = 1 - 1e-12
	}
	// The sum starts ten standard deviations below the mean, where the mass
	// left out is below 1e-20, with the first term in log space (exp(-mean)
	// alone underflows for large means).
	k := max(0, int(math.Floor(mean-10*math.Sqrt(mean))))
	lg, _ := math.Lgamma(float64(k) + 1)
	pmf := math.Exp(float64(k)*math.Log(mean) - mean - lg)
	cdf := pmf
	for cdf < q {
		k++
		pmf *= mean / float64(k)
		cdf += pmf
		if pmf == 0 && float64(k) > mean { // rounding: the tail adds nothing more
			break
		}
	}
	return k
}
