package sandboxpod

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Conforms reports, with the first difference found, whether pod is built as
// New builds the pool's pods: anyone who may create pods in the namespace can
// give one the pool's labels, so a label says nothing about what runs there.
//
// Every pod must match what New would build now in what keeps a sandbox a
// sandbox: its runtime class, its one container (image, no command of its
// own, ports, security context, mounts), no init or ephemeral containers, no
// host namespaces, no service account token, the pod security context, only
// the scratch volumes New makes, and an agent that trusts the manager's key
// (trusted: the --trusted-keys value of the pod's key ID; "" skips that check
// while the keys are not loaded). A pod built from the current template
// (its template-hash label) must match its arguments and environment too; an
// older one may differ there (the pool's env, preloads or limits changed),
// but not in its image: runs go to a pod of another image only once it is
// built for the pool.
func Conforms(pod *corev1.Pod, pool *sandboxv1alpha1.SandboxPool, trusted string) error {
	want := New(pool, AgentKey{ID: pod.Labels[LabelAgentKey], Trusted: trusted})
	ps, ws := &pod.Spec, &want.Spec
	if a, b := ptrString(ps.RuntimeClassName), ptrString(ws.RuntimeClassName); a != b {
		return fmt.Errorf("runtime class %q, the pool's is %q", a, b)
	}
	if ps.HostNetwork || ps.HostPID || ps.HostIPC || (ps.ShareProcessNamespace != nil && *ps.ShareProcessNamespace) {
		return fmt.Errorf("shares a host or process namespace")
	}
	if len(ps.InitContainers) > 0 || len(ps.EphemeralContainers) > 0 || len(ps.Containers) != 1 {
		return fmt.Errorf("has containers other than %q", ContainerName)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		return fmt.Errorf("mounts a service account token")
	}
	if !equality.Semantic.DeepEqual(ps.SecurityContext, ws.SecurityContext) {
		return fmt.Errorf("pod security context differs from the pool's")
	}
	if !sameVolumes(ps.Volumes, ws.Volumes) {
		return fmt.Errorf("volumes differ from the pool's scratch volumes")
	}
	c, w := &ps.Containers[0], &ws.Containers[0]
	switch {
	case c.Name != w.Name:
		return fmt.Errorf("container %q, not %q", c.Name, w.Name)
	case c.Image != w.Image:
		return fmt.Errorf("image %q, the pool's is %q", c.Image, w.Image)
	case len(c.Command) > 0:
		return fmt.Errorf("container command overrides the image's agent")
	case !equality.Semantic.DeepEqual(c.SecurityContext, w.SecurityContext):
		return fmt.Errorf("container security context differs from the pool's")
	case !equality.Semantic.DeepEqual(c.VolumeMounts, w.VolumeMounts):
		return fmt.Errorf("volume mounts differ from the pool's")
	case !equality.Semantic.DeepEqual(c.Ports, w.Ports):
		return fmt.Errorf("ports differ from the pool's")
	case len(c.EnvFrom) > 0:
		return fmt.Errorf("container takes env from a ConfigMap or Secret")
	}
	if uid := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == EnvPodUID }); uid < 0 ||
		!equality.Semantic.DeepEqual(c.Env[uid], w.Env[len(w.Env)-1]) {
		return fmt.Errorf("%s is not the pod's own UID", EnvPodUID)
	}
	got, wantArgs := parseArgs(c.Args), parseArgs(w.Args)
	if got == nil || got.positional != wantArgs.positional {
		return fmt.Errorf("agent arguments are not the pool's")
	}
	if trusted == "" { // not known yet: compare the rest
		delete(got.flags, "trusted-keys")
		delete(wantArgs.flags, "trusted-keys")
	}
	current := pod.Labels[LabelTemplateHash] == want.Labels[LabelTemplateHash]
	for name, v := range got.flags {
		wv, ok := wantArgs.flags[name]
		if (!ok && !mayVary[name]) || (v != wv && (current || !mayVary[name])) {
			return fmt.Errorf("agent flag --%s is not the pool's", name)
		}
	}
	for name, wv := range wantArgs.flags {
		if _, ok := got.flags[name]; !ok && (current || !mayVary[name]) {
			return fmt.Errorf("agent flag --%s %s missing", name, wv)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "WARMPOOL_") && e.Name != EnvPodUID {
			return fmt.Errorf("environment sets %s, which only the agent's flags may set", e.Name)
		}
	}
	if current && !equality.Semantic.DeepEqual(c.Env, w.Env) {
		return fmt.Errorf("environment differs from the pool's")
	}
	return nil
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// sameVolumes: the same names, each an emptyDir of the same size and medium.
func sameVolumes(got, want []corev1.Volume) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.EmptyDir == nil || w.EmptyDir == nil ||
			!equality.Semantic.DeepEqual(g.VolumeSource, corev1.VolumeSource{EmptyDir: g.EmptyDir}) ||
			!equality.Semantic.DeepEqual(g.EmptyDir, w.EmptyDir) {
			return false
		}
	}
	return true
}

// mayVary are the agent flags a change of the pool's spec changes: a pod
// built from an older template may have other values, or lack them.
var mayVary = map[string]bool{"preload": true, "default-timeout": true, "max-timeout": true, "memory-limit": true,
	"max-processes": true, "egress-canary": true}

type agentArgs struct {
	positional string
	flags      map[string]string
}

// parseArgs reads args as the agent's flag package does (-f or --f, a value
// after "=" or as the next argument, the last of a repeated flag wins). Every
// flag New sets takes a value. Nil: not in that shape.
func parseArgs(args []string) *agentArgs {
	if len(args) == 0 {
		return nil
	}
	out := &agentArgs{positional: args[0], flags: map[string]string{}}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return nil // the flag package would stop here: more than New writes
		}
		name, v, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !hasValue {
			if i+1 == len(args) {
				return nil
			}
			i++
			v = args[i]
		}
		out.flags[name] = v
	}
	return out
}
