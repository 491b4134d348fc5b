//go:build helmchart

// The chart's check, run by `make helm-check` (and so by `make verify`), which
// builds helm and kustomize first and passes them in HELM and KUSTOMIZE: the
// committed chart is what the generator writes now, the chart renders with
// its default values exactly the objects of kustomize's builds (Helm's labels
// aside, and the Namespace, which is the release's), the opt-in parts render
// config/prometheus and config/guardrails, and each value changes what it
// says. The build tag keeps it out of `go test ./...`, which has no helm.
package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

const (
	chartDir  = "../../charts/warmpool"
	configDir = "../../config"
)

// helmLabels are the labels the chart adds to every object (warmpool.labels);
// app.kubernetes.io/name is among them only where config/ does not set it.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"}

type object = map[string]any

func tool(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Fatalf("%s must name the binary: run `make helm-check`, which builds it", env)
	}
	return p
}

func command(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// objects decodes a multi-document stream, by apiVersion/kind/namespace/name.
func objects(t *testing.T, b []byte) map[string]object {
	t.Helper()
	out := map[string]object{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decode: %v", err)
		}
		if o == nil {
			continue
		}
		k := id(o)
		if _, dup := out[k]; dup {
			t.Fatalf("%s twice", k)
		}
		out[k] = o
	}
}

func id(o object) string {
	md, _ := o["metadata"].(object)
	return strings.Join([]string{str0(o["apiVersion"]), str0(o["kind"]), str0(md["namespace"]), str0(md["name"])}, "/")
}

func str0(v any) string {
	s, _ := v.(string)
	return s
}

func kustomizeBuild(t *testing.T, dirs ...string) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, dir := range dirs {
		for k, o := range objects(t, command(t, tool(t, "KUSTOMIZE"), "build", filepath.Join(configDir, dir))) {
			if o["kind"] == "Namespace" {
				continue // the release's namespace: helm install --create-namespace
			}
			out[k] = o
		}
	}
	return out
}

// render runs helm template on the chart in namespace ns with more
// arguments (--set, -f).
func render(t *testing.T, ns string, args ...string) map[string]object {
	t.Helper()
	args = append([]string{"template", "warmpool", chartDir, "--namespace", ns}, args...)
	return objects(t, command(t, tool(t, "HELM"), args...))
}

// values writes a values file for -f.
func values(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// sameObjects fails unless got holds exactly want's objects, equal but for
// Helm's labels, which every one of got must carry.
func sameObjects(t *testing.T, want, got map[string]object) {
	t.Helper()
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart renders %s, which kustomize does not build", k)
		}
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart does not render %s", k)
			continue
		}
		gl := labels(g)
		for _, l := range helmLabels {
			if gl[l] == nil {
				t.Errorf("%s: no label %s", k, l)
			}
		}
		if gl["app.kubernetes.io/managed-by"] != "Helm" || gl["app.kubernetes.io/name"] != appName {
			t.Errorf("%s: labels %v", k, gl)
		}
		wl := labels(w)
		delete(wl, "app.kubernetes.io/managed-by") // kustomize's
		for _, l := range helmLabels {
			delete(gl, l)
		}
		if _, ok := wl["app.kubernetes.io/name"]; !ok {
			delete(gl, "app.kubernetes.io/name")
		}
		for _, o := range []object{w, g} {
			if len(labels(o)) == 0 {
				delete(o["metadata"].(object), "labels")
			}
		}
		if d := cmp.Diff(w, g); d != "" {
			t.Errorf("%s differs from kustomize's (-kustomize +helm):\n%s", k, d)
		}
	}
}

// labels is o's labels map, made if missing, so that deleting from it edits o.
func labels(o object) object {
	md := o["metadata"].(object)
	l, _ := md["labels"].(object)
	if l == nil {
		l = object{}
		md["labels"] = l
	}
	return l
}

func TestChartIsCurrent(t *testing.T) {
	var chart struct{ Version string }
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	fresh := t.TempDir()
	if err := run(tool(t, "KUSTOMIZE"), configDir, fresh, chart.Version); err != nil {
		t.Fatal(err)
	}
	want, got := tree(t, fresh), tree(t, chartDir)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("charts/warmpool is not what hack/helmchart writes from config/ now: run make helm (-generated +committed):\n%s", d)
	}
}

func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDefaultsRenderKustomize(t *testing.T) {
	sameObjects(t, kustomizeBuild(t, "default", "runtimeclass", "apiservice", "admission"), render(t, namespace))
}

func TestOptInsRenderKustomize(t *testing.T) {
	on := []string{"--set", "guardrails.enabled=true,metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true"}
	sameObjects(t, kustomizeBuild(t, sources...), render(t, namespace, on...))
	command(t, tool(t, "HELM"), append([]string{"lint", "--strict", chartDir}, on...)...)
}

// dig follows a path of map keys and list indexes (ints).
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(object)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func deployment(t *testing.T, objs map[string]object, ns string) object {
	t.Helper()
	d := objs["apps/v1/Deployment/"+ns+"/warmpool-controller-manager"]
	if d == nil {
		t.Fatal("no Deployment warmpool-controller-manager")
	}
	return d
}

func container(t *testing.T, objs map[string]object) object {
	t.Helper()
	return dig(deployment(t, objs, namespace), "spec", "template", "spec", "containers", 0).(object)
}

func args(t *testing.T, objs map[string]object) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, objs)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

// deploymentArgs returns the args of Deployment name's first container.
func deploymentArgs(t *testing.T, objs map[string]object, name string) []string {
	t.Helper()
	d := objs["apps/v1/Deployment/"+namespace+"/"+name]
	if d == nil {
		t.Fatalf("no Deployment %s", name)
	}
	var out []string
	for _, a := range dig(d, "spec", "template", "spec", "containers", 0).(object)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

func ofKind(objs map[string]object, kind string) []object {
	var out []object
	for _, o := range objs {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestValues(t *testing.T) {
	defaults := render(t, namespace)
	for _, tc := range []struct {
		name   string
		values string
		check  func(t *testing.T, objs map[string]object)
	}{{
		name:   "replicas",
		values: "manager: {replicas: 2}",
		check: func(t *testing.T, objs map[string]object) {
			if r := dig(deployment(t, objs, namespace), "spec", "replicas"); r != 2 {
				t.Errorf("replicas %v", r)
			}
		},
	}, {
		name:   "image",
		values: "manager: {image: {repository: registry.example/warmpool/manager, tag: v1.2.3, pullPolicy: Always}}",
		check: func(t *testing.T, objs map[string]object) {
			c := container(t, objs)
			if c["image"] != "registry.example/warmpool/manager:v1.2.3" || c["imagePullPolicy"] != "Always" {
				t.Errorf("image %v, pull policy %v", c["image"], c["imagePullPolicy"])
			}
		},
	}, {
		name:   "image digest",
		values: "manager: {image: {tag: 'sha256:0123'}}",
		check: func(t *testing.T, objs map[string]object) {
			if c := container(t, objs); c["image"] != "warmpool.dev/manager@sha256:0123" {
				t.Errorf("image %v", c["image"])
			}
		},
	}, {
		name:   "shared pools",
		values: "sharedPools: {namespaces: [platform-a, platform-b]}",
		check: func(t *testing.T, objs map[string]object) {
			for _, d := range []string{"warmpool-controller-manager", "warmpool-data-plane"} {
				if a := deploymentArgs(t, objs, d); !slices.Contains(a, "--shared-pool-namespaces=platform-a,platform-b") {
					t.Errorf("%s args %v: want --shared-pool-namespaces=platform-a,platform-b", d, a)
				}
			}
		},
	}, {
		name:   "no shared pools",
		values: "sharedPools: {namespaces: []}",
		check: func(t *testing.T, objs map[string]object) {
			if a := deploymentArgs(t, objs, "warmpool-controller-manager"); !slices.Contains(a, "--shared-pool-namespaces=") {
				t.Errorf("args %v: want --shared-pool-namespaces= (none)", a)
			}
		},
	}, {
		name:   "snapshot store",
		values: "snapshots: {store: {endpoint: 's3.storage:9000', insecure: true, credentialsSecret: s3-creds}, maxBytes: 1048576}",
		check: func(t *testing.T, objs map[string]object) {
			a := args(t, objs)
			for _, want := range []string{"--snapshot-store-endpoint=s3.storage:9000", "--snapshot-store-bucket=warmpool-snapshots",
				"--snapshot-store-insecure", "--snapshot-max-bytes=1048576"} {
				if !slices.Contains(a, want) {
					t.Errorf("args %v lack %s", a, want)
				}
			}
			if name := dig(container(t, objs), "envFrom", 0, "secretRef", "name"); name != "s3-creds" {
				t.Errorf("envFrom %v", container(t, objs)["envFrom"])
			}
		},
	}, {
		name:   "no leader election",
		values: "manager: {leaderElection: {enabled: false}}",
		check: func(t *testing.T, objs map[string]object) {
			if a := args(t, objs); slices.Contains(a, "--leader-elect") {
				t.Errorf("args %v", a)
			}
		},
	}, {
		name: "manager extras",
		values: `manager:
  resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {cpu: null, memory: 1Gi}}
  extraArgs: [--zap-log-level=debug]
  env: [{name: HTTPS_PROXY, value: "http://proxy:3128"}]
  podAnnotations: {example.com/a: "1", kubectl.kubernetes.io/default-container: other}
  podLabels: {team: platform, control-plane: other}
  imagePullSecrets: [{name: pull}]
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Exists}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}
`,
		check: func(t *testing.T, objs map[string]object) {
			d := deployment(t, objs, namespace)
			c := container(t, objs)
			if r := c["resources"]; !reflect.DeepEqual(r, object{"requests": object{"cpu": "100m", "memory": "128Mi"}, "limits": object{"memory": "1Gi"}}) {
				t.Errorf("resources %v", r)
			}
			if a := args(t, objs); a[len(a)-1] != "--zap-log-level=debug" {
				t.Errorf("args %v", a)
			}
			if e := dig(c, "env", 1, "value"); e != "http://proxy:3128" || dig(c, "env", 0, "name") != "POD_NAMESPACE" {
				t.Errorf("env %v", c["env"])
			}
			pod := dig(d, "spec", "template").(object)
			ann, lab := dig(pod, "metadata", "annotations").(object), dig(pod, "metadata", "labels").(object)
			if ann["example.com/a"] != "1" || ann["kubectl.kubernetes.io/default-container"] != "manager" {
				t.Errorf("pod annotations %v", ann)
			}
			if lab["team"] != "platform" || lab["control-plane"] != "controller-manager" {
				t.Errorf("pod labels %v", lab)
			}
			for _, k := range []string{"imagePullSecrets", "nodeSelector", "tolerations", "affinity"} {
				if dig(pod, "spec", k) == nil {
					t.Errorf("no %s", k)
				}
			}
		},
	}, {
		name:   "metrics off",
		values: "metrics: {enabled: false, serviceMonitor: {enabled: true}}",
		check: func(t *testing.T, objs map[string]object) {
			if a := args(t, objs); !slices.Contains(a, "--metrics-bind-address=0") {
				t.Errorf("args %v", a)
			}
			if _, ok := objs["v1/Service/"+namespace+"/warmpool-controller-manager-metrics-service"]; ok {
				t.Error("a metrics Service")
			}
			if len(ofKind(objs, "ServiceMonitor")) != 0 {
				t.Error("a ServiceMonitor without metrics")
			}
			ports, _ := container(t, objs)["ports"].([]any) // none left
			for _, p := range ports {
				if p.(object)["name"] == "metrics" {
					t.Error("a metrics port")
				}
			}
		},
	}, {
		name:   "metrics over HTTP",
		values: "metrics: {secure: false, serviceMonitor: {enabled: true}}",
		check: func(t *testing.T, objs map[string]object) {
			if a := args(t, objs); !slices.Contains(a, "--metrics-secure=false") || !slices.Contains(a, "--metrics-bind-address=:8443") {
				t.Errorf("args %v", a)
			}
			svc := objs["v1/Service/"+namespace+"/warmpool-controller-manager-metrics-service"]
			if n := dig(svc, "spec", "ports", 0, "name"); n != "http" {
				t.Errorf("Service port %v", n)
			}
			sm := ofKind(objs, "ServiceMonitor")
			if len(sm) != 1 || dig(sm[0], "spec", "endpoints", 0, "port") != "http" || dig(sm[0], "spec", "endpoints", 0, "scheme") != "http" {
				t.Errorf("ServiceMonitor %v", sm)
			}
		},
	}, {
		name:   "no data plane",
		values: "dataPlane: {enabled: false}",
		check: func(t *testing.T, objs map[string]object) {
			if a := args(t, objs); !slices.Contains(a, "--mode=controllers") {
				t.Errorf("args %v", a)
			}
			for k := range objs {
				if strings.Contains(k, "data-plane") || strings.Contains(k, "APIService") {
					t.Errorf("%s without the data plane", k)
				}
			}
		},
	}, {
		name: "data plane",
		values: `manager: {image: {repository: registry.example/warmpool/manager, tag: v1.2.3}, imagePullSecrets: [{name: pull}]}
dataPlane:
  replicas: 3
  resources: {requests: {cpu: 200m}}
  extraArgs: [--zap-log-level=debug]
  env: [{name: GODEBUG, value: "x=1"}]
  podLabels: {team: platform, control-plane: other}
  nodeSelector: {kubernetes.io/os: linux}
metrics: {enabled: false}
`,
		check: func(t *testing.T, objs map[string]object) {
			d := objs["apps/v1/Deployment/"+namespace+"/warmpool-data-plane"]
			if d == nil {
				t.Fatal("no Deployment warmpool-data-plane")
			}
			pod := dig(d, "spec", "template").(object)
			c := dig(pod, "spec", "containers", 0).(object)
			if r := dig(d, "spec", "replicas"); r != 3 {
				t.Errorf("replicas %v", r)
			}
			if c["image"] != "registry.example/warmpool/manager:v1.2.3" || dig(pod, "spec", "imagePullSecrets", 0, "name") != "pull" {
				t.Errorf("image %v, pull secrets %v: want the manager's", c["image"], dig(pod, "spec", "imagePullSecrets"))
			}
			if r := dig(c, "resources", "requests", "cpu"); r != "200m" {
				t.Errorf("resources %v", c["resources"])
			}
			var a []string
			for _, v := range c["args"].([]any) {
				a = append(a, v.(string))
			}
			want := []string{"--mode=data-plane", "--data-plane-port=9443", "--health-probe-bind-address=:8081",
				"--metrics-bind-address=0", "--zap-log-level=debug"}
			if d := cmp.Diff(want, a); d != "" {
				t.Errorf("args (-want +got):\n%s", d)
			}
			if dig(c, "env", 1, "name") != "GODEBUG" || dig(pod, "spec", "nodeSelector", "kubernetes.io/os") != "linux" {
				t.Errorf("env %v, nodeSelector %v", c["env"], dig(pod, "spec", "nodeSelector"))
			}
			if lab := dig(pod, "metadata", "labels").(object); lab["team"] != "platform" || lab["control-plane"] != "data-plane" {
				t.Errorf("pod labels %v", lab)
			}
			for _, p := range c["ports"].([]any) {
				if p.(object)["name"] == "metrics" {
					t.Error("a metrics port without metrics")
				}
			}
		},
	}, {
		name:   "RuntimeClass",
		values: "runtimeClass: {name: gvisor-kvm, handler: runsc-kvm}",
		check: func(t *testing.T, objs map[string]object) {
			rc := objs["node.k8s.io/v1/RuntimeClass//gvisor-kvm"]
			if rc == nil || rc["handler"] != "runsc-kvm" || len(ofKind(objs, "RuntimeClass")) != 1 {
				t.Errorf("RuntimeClasses %v", ofKind(objs, "RuntimeClass"))
			}
		},
	}, {
		name:   "no RuntimeClass",
		values: "runtimeClass: {create: false}",
		check: func(t *testing.T, objs map[string]object) {
			if rc := ofKind(objs, "RuntimeClass"); len(rc) != 0 {
				t.Errorf("RuntimeClasses %v", rc)
			}
		},
	}, {
		name:   "no CRDs",
		values: "crd: {enabled: false}",
		check: func(t *testing.T, objs map[string]object) {
			if n := len(ofKind(objs, "CustomResourceDefinition")); n != 0 {
				t.Errorf("%d CRDs", n)
			}
		},
	}, {
		name:   "CRDs kept",
		values: "crd: {keep: true}",
		check: func(t *testing.T, objs map[string]object) {
			crds := ofKind(objs, "CustomResourceDefinition")
			if len(crds) != len(ofKind(defaults, "CustomResourceDefinition")) {
				t.Errorf("%d CRDs", len(crds))
			}
			for _, c := range crds {
				ann := dig(c, "metadata", "annotations").(object)
				if ann["helm.sh/resource-policy"] != "keep" || ann["controller-gen.kubebuilder.io/version"] == nil {
					t.Errorf("%s: annotations %v", id(c), ann)
				}
			}
		},
	}, {
		name: "guard rails",
		values: `guardrails:
  enabled: true
  runtimeClassName: gvisor-kvm
  allowedImagePrefixes: ["registry.example/sandboxes/", "warmpool.dev/repl:"]
  maxCPU: 4
  maxMemory: 8Gi
  maxTimeout: 6h
  maxWorkspaceSize: 10Gi
  maxTmpSize: 2Gi
  maxProcesses: 1024
  allowEgress: true
  minMemoryReserve: 128Mi
  maxSessionIdleTimeout: 2h
  maxInterruptGracePeriod: 1m
  allowedPriorityClassNames: [sandbox-low, sandbox-high]
`,
		check: func(t *testing.T, objs map[string]object) {
			cm := objs["v1/ConfigMap/"+namespace+"/warmpool-guardrails"]
			want := object{"runtimeClassName": "gvisor-kvm", "allowedImagePrefixes": "registry.example/sandboxes/,warmpool.dev/repl:",
				"maxCPU": "4", "maxMemory": "8Gi", "allowEgress": "true", "maxTimeout": "6h", "maxWorkspaceSize": "10Gi",
				"maxTmpSize": "2Gi", "maxProcesses": "1024", "minMemoryReserve": "128Mi", "maxSessionIdleTimeout": "2h",
				"maxInterruptGracePeriod": "1m", "allowedPriorityClassNames": "sandbox-low,sandbox-high"}
			if d := cmp.Diff(want, cm["data"]); d != "" {
				t.Errorf("parameters (-want +got):\n%s", d)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, render(t, namespace, "-f", values(t, tc.values)))
		})
	}
}

// TestReleaseNamespace: every namespaced object, and every reference to one,
// is in the release's namespace.
func TestReleaseNamespace(t *testing.T) {
	const ns = "sandbox-platform"
	objs := render(t, ns, "--set", "guardrails.enabled=true,metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true")
	namespaced := 0
	for k, o := range objs {
		if dig(o, "metadata", "namespace") != nil {
			namespaced++
		}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case object:
				for key, x := range v {
					if key == "namespace" && x != ns {
						t.Errorf("%s: %s.namespace is %v", k, path, x)
					}
					walk(path+"."+key, x)
				}
			case []any:
				for _, x := range v {
					walk(path+"[]", x)
				}
			}
		}
		if o["kind"] != "CustomResourceDefinition" {
			walk("", o)
		}
	}
	if namespaced == 0 {
		t.Fatal("no namespaced objects")
	}
	if d := deployment(t, objs, ns); d == nil {
		t.Fatal("no Deployment")
	}
}
