package sandboxpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

func TestScratchVolumesAreSizedInsideGVisor(t *testing.T) {
	pool := &sandboxv1alpha1.SandboxPool{}
	pool.Name, pool.Namespace = "py", "ns"
	pool.Spec.Limits.TmpSize = ptr.To(resource.MustParse("64Mi"))
	// A template may carry annotations, but not change how the sandbox's
	// directories are mounted.
	pool.Spec.Template = &sandboxv1alpha1.SandboxPodTemplate{}
	pool.Spec.Template.Metadata.Annotations = map[string]string{
		"dev.gvisor.spec.mount.tmp.options": "rw",
		"example.com/team":                  "a",
	}
	pod := New(pool, AgentKey{ID: "k", Trusted: "t"})

	want := map[string]string{
		"dev.gvisor.spec.mount.workspace.type":    "bind",
		"dev.gvisor.spec.mount.workspace.share":   "container",
		"dev.gvisor.spec.mount.workspace.options": "rw,size=1073741824,mode=1777",
		"dev.gvisor.spec.mount.tmp.type":          "bind",
		"dev.gvisor.spec.mount.tmp.share":         "container",
		"dev.gvisor.spec.mount.tmp.options":       "rw,size=67108864,mode=1777",
		"example.com/team":                        "a",
	}
	for k, v := range want {
		if got := pod.Annotations[k]; got != v {
			t.Errorf("annotation %s = %q, want %q", k, got, v)
		}
	}

	mounts := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["workspace"] != WorkspaceDir || mounts["tmp"] != "/tmp" {
		t.Errorf("mounts = %v", mounts)
	}
	// The kubelet's limit sits above the size: the code meets ENOSPC first.
	evict := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumDefault || v.EmptyDir.SizeLimit == nil {
			t.Fatalf("volume %s is not an emptyDir on disk with a sizeLimit: %+v", v.Name, v.VolumeSource)
		}
		evict[v.Name] = v.EmptyDir.SizeLimit.String()
	}
	if evict["workspace"] != "1152Mi" || evict["tmp"] != "80Mi" {
		t.Errorf("sizeLimits = %v, want workspace 1152Mi (size + 1/8), tmp 80Mi (size + 16Mi)", evict)
	}

	workspace, tmp := ScratchSizes(pool)
	if workspace.String() != "1Gi" || tmp.String() != "64Mi" {
		t.Errorf("ScratchSizes = %s, %s", workspace.String(), tmp.String())
	}
}
