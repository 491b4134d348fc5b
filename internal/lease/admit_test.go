package lease

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/sandboxpod"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

type keys map[string]string

func (k keys) Loaded() bool { return k != nil }
func (k keys) Trusted(id string) (string, bool) {
	v, ok := k[id]
	return v, ok
}

// builtPod is a pod as pool's controller builds and owns it.
func builtPod(pool *sandboxv1alpha1.SandboxPool) *corev1.Pod {
	p := sandboxpod.New(pool, sandboxpod.AgentKey{ID: "k1", Trusted: "k1=PUBLIC"})
	p.Name = "python-abcde"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxPool",
		Name: pool.Name, UID: pool.UID, Controller: ptr.To(true)}}
	return p
}

func TestAdmits(t *testing.T) {
	pool := wrappers.Pool("ns", "python").Obj()
	pool.UID = "pool-uid"
	pool.Spec.RuntimeClassName = ptr.To("gvisor") // the CRD's default
	ring := keys{"k1": "k1=PUBLIC"}
	build := func() *corev1.Pod { return builtPod(pool) }
	if err := Admits(pool, build(), ring); err != nil {
		t.Fatalf("a pod the pool built: %v", err)
	}
	older := build()
	older.Labels[sandboxpod.LabelTemplateHash] = "older"
	older.Spec.Containers[0].Args = append(older.Spec.Containers[0].Args, "--preload", "numpy")
	older.Spec.Containers[0].Env = append(older.Spec.Containers[0].Env, corev1.EnvVar{Name: "OLD", Value: "1"})
	if err := Admits(pool, older, ring); err != nil {
		t.Errorf("a pod of an older template with other preloads and env: %v", err)
	}
	if err := Admits(pool, build(), keys(nil)); err != nil {
		t.Errorf("before the keys are loaded: %v", err)
	}

	for name, change := range map[string]func(*corev1.Pod){
		"no owner":           func(p *corev1.Pod) { p.OwnerReferences = nil },
		"not the controller": func(p *corev1.Pod) { p.OwnerReferences[0].Controller = nil },
		"another pool's UID": func(p *corev1.Pod) { p.OwnerReferences[0].UID = "other" },
		"runc":               func(p *corev1.Pod) { p.Spec.RuntimeClassName = nil },
		"another image":      func(p *corev1.Pod) { p.Spec.Containers[0].Image = "tenant/agent:1" },
		"a command":          func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh"} },
		"a second container": func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "spy"}) },
		"an init container":  func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "init"}} },
		"host network":       func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"a token":            func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) },
		"privileged":         func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true) },
		"root":               func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsUser = ptr.To[int64](0) },
		"a hostPath": func(p *corev1.Pod) {
			p.Spec.Volumes[0].EmptyDir, p.Spec.Volumes[0].HostPath = nil, &corev1.HostPathVolumeSource{Path: "/"}
		},
		"another key":          func(p *corev1.Pod) { setArg(p, "--trusted-keys", "k1=TENANT") },
		"a key it cannot sign": func(p *corev1.Pod) { p.Labels[sandboxpod.LabelAgentKey] = "k9" },
		"no auth": func(p *corev1.Pod) {
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--insecure-no-auth=true")
		},
		"a repeated key flag": func(p *corev1.Pod) {
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "-trusted-keys=k1=TENANT")
		},
		"an env of the agent's": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "WARMPOOL_AGENT_TOKEN", Value: "x"})
		},
		"a fixed pod UID": func(p *corev1.Pod) {
			env := p.Spec.Containers[0].Env
			env[len(env)-1] = corev1.EnvVar{Name: sandboxpod.EnvPodUID, Value: "another-pods-uid"}
		},
		"other env, current template": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "PYTHONPATH", Value: "/tmp"})
		},
		"no auth, older template": func(p *corev1.Pod) {
			p.Labels[sandboxpod.LabelTemplateHash] = "older"
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--insecure-no-auth", "true")
		},
		"another python, older template": func(p *corev1.Pod) {
			p.Labels[sandboxpod.LabelTemplateHash] = "older"
			p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--python", "/workspace/py")
		},
	} {
		p := build()
		change(p)
		if err := Admits(pool, p, ring); err == nil {
			t.Errorf("%s: admitted", name)
		}
	}
}

func setArg(p *corev1.Pod, flag, v string) {
	args := p.Spec.Containers[0].Args
	for i := range args {
		if args[i] == flag {
			args[i+1] = v
		}
	}
}

func TestMayServe(t *testing.T) {
	pool := wrappers.Pool("ns", "python").Obj()
	pool.UID = "pool-uid"
	pool.Spec.RuntimeClassName = ptr.To("gvisor")
	ring := keys{"k1": "k1=PUBLIC"}
	p := sandboxpod.New(pool, sandboxpod.AgentKey{ID: "k1", Trusted: "k1=PUBLIC"})
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "SandboxPool",
		Name: pool.Name, UID: pool.UID, Controller: ptr.To(true)}}
	p.Labels[sandboxpod.LabelSession] = "notebook"
	newer := pool.DeepCopy()
	newer.Spec.Image = "warmpool.dev/repl:next"
	if err := MayServe(newer, p, ring); err != nil {
		t.Errorf("a Session's pod after its pool's image changed: %v", err)
	}
	if err := Admits(newer, p, ring); err == nil {
		t.Errorf("a new lease on a pod of the old image was admitted")
	}
	free := p.DeepCopy()
	delete(free.Labels, sandboxpod.LabelSession)
	if err := MayServe(newer, free, ring); err == nil {
		t.Errorf("a free pod of the old image may serve a new lease")
	}
	foreign := p.DeepCopy()
	foreign.OwnerReferences = nil
	if err := MayServe(pool, foreign, ring); err == nil {
		t.Errorf("a session-labelled pod the pool does not own may serve")
	}
	if err := MayServe(pool, p, keys{"k2": "k2=OTHER"}); err == nil {
		t.Errorf("a pod whose key the manager lost may serve")
	}
}
