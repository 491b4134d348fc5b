package sandboxpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func list(cpu, mem string) corev1.ResourceList {
	l := corev1.ResourceList{}
	if cpu != "" {
		l[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		l[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	return l
}

func TestSandboxResources(t *testing.T) {
	cases := []struct {
		name         string
		in           corev1.ResourceRequirements
		wantLimits   corev1.ResourceList
		wantRequests corev1.ResourceList
	}{
		{"empty, as Go clients send it", corev1.ResourceRequirements{},
			list("1", "512Mi"), list("10m", "128Mi")},
		{"limits only: default requests below them", corev1.ResourceRequirements{Limits: list("2", "1Gi")},
			list("2", "1Gi"), list("10m", "128Mi")},
		{"a limit below the default request caps the request", corev1.ResourceRequirements{Limits: list("5m", "64Mi")},
			list("5m", "64Mi"), list("5m", "64Mi")},
		{"a request above the default limit raises the limit", corev1.ResourceRequirements{Requests: list("2", "1Gi")},
			list("2", "1Gi"), list("2", "1Gi")},
		{"explicit values are kept", corev1.ResourceRequirements{Limits: list("3", "3Gi"), Requests: list("1", "1Gi")},
			list("3", "3Gi"), list("1", "1Gi")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := sandboxResources(tc.in)
			for _, c := range []struct {
				what      string
				got, want corev1.ResourceList
			}{{"limits", got.Limits, tc.wantLimits}, {"requests", got.Requests, tc.wantRequests}} {
				for name, want := range c.want {
					if q := c.got[name]; q.Cmp(want) != 0 {
						t.Errorf("%s %s = %s, want %s", c.what, name, q.String(), want.String())
					}
				}
			}
		})
	}
}
